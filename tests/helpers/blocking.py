"""Calls that may block on a special file (a FIFO planted in a store): each runs in a thread
joined with a timeout, so a regression that blocks fails its test instead of hanging the suite.
FIFOs made by :func:`mkfifo` are opened for writing (non-blocking) on a timeout, which releases a
thread stuck opening one for reading; :func:`release_fifos` also runs after each test that used
one (the ``unblock_fifos`` fixture of ``tests/conftest.py``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")
TIMEOUT = 20.0
_FIFOS: list[Path] = []


def mkfifo(p: Path) -> None:
    """Make a FIFO at ``p`` that a timed-out :func:`returns` releases."""
    os.mkfifo(p)
    _FIFOS.append(p)


def release_fifos() -> None:
    """Unblock any thread stuck opening one of our FIFOs for reading."""
    for p in _FIFOS:
        try:
            fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        os.close(fd)


def returns(fn: Callable[[], T], timeout: float = TIMEOUT) -> T:
    """Run ``fn`` in a thread; fail the test if it does not return within ``timeout``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        release_fifos()
        t.join(5)
        pytest.fail(f"call did not return within {timeout} s (blocked)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def forget_fifos() -> None:
    """Release the FIFOs made so far and stop tracking them (after each test that made some)."""
    release_fifos()
    _FIFOS.clear()
