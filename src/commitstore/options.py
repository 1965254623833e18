"""The enumerated options of the facade as ``Literal`` types, and the checks of option values
that integrations share with the facade.

The types are for type checkers; every call still checks its values at run time, before any
I/O, and raises :class:`~commitstore.errors.ConfigurationError` for a value outside them (a
caller without a type checker gets the same clear error).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from commitstore import _commit, _fetch
from commitstore.errors import ConfigurationError

__all__ = [
    "Level",
    "MirrorMode",
    "MirrorPolicy",
    "ReadLevel",
    "Source",
    "check_cache_dir",
    "check_commit_args",
    "check_flag",
]

Level = Literal["size", "full"]
"""How deep a check goes (``verify``, ``latest``): sizes only, or sizes and digests."""

ReadLevel = Literal["size", "full", "none"]
"""The ``verify=`` level of a read (``open``, ``read_bytes``, ``get_file``): ``"none"`` opts
out of the check."""

MirrorMode = Literal["background", "sync"]
"""``open_store(mirror_mode=...)``: replicate after each commit in the background, or before
the commit returns."""

MirrorPolicy = Literal["best_effort", "required"]
"""``open_store(mirror_policy=...)``: a mirror failure is logged and owed, or an error of the
commit (``MirrorError``)."""

Source = Literal["primary", "any"]
"""``latest(source=...)``: the primary only, or the newest artifact whole on any store."""


def check_flag(value: object, what: str) -> bool:
    """``value`` as a bool option named ``what``.

    Raises:
        ConfigurationError: anything but True or False, before any I/O.
    """
    return _commit.check_flag(value, what)


def check_callback(value: object, what: str) -> None:
    """``value`` as an optional callback option named ``what``.

    Raises:
        ConfigurationError: anything but None or a callable, before any I/O.
    """
    if value is not None and not callable(value):
        raise ConfigurationError(f"{what} must be None or a callable, not {value!r}")


def check_timeout(timeout: object) -> float | None:
    """``timeout`` as a wait bound in seconds: None (no bound) or a finite number >= 0.

    Raises:
        ConfigurationError: anything else (a negative number, NaN, infinity, a bool, a string),
            before any waiting.
    """
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise ConfigurationError(f"timeout must be None or a finite number >= 0, not {timeout!r}")
    return float(timeout)


def check_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """``cache_dir`` of :meth:`~commitstore.CommitStore.fetch` as a Path (None: the default,
    ``$COMMITSTORE_CACHE_DIR`` or ``~/.cache/commitstore/fetch``); creates nothing.

    Raises:
        ConfigurationError: not a str or path-like, or empty, before any I/O.
    """
    return _fetch.check_cache_dir(cache_dir)


def check_commit_args(name: str, step: object, metadata: Mapping[str, Any] | None) -> None:
    """Check what a new record of ``name`` would hold (the name, ``step`` and ``metadata``), as
    :meth:`~commitstore.CommitStore.stage` does, before any I/O.

    Raises:
        InvalidNameError: the name. ConfigurationError: ``step`` or ``metadata``.
    """
    _commit.check_new(name, step, metadata)
