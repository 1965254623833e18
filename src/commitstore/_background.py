"""Commits that run behind the caller: the engine of ``commitstore.torch.save_async``.

One :class:`BackgroundCommits` per store, made at its first asynchronous commit. Guarantees:

- **Order.** Jobs run one at a time on one worker thread, in submission order: a later commit
  of a name never lands before an earlier one.
- **Bounded memory.** At most ``inflight`` jobs (snapshots the caller handed over) exist at
  once; :meth:`BackgroundCommits.submit` waits for a slot before it takes another, so memory
  is bounded by the caller's choice (``open_store(..., async_inflight=N)``).
- **Nothing before it landed.** A job is the same versioned commit as a synchronous one: the
  name shows its new version only once data and record are published; ``list``/``latest``
  never show an in-flight commit; replication and automatic retention run only after the
  commit returned (the store's own after-commit step, on the worker thread).
- **Failures cannot go unnoticed.** A failed job's exception is set on its future and logged
  (name and target); until the caller has observed it (``result()``/``exception()``), the
  next :meth:`submit`, :meth:`flush` or :meth:`close` raises it.
- **Exit.** At interpreter exit, jobs still queued are finished within
  ``COMMITSTORE_EXIT_FLUSH_SECONDS`` (shared with the mirrors' exit flush), before
  ``concurrent.futures`` stops taking work; a warning names every commit that did not land.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from commitstore._exitflush import exit_deadline, register_exit_stages
from commitstore.errors import ConfigurationError
from commitstore.records import Record

__all__ = ["BackgroundCommits", "check_inflight"]

log = logging.getLogger("commitstore")

MAX_INFLIGHT = 64
"""The largest ``async_inflight`` accepted (each slot may hold a whole state's snapshot)."""


def check_inflight(value: object) -> int:
    """``async_inflight`` as an int in [1, MAX_INFLIGHT]; ConfigurationError (before any I/O)."""
    if type(value) is not int or not 1 <= value <= MAX_INFLIGHT:
        raise ConfigurationError(
            f"async_inflight must be an int from 1 to {MAX_INFLIGHT}, not {value!r}"
        )
    return value


class CommitFuture(concurrent.futures.Future[Record]):
    """A :class:`concurrent.futures.Future` of one asynchronous commit's :class:`Record`.

    ``observed`` turns True once the caller asked for the outcome (``result()`` or
    ``exception()``): a failure the caller saw is not raised again by the next call."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        """The artifact's name."""
        self.observed = False

    def result(self, timeout: float | None = None) -> Record:
        self.observed = True
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.observed = True
        return super().exception(timeout)


@dataclass
class _Job:
    future: CommitFuture
    run: Callable[[], Record]
    done: Callable[[], None]
    """Called once the job ended, whatever its outcome (releases its snapshot)."""


_live: weakref.WeakSet[BackgroundCommits] = weakref.WeakSet()


def _exit_flush_all(*, final: bool) -> None:
    """Interpreter exit: finish every store's queued commits within the exit bound (from
    ``_exitflush``, shared with the mirrors), then hand their copies to the mirrors'
    exit flush before ``concurrent.futures`` stops (hooks run last-registered first, and this
    one is registered after that module's)."""
    deadline = exit_deadline()
    for engine in list(_live):
        with contextlib.suppress(Exception):  # exit must go on
            engine.exit_flush(deadline, warn=final)


def _register_exit_hooks() -> None:
    register_exit_stages(_exit_flush_all)


class BackgroundCommits:
    """Runs commit jobs on one worker thread, in order, at most ``inflight`` at once.

    ``url`` names the target in log lines and warnings; ``after_exit`` (the store's mirrors'
    exit flush, given a deadline) runs at interpreter exit once the jobs are done."""

    def __init__(
        self,
        url: str,
        inflight: int,
        *,
        after_exit: Callable[[float], None] | None = None,
    ) -> None:
        self.url = url
        self.inflight = check_inflight(inflight)
        self._slots = threading.BoundedSemaphore(self.inflight)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._open: list[CommitFuture] = []
        """Submitted and not yet ended, in order."""
        self._failed: list[CommitFuture] = []
        """Ended in failure and not yet raised to the caller."""
        self._after_exit = after_exit
        self._closed = False
        self.high_water = 0
        """The most jobs that ever held a slot at once (never above ``inflight``)."""
        self._held = 0
        self._thread = threading.Thread(
            target=self._work, name=f"commitstore-async {url}", daemon=True
        )
        self._thread.start()
        _register_exit_hooks()
        _live.add(self)

    # -- the caller's side --------------------------------------------------------------------
    def acquire(self, timeout: float | None = None) -> Callable[[], None]:
        """Wait for a free slot (raising an earlier unobserved failure first); returns the
        function that releases it, to be called exactly once. Call before taking a snapshot,
        so at most ``inflight`` snapshots exist at once."""
        self.raise_failed()
        if self._closed:
            raise ConfigurationError(f"{self.url}: the store was closed; no new commits")
        if not self._slots.acquire(timeout=timeout):
            raise TimeoutError(f"{self.url}: no free asynchronous commit slot")
        with self._lock:
            self._held += 1
            self.high_water = max(self.high_water, self._held)
        released: list[bool] = []

        def release() -> None:
            if released:
                return
            released.append(True)
            with self._lock:
                self._held -= 1
            self._slots.release()

        return release

    def submit(
        self, name: str, run: Callable[[], Record], release: Callable[[], None]
    ) -> CommitFuture:
        """Queue ``run`` (the commit of ``name``, holding the slot ``release`` frees); returns
        its future at once."""
        future = CommitFuture(name)
        future.set_running_or_notify_cancel()
        with self._lock:
            self._open.append(future)
        self._jobs.put(_Job(future, run, release))
        return future

    def raise_failed(self) -> None:
        """Raise the oldest failure the caller has not observed (then it counts as observed)."""
        with self._lock:
            while self._failed:
                fut = self._failed.pop(0)
                if fut.observed:
                    continue
                fut.observed = True
                exc = fut.exception()
                assert exc is not None
                raise exc

    def pending(self) -> list[str]:
        """Names of the commits submitted and not yet ended, in order."""
        with self._lock:
            return [f.name for f in self._open]

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every submitted commit ended, then raise an unobserved failure.

        Raises:
            TimeoutError: ``timeout`` seconds passed first (nothing is cancelled).
        """
        end = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._open:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self.url}: asynchronous commits still running")
                self._idle.wait(left)
        self.raise_failed()

    def close(self) -> None:
        """Flush, then stop the worker. Idempotent; raises as :meth:`flush`."""
        if not self._closed:
            self._closed = True
            _live.discard(self)
            try:
                self.flush()
            finally:
                self._jobs.put(None)
                self._thread.join()
        else:
            self.raise_failed()

    def exit_flush(self, deadline: float, *, warn: bool) -> None:
        """At interpreter exit: wait until the monotonic ``deadline`` for queued commits, hand
        over to the mirrors' exit flush, then (``warn``) warn about every commit that did not
        land. Never raises."""
        with contextlib.suppress(TimeoutError, Exception):
            self.flush(max(0.0, deadline - time.monotonic()))
        if self._after_exit is not None:
            with contextlib.suppress(Exception):
                self._after_exit(deadline)
        if not warn:
            return
        with self._lock:
            lost = [f.name for f in self._open]
            failed = [f.name for f in self._failed if not f.observed]
        said = [f"{n} (still writing)" for n in lost] + [f"{n} (failed)" for n in failed]
        if said:
            msg = (
                f"{self.url}: asynchronous commits that did not land before exit (bounded by "
                "COMMITSTORE_EXIT_FLUSH_SECONDS; call flush() or close() before exit): "
                + ", ".join(said)
            )
            log.warning("%s", msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=1)

    # -- the worker ---------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, run, done = job.future, job.run, job.done
            del job  # the snapshot lives in ``run`` only: freed before its slot is released
            outcome: Record | BaseException
            try:
                outcome = run()
            except BaseException as exc:  # the caller gets whatever it was
                traceback.clear_frames(exc.__traceback__)  # frames would keep the snapshot
                outcome = exc
            del run
            done()
            if isinstance(outcome, BaseException):
                log.error(
                    "%s: asynchronous commit of %s failed: %s: %s",
                    self.url,
                    future.name,
                    type(outcome).__name__,
                    outcome,
                )
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
            with self._idle:
                self._open.remove(future)
                if isinstance(outcome, BaseException):
                    self._failed.append(future)
                self._idle.notify_all()
            del future, outcome
