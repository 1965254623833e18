"""The exit flush: at interpreter exit, whatever was never closed (mirrors' background copies,
asynchronous commits) gets one shared bound, ``COMMITSTORE_EXIT_FLUSH_SECONDS`` from the first
exit hook that runs, to finish its work, in two stages (before ``concurrent.futures`` stops
taking work, then among ``atexit``'s hooks).

Used by ``mirrors.replicator`` (each replicator never closed waits here) and by ``_background``
(asynchronous commits, which hand their copies to the mirrors' flush)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("commitstore")

EXIT_FLUSH_SECONDS = 60.0
"""Default of ``COMMITSTORE_EXIT_FLUSH_SECONDS``: how long interpreter exit waits for background
replication of a store that was never closed."""


def seconds_from_env(var: str, default: float) -> float:
    """The number of seconds the environment variable ``var`` gives (at least 0); ``default``
    where it is unset, or (with a warning) not a number."""
    raw = os.environ.get(var)
    if raw is None:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        log.warning("%s=%r is not a number; using %g", var, raw, default)
        return default


def exit_flush_seconds() -> float:
    """The exit flush's bound: ``COMMITSTORE_EXIT_FLUSH_SECONDS``, default 60."""
    return seconds_from_env("COMMITSTORE_EXIT_FLUSH_SECONDS", EXIT_FLUSH_SECONDS)


class Flushed(Protocol):
    """What the exit flush waits for (a replicator never closed)."""

    def exit_flush(self, deadline: float, *, warn: bool = True) -> None:
        """Wait until the monotonic time ``deadline``; then (``warn``) warn about what is left.
        Never raises."""


_waiting: weakref.WeakKeyDictionary[Flushed, bool] = weakref.WeakKeyDictionary()
"""What the exit flush waits for (weakly held: one collected is forgotten)."""

_exit_deadline: list[float] = []
"""The monotonic time the exit flush ends, then the time it began (set by its first stage,
shared by both)."""

_registered: list[Callable[..., None]] = []


def wait_at_exit(item: Flushed) -> None:
    """Make the exit flush wait for ``item`` (until :func:`forget`), registering its hooks."""
    _waiting[item] = True
    register_exit_stages(_exit_flush_all)


def forget(item: Flushed) -> None:
    """The exit flush no longer waits for ``item`` (it was closed)."""
    _waiting.pop(item, None)


def waiting() -> list[Flushed]:
    """What the exit flush waits for now (registered, not forgotten, not collected)."""
    return list(_waiting.keys())


def _exit_flush_all(*, final: bool) -> None:
    """Interpreter exit: wait for every item never closed, all within one bound
    (``COMMITSTORE_EXIT_FLUSH_SECONDS`` from the first stage on).

    Two stages: the first runs among ``threading``'s exit hooks, before non-daemon threads are
    joined and, above all, before ``concurrent.futures`` stops taking work (after that, every
    executor a copy goes through, the event loop's own included, refuses with "cannot schedule
    new futures after interpreter shutdown", so a copy made later fails at once); it waits
    quietly. The second runs among ``atexit``'s hooks, for copies submitted after the first (a
    non-daemon thread still committing), with what is left of the bound, and warns about every
    artifact that did not reach its mirror."""
    deadline = exit_deadline()
    for item in waiting():
        with contextlib.suppress(Exception):  # exit must go on
            item.exit_flush(deadline, warn=final)


def exit_deadline() -> float:
    """The monotonic time the process's exit flush ends: set by the first caller (the first
    exit hook that runs, of mirrors or of asynchronous commits), ``COMMITSTORE_EXIT_FLUSH_SECONDS``
    from then; one bound for all of them."""
    if not _exit_deadline:
        _exit_deadline.append(time.monotonic() + exit_flush_seconds())
        _exit_deadline.append(time.monotonic())  # when the exit flush began (its warning says)
    return _exit_deadline[0]


def exit_started() -> float:
    """The monotonic time the exit flush began (now, if it has not)."""
    return _exit_deadline[1] if len(_exit_deadline) > 1 else time.monotonic()


def register_exit_stages(flush: Callable[..., None]) -> None:
    """Register ``flush`` for both stages of the exit flush, once per process per function:
    ``flush(final=False)`` among ``threading``'s exit hooks (``threading._register_atexit`` is
    CPython's hook for exactly this: it is how ``concurrent.futures`` stops its workers, and hooks
    run last-registered first, so one registered after that module is imported runs before it),
    then ``flush(final=True)`` among ``atexit``'s. Used by the mirrors' exit flush and by
    asynchronous commits (``_background``)."""
    if flush in _registered:
        return
    _registered.append(flush)
    import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered before ours

    early = getattr(threading, "_register_atexit", None)
    if early is not None:
        with contextlib.suppress(RuntimeError):  # already shutting down: atexit alone
            early(flush, final=False)
    atexit.register(flush, final=True)
