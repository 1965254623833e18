"""Locks a forked child never keeps: the descriptors that hold a local store's ``flock`` locks.

An ``flock`` belongs to the open file description, not to the process: a child forked while a
thread of its parent holds one (the publish lock inside a commit, a writer's liveness lock on
its staging entry; ``multiprocessing`` and DataLoader workers with the ``fork`` start method)
shares that description, so the lock would stay taken for the child's whole life after the
parent let go of it (the parent's own next commit waiting ``lock_timeout``), and would survive a
parent killed meanwhile (gc keeping a dead writer's staging as held by a live writer).

Every descriptor that holds (or is about to hold) such a lock is tracked here from its open to
its close, and in a child made by ``os.fork()`` (``os.register_at_fork``) each tracked
descriptor is made to point at ``/dev/null`` (``dup2``): the child's reference to the locked
open file description is dropped at once, so the lock is the parent's alone, and the
descriptor number stays valid, so a close of it by a stale object in the child closes nothing
that matters. The child never unlocks anything (an unlock would release the parent's lock).
Between the fork and the child's handler (a child stopped or not yet scheduled) the child still
shares the description, so the parent unlocks explicitly before it closes (:func:`close`):
its lock is free once it lets go, whatever state its children are in.

Thread safety: the registry is guarded by one lock, and a fork waits for it (taken before the
fork, released after it in both processes), so no fork falls between a lock file's open and its
tracking, nor between an untrack and the close that frees the number for another open. The
guard is held only for those few calls (never while a lock is waited for, never around another
lock), so a fork waits at most for the calls opening or closing one lock's descriptor. A fork
that bypasses Python's handlers (C code calling ``fork()`` directly) runs no handler: only the
parent's explicit unlock covers it; ``subprocess`` children exec at once and inherit none of
these descriptors (all ``O_CLOEXEC``). A writer killed between a fork and its child's handler
keeps its lock until that child runs (or ends).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
from collections.abc import Iterator

log = logging.getLogger("commitstore")

_GUARD = threading.RLock()
"""Guards :data:`_TRACKED`; held across every ``os.fork()`` of the process. Reentrant, so a
signal handler that forks while its thread is inside a guarded block does not deadlock."""
_TRACKED: set[int] = set()
"""The descriptors that hold (or are about to hold) an ``flock`` of this process."""


@contextlib.contextmanager
def no_fork() -> Iterator[None]:
    """No ``os.fork()`` of this process happens while the block runs (a fork waits for its
    end): open a lock's descriptor and :func:`track` it inside. Keep the block to a few calls
    (never a lock's wait)."""
    with _GUARD:
        yield


def track(fd: int) -> int:
    """Track ``fd`` (a child forked from here on does not keep its lock); return it. Call it
    inside :func:`no_fork` with the open, or before the lock for a descriptor opened earlier."""
    with _GUARD:
        _TRACKED.add(fd)
    return fd


def untrack(fd: int) -> None:
    """Stop tracking ``fd`` (its lock released; the caller closes it later). Never fails."""
    with _GUARD:
        _TRACKED.discard(fd)


def close(fd: int) -> None:
    """Unlock ``fd`` explicitly, untrack it and close it, with no fork in between. The explicit
    unlock frees the lock even if a child forked a moment ago still shares the descriptor (it
    has not run its fork handler yet: stopped, or not yet scheduled). As ``close_quietly``: a
    close error is logged (outside the guard: no other lock is ever taken under it), never
    raised, except EBADF (a descriptor that was not open: a bug)."""
    with _GUARD:
        _TRACKED.discard(fd)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        try:
            os.close(fd)
            return
        except OSError as exc:
            failed = exc
    if failed.errno == errno.EBADF:
        raise failed
    log.debug("closing lock descriptor %d: %s (ignored: nothing unflushed)", fd, failed)


def tracked() -> frozenset[int]:
    """The descriptors tracked now (for tests)."""
    with _GUARD:
        return frozenset(_TRACKED)


def _detach_in_child() -> None:
    """In a forked child: every tracked descriptor now points at ``/dev/null`` (or, without
    one, at an empty pipe), dropping the child's reference to the locked open file description
    without unlocking it; then the guard the fork took is released."""
    try:
        if _TRACKED:
            try:
                null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                null, w = os.pipe()
                os.close(w)
            for fd in _TRACKED:
                with contextlib.suppress(OSError):
                    os.dup2(null, fd, inheritable=False)
            os.close(null)
    finally:
        _GUARD.release()


os.register_at_fork(
    before=_GUARD.acquire, after_in_parent=_GUARD.release, after_in_child=_detach_in_child
)
