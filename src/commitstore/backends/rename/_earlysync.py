"""A buffered staging file's ``fsync`` started early, in a worker thread, when its writer
commits (``LocalBackend.prepare``): it runs while the commit writes and syncs its pending record,
and the data's rename waits for it (``LocalBackend.finish``), so the ordering is the one of an
``fsync`` in the caller: the data is durable before its rename is issued. The pending record's
own file ``fsync`` runs here too, beside its folder's in the caller (``LocalBackend.put_pending``),
and is waited for before that returns. Syncs in flight at once let the filesystem make them
durable in one journal commit where it can.

The workers are shared by the process (at most :data:`WORKERS` syncs in flight; more wait their
turn) and made anew in a forked child (a pool's threads do not survive a fork).
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

WORKERS = 4
THREAD_PREFIX = "commitstore-sync"


class _Workers:
    """The process's pool, made on first use and anew after a fork."""

    lock = threading.Lock()
    pool: ThreadPoolExecutor | None = None
    pid = 0

    @classmethod
    def get(cls) -> ThreadPoolExecutor:
        with cls.lock:
            if cls.pool is None or cls.pid != os.getpid():
                cls.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=THREAD_PREFIX)
                cls.pid = os.getpid()
            return cls.pool


def _sync(fd: int) -> None:
    os.fsync(fd)


def start_fsync(fd: int) -> Future[None]:
    """``fsync(fd)`` queued in a worker; the future raises its ``OSError``. The caller keeps
    ``fd`` open until the future is done (:func:`wait_quietly` before closing). Once the
    interpreter is shutting down the pool takes no new work (a commit from a thread still
    running then): the ``fsync`` is made here, before this returns, and the future is done."""
    try:
        return _Workers.get().submit(_sync, fd)
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        done: Future[None] = Future()
        try:
            os.fsync(fd)
        except OSError as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)
        return done


def wait_quietly(sync: Future[None]) -> None:
    """Wait for ``sync`` to be done, whatever it met (before its fd is closed: an fd closed
    while a worker syncs it could be reused for another file meanwhile)."""
    with contextlib.suppress(BaseException):
        sync.result()
