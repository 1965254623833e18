"""An exclusive ``flock`` taken within a deadline: a holder that is stopped (SIGSTOP, a debugger
paused on it) or hung keeps its lock until it dies, so a waiter gives up after ``timeout``
seconds with a typed error instead of blocking forever.

Uncontended, the lock costs what a blocking ``flock`` costs (one non-blocking call). Contended,
the waiter retries with a back-off from 1 ms up to 20 ms, so a publish that frees the lock a
moment later is joined within that; no order among waiters is promised (``flock`` promises none
either).
"""

from __future__ import annotations

import fcntl
import time

from commitstore.errors import BackendUnavailableError

LOCK_TIMEOUT = 600.0
"""How long a writer, gc or a reader waiting out a publish waits for a store's publish lock
before it raises (seconds; the ``lock_timeout`` storage option of local stores). Publishes
hold it for milliseconds; a large folder's replace for as long as its renames take."""

_FIRST_WAIT = 0.001
_LONGEST_WAIT = 0.02


def flock_within(fd: int, timeout: float, shown: str) -> None:
    """Take an exclusive ``flock`` on ``fd`` within ``timeout`` seconds.

    Raises:
        BackendUnavailableError: the lock stayed taken for ``timeout`` seconds (another process
            holds it: a stopped or hung one keeps it until it dies); nothing was done under it.
        OSError: the lock call failed otherwise (the caller translates it).
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    deadline = time.monotonic() + timeout
    wait = _FIRST_WAIT
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BackendUnavailableError(
                f"{shown}: the store's publish lock was not free within {timeout:g} s: another "
                "process holds it (a stopped or hung process keeps it until it ends; find it "
                "with `fuser` or `lsof` on that file); nothing was changed"
            )
        time.sleep(min(wait, left))
        wait = min(wait * 2, _LONGEST_WAIT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            continue
