"""Snapshots for asynchronous saves (``commitstore.torch.save_async``; imports torch).

:func:`snapshot` returns a copy of an object that shares no tensor memory with it, so a caller
that changes its tensors in place (the next optimizer step) after the call returned does not
change what is committed. It is ``copy.deepcopy`` with two changes, for tensors found in dicts,
lists and tuples:

- a tensor that owns its whole storage (not a view into a larger one) is copied into a buffer
  of a :class:`Buffers` set reused from an earlier save of the same shapes: a copy into memory
  that is already mapped, not a fresh allocation the kernel must first fault in and zero;
- a tensor on an accelerator (CUDA and the like) is copied to host memory (pinned where the
  accelerator is available), not cloned on the device.

Tensors that share a storage (views) are left to ``copy.deepcopy`` and keep sharing their copied
storage, as ``torch.save`` would have saved them. A buffer set is handed to one snapshot at a time
(:class:`BufferPool`): at most ``async_inflight`` sets exist per store, each the size of one
state, kept for reuse until the store is garbage collected.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["BufferPool", "Buffers", "snapshot"]

_MAX_DEPTH = 1000


class Buffers:
    """One snapshot's reusable tensors, by their position in the walk of the object."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []


class BufferPool:
    """Free :class:`Buffers` sets of one store; :meth:`take` one for a snapshot, :meth:`give`
    it back once the commit that wrote it ended."""

    def __init__(self) -> None:
        self._free: list[Buffers] = []
        self._lock = threading.Lock()

    def take(self) -> Buffers:
        with self._lock:
            return self._free.pop() if self._free else Buffers()

    def give(self, buffers: Buffers) -> None:
        with self._lock:
            self._free.append(buffers)


def _whole(t: torch.Tensor) -> bool:
    """True when ``t`` is a plain dense tensor (not a Parameter or other subclass) that owns its
    whole storage (not a view)."""
    if type(t) is not torch.Tensor or t.layout != torch.strided or not t.is_contiguous():
        return False
    if t.storage_offset() != 0:
        return False
    return bool(t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _buffer_for(t: torch.Tensor, buffers: Buffers, index: int) -> torch.Tensor:
    if index < len(buffers.tensors):
        buf = buffers.tensors[index]
        if buf.shape == t.shape and buf.dtype == t.dtype:
            return buf
    pin = t.device.type == "cuda"
    buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
    if index < len(buffers.tensors):
        buffers.tensors[index] = buf
    else:
        buffers.tensors.append(buf)
    return buf


class _Walk:
    def __init__(self, buffers: Buffers | None) -> None:
        self.buffers = buffers
        self.memo: dict[int, Any] = {}
        self.index = 0
        self.found: dict[int, torch.Tensor] = {}
        """The tensors met, by id, in walk order."""

    def visit(self, obj: object, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            return
        if isinstance(obj, torch.Tensor):
            self.found.setdefault(id(obj), obj)
        elif isinstance(obj, Mapping):
            for value in obj.values():
                self.visit(value, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                self.visit(value, depth + 1)

    def copy_tensors(self) -> None:
        """Buffers for the whole tensors whose storage no other tensor met shares; host copies
        for accelerator tensors; the rest (views, shared storages) is left to deepcopy."""
        sharing: dict[tuple[str, int], int] = {}
        for t in self.found.values():
            if t.device.type != "meta":
                key = (str(t.device), t.untyped_storage().data_ptr())
                sharing[key] = sharing.get(key, 0) + 1
        for ident, t in self.found.items():
            if t.device.type == "meta":
                continue
            alone = sharing[(str(t.device), t.untyped_storage().data_ptr())] == 1
            if self.buffers is not None and alone and _whole(t):
                buf = _buffer_for(t, self.buffers, self.index)
                self.index += 1
                buf.copy_(t.detach())
                self.memo[ident] = buf
            elif t.device.type != "cpu":
                self.memo[ident] = t.detach().to("cpu", copy=True)


def snapshot(obj: object, buffers: Buffers | None = None) -> object:
    """A copy of ``obj`` that shares no tensor memory with it (module docstring), reusing
    ``buffers`` (filled or replaced as the shapes require) where given.

    An object ``copy.deepcopy`` cannot copy raises what ``copy.deepcopy`` raises.
    """
    walk = _Walk(buffers)
    walk.visit(obj)
    walk.copy_tensors()
    if buffers is not None:
        del buffers.tensors[walk.index :]  # shapes that are gone free their memory
    return copy.deepcopy(obj, walk.memo)
