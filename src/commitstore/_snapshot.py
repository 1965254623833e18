"""Snapshots for asynchronous saves (``commitstore.torch.save_async``; imports torch).

:func:`snapshot` returns a copy of an object that shares no tensor memory with it, so a caller
that changes its tensors in place (the next optimizer step) after the call returned does not
change what is committed. It is ``copy.deepcopy`` with one change: tensors on an accelerator
(CUDA and the like) found in dicts, lists and tuples are copied to host memory (CPU) rather
than cloned on the device. Views that shared a storage keep sharing their copied storage, as
``torch.save`` would have saved them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["snapshot"]

_MAX_DEPTH = 1000


def _to_host(obj: object, memo: dict[int, Any], depth: int = 0) -> None:
    """Put a host copy of every accelerator tensor found in containers into ``memo``."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(obj, torch.Tensor):
        if obj.device.type not in ("cpu", "meta") and id(obj) not in memo:
            memo[id(obj)] = obj.detach().to("cpu", copy=True)
        return
    if isinstance(obj, Mapping):
        for value in obj.values():
            _to_host(value, memo, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _to_host(value, memo, depth + 1)


def snapshot(obj: object) -> object:
    """A copy of ``obj`` that shares no tensor memory with it (module docstring).

    Raises:
        whatever ``copy.deepcopy`` raises for an object that cannot be copied.
    """
    memo: dict[int, Any] = {}
    _to_host(obj, memo)
    return copy.deepcopy(obj, memo)
