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
- **Close.** :meth:`BackgroundCommits.close` waits for a commit whose snapshot is being taken
  on another thread when it is called (it is queued and lands); a commit asked for after it
  raises ConfigurationError. ``flush``/``close`` on the worker thread itself (a future's
  done-callback) raise ConfigurationError instead of waiting for themselves; a future leaves
  the in-flight list before its callbacks run.
- **Fork.** A child process made by ``fork()`` starts with no commit of its own in flight: the
  parent's stay the parent's (their futures resolve there), the child's ``flush``/``close``
  do not wait for them, and its own commits run on a worker thread of its own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
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


class _Slot:
    """One slot of an engine, taken by :meth:`BackgroundCommits.acquire`: calling it releases
    the slot (once; later calls do nothing). Until its job is queued it counts as a snapshot
    being taken, which ``flush``/``close`` wait for."""

    def __init__(self, engine: BackgroundCommits, slots: threading.BoundedSemaphore) -> None:
        self.engine = engine
        self.slots = slots
        self.queued = False
        self.released = False

    def __call__(self) -> None:
        if self.released:
            return
        self.released = True
        engine = self.engine
        with engine._lock:
            if self.slots is engine._slots:  # not a slot of the parent's, after a fork
                engine._held -= 1
                if not self.queued:
                    engine._preparing -= 1
                    engine._idle.notify_all()
        self.slots.release()


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


def _after_fork_in_child() -> None:
    for engine in list(_live):
        engine._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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
        self._preparing = 0
        """Slots taken whose job is not queued yet (a snapshot being taken)."""
        self._thread: threading.Thread | None = None
        self._start_worker()
        _register_exit_hooks()
        _live.add(self)

    def _start_worker(self) -> None:
        self._thread = threading.Thread(
            target=self._work, name=f"commitstore-async {self.url}", daemon=True
        )
        self._thread.start()

    def _after_fork_in_child(self) -> None:
        """In a child made by ``fork()``: no job of the parent's is this process's; fresh
        locks (one may have been held by a thread the child does not have), free slots, and a
        worker thread made at the child's first commit."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._slots = threading.BoundedSemaphore(self.inflight)
        self._jobs = queue.SimpleQueue()
        self._open = []
        self._failed = []
        self._held = self._preparing = 0
        self._thread = None

    def _not_on_worker(self, what: str) -> None:
        if threading.current_thread() is self._thread:
            raise ConfigurationError(
                f"{self.url}: {what} was called on the store's asynchronous commit thread "
                "(from a future's callback?): it would wait for that thread itself; call it "
                "from another thread"
            )

    # -- the caller's side --------------------------------------------------------------------
    def acquire(self, timeout: float | None = None) -> Callable[[], None]:
        """Wait for a free slot (raising an earlier unobserved failure first); returns the
        function that releases it, to be called exactly once. Call before taking a snapshot,
        so at most ``inflight`` snapshots exist at once."""
        self.raise_failed()
        self._check_open()
        if not self._slots.acquire(timeout=timeout):
            raise TimeoutError(f"{self.url}: no free asynchronous commit slot")
        with self._lock:
            if self._closed:  # closed while this waited for the slot
                self._slots.release()
                self._check_open()
            self._held += 1
            self._preparing += 1
            self.high_water = max(self.high_water, self._held)
        return _Slot(self, self._slots)

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError(f"{self.url}: the store was closed; no new commits")

    def submit(
        self, name: str, run: Callable[[], Record], release: Callable[[], None]
    ) -> CommitFuture:
        """Queue ``run`` (the commit of ``name``, holding the slot ``release`` frees); returns
        its future at once."""
        future = CommitFuture(name)
        future.set_running_or_notify_cancel()
        with self._idle:
            if isinstance(release, _Slot) and release.engine is self:
                release.queued = True
                self._preparing -= 1
            if self._thread is None or not self._thread.is_alive():
                self._start_worker()  # the first commit of a forked child
            self._open.append(future)
            self._jobs.put(_Job(future, run, release))
            self._idle.notify_all()
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
        self._not_on_worker("flush()")
        end = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._open or self._preparing:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self.url}: asynchronous commits still running")
                self._idle.wait(left)
        self.raise_failed()

    def close(self) -> None:
        """Flush (a commit whose snapshot is being taken included), then stop the worker; a
        later commit raises ConfigurationError. Idempotent; raises as :meth:`flush`."""
        self._not_on_worker("close()")
        with self._lock:
            first, self._closed = not self._closed, True
        if not first:  # another close() stops the worker: wait for what it waits for
            self.flush()
            return
        _live.discard(self)
        try:
            self.flush()
        finally:
            self._jobs.put(None)
            if self._thread is not None:
                self._thread.join()

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
            failed = isinstance(outcome, BaseException)
            if failed:
                log.error(
                    "%s: asynchronous commit of %s failed: %s: %s",
                    self.url,
                    future.name,
                    type(outcome).__name__,
                    outcome,
                )
            with self._idle:  # ended before its callbacks run (they may flush)
                self._open.remove(future)
                if failed:
                    self._failed.append(future)
                self._idle.notify_all()
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
            del future, outcome
