"""Mirrors: replicate each primary commit to every mirror, in the background or before commit
returns, with bounded queues (back-pressure), retries, status, and required/best-effort policies."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field

from commitstore._check import list_records
from commitstore._commit import Committer
from commitstore.errors import CommitStoreError, ConfigurationError, MirrorError
from commitstore.mirrors.copy import copy_artifact

log = logging.getLogger("commitstore")

MODES = ("background", "sync")
POLICIES = ("best_effort", "required")
RETRIES = 3
"""Attempts per artifact and mirror before it is marked failed (sync() repairs it later); only
errors that say they are ``retryable`` are tried again."""


def check_mirror_options(mode: str, policy: str, queue_size: int) -> None:
    """Raise ConfigurationError for a bad mirror mode, policy or queue size, before any I/O."""
    if mode not in MODES:
        raise ConfigurationError(f"mirror_mode must be one of {MODES}, not {mode!r}")
    if policy not in POLICIES:
        raise ConfigurationError(f"mirror_policy must be one of {POLICIES}, not {policy!r}")
    if not isinstance(queue_size, int) or queue_size < 1:
        raise ConfigurationError(f"mirror_queue must be an integer >= 1, not {queue_size!r}")


@dataclass(frozen=True, slots=True)
class MirrorState:
    """What one mirror is owed."""

    url: str
    """The mirror's URL (no credentials)."""
    pending: tuple[str, ...]
    """Artifacts queued or being copied."""
    failed: dict[str, str]
    """Artifacts whose replication failed, with the last error; ``sync()`` repairs them."""
    last_error: str | None
    """The most recent replication error on this mirror, if any."""
    missing: tuple[str, ...]
    """Artifacts committed on the primary that the mirror does not hold (as of this call)."""


@dataclass
class _Worker:
    mirror: Committer
    jobs: queue.Queue[str | None]
    pending: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    last_error: str | None = None
    unreported: list[Exception] = field(default_factory=list)
    thread: threading.Thread | None = None


class Replicator:
    """Owns the mirrors of one primary store."""

    def __init__(
        self,
        primary: Committer,
        mirrors: list[Committer],
        *,
        mode: str,
        policy: str,
        queue_size: int,
    ) -> None:
        check_mirror_options(mode, policy, queue_size)
        self.primary = primary
        self.mode = mode
        self.policy = policy
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.workers = [_Worker(m, queue.Queue(maxsize=queue_size)) for m in mirrors]
        if mode == "background":
            for w in self.workers:
                w.thread = threading.Thread(
                    target=self._run,
                    args=(w,),
                    name=f"commitstore-mirror-{w.mirror.url}",
                    daemon=True,
                )
                w.thread.start()

    # -- replication ------------------------------------------------------------------------
    def _copy(self, w: _Worker, name: str) -> None:
        """Copy with bounded retries; record the outcome in the worker's state."""
        delay = 0.2
        for attempt in range(RETRIES):
            try:
                copy_artifact(self.primary, w.mirror, name)
            except Exception as exc:  # any failure is this artifact's, never the thread's
                retryable = isinstance(exc, CommitStoreError) and exc.retryable
                if attempt + 1 < RETRIES and retryable:
                    time.sleep(delay)
                    delay *= 2
                    continue
                with self._lock:
                    w.failed[name] = str(exc)
                    w.last_error = str(exc)
                    w.unreported.append(exc)
                log.warning("mirror %s: %s not replicated: %s", w.mirror.url, name, exc)
                return
            with self._lock:
                w.failed.pop(name, None)
            return

    def _run(self, w: _Worker) -> None:
        # Replication is background work: yield the CPU to the training thread.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while True:
            name = w.jobs.get()
            if name is None:
                w.jobs.task_done()
                return
            try:
                self._copy(w, name)
            finally:
                with self._lock:
                    w.pending.remove(name)
                    self._idle.notify_all()
                w.jobs.task_done()

    def _raise_unreported(self) -> None:
        with self._lock:
            errors = [e for w in self.workers for e in w.unreported]
            for w in self.workers:
                w.unreported.clear()
        if errors and self.policy == "required":
            raise MirrorError("replication to a required mirror failed", errors)

    def submit(self, name: str) -> None:
        """Replicate a just-committed artifact. Background: enqueue (waits while a mirror's
        queue is full). Sync: copy now. Under ``required``, failures raise MirrorError here
        (background: failures of earlier artifacts, at the next commit or flush)."""
        if self.mode == "sync":
            for w in self.workers:
                self._copy(w, name)
            self._raise_unreported()
            return
        self._raise_unreported()
        for w in self.workers:
            with self._lock:
                w.pending.append(name)
            w.jobs.put(name)  # blocks when full: back-pressure, never unbounded buffering

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued artifact was replicated or failed; raise MirrorError under
        ``required`` if any failed. Raises TimeoutError if ``timeout`` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while any(w.pending for w in self.workers):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("mirror replication still pending")
                self._idle.wait(left)
        self._raise_unreported()

    def close(self) -> None:
        """Flush, then stop the workers. Idempotent."""
        try:
            self.flush()
        finally:
            for w in self.workers:
                if w.thread is not None and w.thread.is_alive():
                    w.jobs.put(None)
                    w.thread.join()

    def pending(self) -> dict[str, set[str]]:
        """Per mirror URL: the artifacts queued or being copied there (prune keeps them)."""
        with self._lock:
            return {w.mirror.url: set(w.pending) for w in self.workers}

    def status(self) -> list[MirrorState]:
        """Per mirror: what is pending, what failed, and what it lacks as of this call."""
        primary = {r.name for r in list_records(self.primary.backend)}
        out = []
        for w in self.workers:
            held = {r.name for r in list_records(w.mirror.backend)}
            with self._lock:
                pending, failed, last = tuple(w.pending), dict(w.failed), w.last_error
            out.append(
                MirrorState(
                    url=w.mirror.url,
                    pending=pending,
                    failed=failed,
                    last_error=last,
                    missing=tuple(sorted(primary - held - set(pending))),
                )
            )
        return out
