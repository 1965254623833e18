"""Mirrors: replicate each primary commit to every mirror, in the background or before commit
returns, with bounded queues (back-pressure), retries, status, and required/best-effort policies."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field

from commitstore import _exitflush
from commitstore._commit import Committer
from commitstore._exitflush import seconds_from_env
from commitstore._scan import list_records
from commitstore.errors import (
    BackendUnavailableError,
    CommitError,
    ConfigurationError,
    MirrorError,
    MirrorStopped,
    NotFoundError,
)
from commitstore.mirrors import journal
from commitstore.mirrors.copy import copy_with_retries
from commitstore.mirrors.status import owed as owed_by_records
from commitstore.mirrors.status import probe

log = logging.getLogger("commitstore")

MODES = ("background", "sync")
POLICIES = ("best_effort", "required")


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
    """Artifacts committed on the primary that the mirror does not hold (as of this call;
    empty when the mirror could not be listed)."""
    reachable: bool = True
    """The mirror's records could be listed during this call (else ``last_error`` says why)."""
    owed: int = 0
    """Copies the mirror is owed: pending, failed and missing artifacts, each counted once."""
    owed_bytes: int = 0
    """Bytes of the owed copies (by the primary's records)."""
    oldest_owed_age: float | None = None
    """Seconds since the oldest owed artifact was committed on the primary (None: none owed)."""


@dataclass
class _Worker:
    mirror: Committer
    jobs: queue.Queue[str | None]
    pending: list[str] = field(default_factory=list)
    """Queued, being copied, or handed off (``handed``): what ``flush`` waits for."""
    handed: dict[str, None] = field(default_factory=dict)
    """Copies the queue could not take within the hand-off: the worker takes them (oldest
    first) whenever its queue is empty."""
    since: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Per owed name: when it was first submitted (monotonic) and its size (0 if unknown)."""
    reachable: bool | None = None
    stalled: bool = False
    """A hand-off was warned about and the mirror has not taken a copy since."""
    failed: dict[str, str] = field(default_factory=dict)
    last_error: str | None = None
    unreported: list[Exception] = field(default_factory=list)
    thread: threading.Thread | None = None
    died: str | None = None
    """Why the worker thread ended without being stopped (None while it runs)."""
    journaled: dict[str, int] = field(default_factory=dict)
    """Names with an entry in the owed journal on the primary, each with the generation of its
    last write (a copy that started before a newer write never removes the entry)."""
    jlock: threading.Lock = field(default_factory=threading.Lock)
    """Held while the journal of this mirror is written or an entry removed."""

    def dead(self) -> bool:
        return self.thread is not None and not self.thread.is_alive()


POLL = 0.5
"""Seconds between checks that a worker thread is still alive while waiting on it."""

_replicators: weakref.WeakSet[Replicator] = weakref.WeakSet()
"""Background replicators of this process, reset in a child made by ``fork()``."""


def _after_fork_in_child() -> None:
    for rep in list(_replicators):
        rep.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

HANDOFF_SECONDS = 10.0
"""Default of ``COMMITSTORE_MIRROR_HANDOFF_SECONDS``: the longest a commit waits for room in a
mirror's full queue (back-pressure) before it hands the copy off as owed and returns."""


def handoff_seconds() -> float:
    """The back-pressure bound: ``COMMITSTORE_MIRROR_HANDOFF_SECONDS``, default 10."""
    return seconds_from_env("COMMITSTORE_MIRROR_HANDOFF_SECONDS", HANDOFF_SECONDS)


class Replicator:
    """Owns the mirrors of one primary store.

    Background workers survive any failure of one copy (it becomes that artifact's failure). If a
    worker thread ends anyway (SystemExit, KeyboardInterrupt raised inside it), what it still
    owed is marked failed and later submissions to it fail at once: ``flush()``, ``close()`` and
    commits never wait on a dead thread. A commit waits for room in a full queue at most
    :attr:`handoff` seconds (``COMMITSTORE_MIRROR_HANDOFF_SECONDS``, default 10): then the copy
    is owed (kept in memory, counted by ``flush``, shown by ``status``) and the worker makes it
    once its queue is empty. At interpreter exit, the replicators never closed wait, all within
    ``COMMITSTORE_EXIT_FLUSH_SECONDS`` (default 60), for their copies, then warn (log and
    ``warnings.warn``) which artifacts did not reach which mirror (``_exitflush``).

    Owed copies outlive the process: every copy gets an entry in the owed journal on the
    primary (``journal.py``) when it is queued (sync mode: before it starts), before any worker
    can take it, removed once the copy is made (or ``sync`` made it); so a process SIGKILLed
    with copies queued, in flight, handed off or failed leaves them all owed. A replicator
    reads the journal of each of its mirrors when it is created (one listing per mirror, no
    copy) and, with a warning, queues those copies (background: as handed-off copies, made
    whenever the worker's queue is empty, counted by ``flush``) or reports them failed (sync
    mode: ``sync()`` makes them).
    """

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
        self._closed = False
        self.handoff = handoff_seconds()
        """The longest a background commit waits for room in a mirror's queue."""
        self.workers = [_Worker(m, queue.Queue(maxsize=queue_size)) for m in mirrors]
        self._generation = itertools.count(1)
        self._resume()
        if mode == "background":
            for w in self.workers:
                self._start(w)
            _exitflush.wait_at_exit(self)
            _replicators.add(self)

    def _start(self, w: _Worker) -> None:
        w.thread = threading.Thread(
            target=self._run,
            args=(w,),
            name=f"commitstore-mirror-{w.mirror.url}",
            daemon=True,
        )
        w.thread.start()

    def after_fork_in_child(self) -> None:
        """In a child made by ``fork()``: the copies in flight are the parent's (its workers
        make them and remove their journal entries), so the child owes none in memory; fresh
        locks (a thread the child lacks may have held one), fresh queues, and a worker thread
        made at the child's first copy to each mirror."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        for w in self.workers:
            w.jobs = queue.Queue(maxsize=w.jobs.maxsize)
            w.pending, w.handed, w.since, w.failed = [], {}, {}, {}
            w.unreported, w.journaled = [], {}
            w.jlock = threading.Lock()
            w.stalled, w.died, w.thread = False, None, None

    # -- the owed journal ---------------------------------------------------------------------
    def _journal(self, w: _Worker, name: str, digest: str | None, *, again: bool) -> None:
        """Write ``name``'s entry for ``w``'s mirror (``again``: even if it has one already)."""
        with w.jlock:
            with self._lock:
                if name in w.journaled and not again:
                    return
            if journal.write(self.primary.backend, w.mirror.url, name, digest):
                with self._lock:
                    w.journaled[name] = next(self._generation)

    def _unjournal(self, w: _Worker, name: str, generation: int | None) -> None:
        """The copy of ``name`` that started at journal ``generation`` reached the mirror: its
        entry goes, unless it was written again meanwhile (a newer version handed off)."""
        if generation is None:
            return
        with w.jlock:
            with self._lock:
                if w.journaled.get(name) != generation:
                    return
                del w.journaled[name]
            journal.remove(self.primary.backend, w.mirror.url, name)

    def _resume(self) -> None:
        """Take up the copies the journal says an earlier run owed to each mirror: queued (as
        handed off) in background mode, failed in sync mode; entries of names the primary no
        longer holds are removed. Never raises (an unreadable journal or primary: a warning)."""
        owed = journal.owed_at_start(self.primary.backend, [w.mirror.url for w in self.workers])
        now = time.monotonic()
        for w in self.workers:
            names = [name for name, _size in owed[w.mirror.url]]
            if not names:
                continue
            sizes = dict(owed[w.mirror.url])
            with self._lock:
                for name in names:
                    w.since.setdefault(name, (now, sizes[name]))
                    w.journaled[name] = next(self._generation)
                    if self.mode == "background":
                        w.pending.append(name)
                        w.handed[name] = None
                    else:
                        w.failed[name] = "owed from an earlier run: sync() makes the copy"
            then = "are being completed" if self.mode == "background" else "wait for sync()"
            msg = (
                f"commitstore: {len(names)} copies owed to {w.mirror.url} from an earlier run "
                f"{then}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}"
            )
            log.warning("%s", msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=4)

    def _journal_unsent(self) -> None:
        """Journal every copy still pending or failed (the exit flush ran out of time)."""
        for w in self.workers:
            with self._lock:
                unsent = list(dict.fromkeys([*w.pending, *w.failed]))
            for name in unsent:
                self._journal(w, name, None, again=False)

    # -- replication ------------------------------------------------------------------------
    def _fail(self, w: _Worker, name: str, exc: Exception) -> None:
        """Record that ``name`` did not reach ``w``'s mirror (caller holds no lock)."""
        with self._lock:
            w.failed[name] = str(exc)
            w.last_error = str(exc)
            w.unreported.append(exc)
            if isinstance(exc, BackendUnavailableError):
                w.reachable = False
        log.warning("mirror %s: %s not replicated: %s", w.mirror.url, name, exc)
        self._journal(w, name, None, again=False)

    def _copy(self, w: _Worker, name: str) -> None:
        """Copy with bounded retries; record the outcome in the worker's state (and in the
        owed journal: an entry written for the name goes once a copy reached the mirror)."""
        with self._lock:
            generation = w.journaled.get(name)
        try:
            copy_with_retries(self.primary, w.mirror, name, keep_unrecorded=True)
        except NotFoundError as exc:
            if generation is not None and self._gone(name):  # nothing left to owe
                self._unjournal(w, name, generation)
                with self._lock:
                    w.failed.pop(name, None)
                return
            self._fail(w, name, exc)
            return
        except Exception as exc:  # any failure is this artifact's, never the thread's
            self._fail(w, name, exc)
            return
        self._unjournal(w, name, generation)
        with self._lock:
            w.failed.pop(name, None)
            w.reachable = True
            w.stalled = False
            if name not in w.pending:
                w.since.pop(name, None)

    def _gone(self, name: str) -> bool:
        """Whether the primary holds no record of ``name`` (False when it cannot tell)."""
        try:
            return not any(r.name == name for r in list_records(self.primary.backend))
        except Exception:  # cannot tell: still owed
            return False

    def _done(self, w: _Worker, name: str) -> None:
        with self._lock:
            with contextlib.suppress(ValueError):
                w.pending.remove(name)
            if name not in w.pending and name not in w.failed:
                w.since.pop(name, None)
            self._idle.notify_all()

    def _next(self, w: _Worker) -> str | None:
        """The worker's next job: from its queue, else the oldest copy handed off; waits (in
        steps of POLL) while there is neither."""
        while True:
            try:
                return w.jobs.get(timeout=POLL)
            except queue.Empty:
                with self._lock:
                    if w.handed:
                        name = next(iter(w.handed))
                        del w.handed[name]
                        return name

    def _run(self, w: _Worker) -> None:
        # Replication is background work: yield the CPU to the training thread.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        try:
            while True:
                name = self._next(w)
                if name is None:
                    return
                try:
                    self._run_one(w, name)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException:  # bookkeeping broke after the copy: the loop goes on
                    log.exception("mirror %s: replication of %s", w.mirror.url, name)
        except BaseException as exc:  # SystemExit/KeyboardInterrupt in a copy: the thread ends
            w.died = f"replication thread stopped: {exc!r}"
            log.warning("mirror %s: %s", w.mirror.url, w.died)
        finally:
            if w.died is not None:
                self._fail_all(w, w.died)

    def _run_one(self, w: _Worker, name: str) -> None:
        """One job: nothing but SystemExit or KeyboardInterrupt gets out of here."""
        try:
            try:
                self._copy(w, name)
            except (SystemExit, KeyboardInterrupt) as exc:
                self._fail(w, name, CommitError(f"{name}: copy interrupted: {exc!r}"))
                raise
            except BaseException as exc:  # a failure in bookkeeping, or a stray BaseException
                failure = CommitError(f"{name}: replication failed: {exc!r}")
                failure.__cause__ = exc
                with self._lock:  # bookkeeping may be what broke: start it afresh if needed
                    if not isinstance(w.failed, dict):
                        w.failed = {}
                    if not isinstance(w.unreported, list):
                        w.unreported = []
                self._fail(w, name, failure)
        finally:
            self._done(w, name)

    def _fail_all(self, w: _Worker, why: str) -> None:
        """A dead worker: everything it still owed fails, with ``why``."""
        with contextlib.suppress(queue.Empty):
            while True:
                w.jobs.get_nowait()
        with self._lock:
            owed = list(dict.fromkeys(w.pending))
            w.handed.clear()
        for name in owed:
            self._fail(w, name, MirrorStopped(f"{name} not replicated to {w.mirror.url}: {why}"))
        with self._lock:
            w.pending.clear()
            self._idle.notify_all()

    def _check_workers(self) -> None:
        """Fail what dead workers still owe (their own cleanup normally did it already)."""
        for w in self.workers:
            if w.dead() and w.pending:
                self._fail_all(w, w.died or "replication thread stopped")

    def _raise_unreported(self) -> None:
        with self._lock:
            errors = [e for w in self.workers for e in w.unreported]
            for w in self.workers:
                w.unreported.clear()
        if errors and self.policy == "required":
            raise MirrorError("replication to a required mirror failed", errors)

    def submit(self, name: str, size: int = 0, digest: str | None = None) -> None:
        """Replicate a just-committed artifact (``size``: its bytes, for the status; ``digest``:
        its record's, for the owed journal). A copy handed off is journaled first.
        Background: enqueue, waiting while a mirror's queue is full (back-pressure) for at most
        :attr:`handoff` seconds, then hand the copy off: it is owed (``mirror_status``), the
        worker takes it as soon as its queue is empty, and a warning says so once per stall.
        A mirror whose worker stopped fails the artifact at once. Sync: copy now (each request
        of the copy bounded by the mirror's own timeouts). Under ``required``, failures raise
        MirrorError here (background: failures of earlier artifacts, at the next commit or
        flush)."""
        if self.mode == "sync":
            for w in self.workers:
                self._journal(w, name, digest, again=True)  # a kill mid-copy: still owed
                self._copy(w, name)
            self._raise_unreported()
            return
        self._raise_unreported()
        for w in self.workers:
            self._enqueue(w, name, size, digest)

    def _enqueue(self, w: _Worker, name: str, size: int, digest: str | None = None) -> None:
        """Queue (or hand off) one copy. Its journal entry is written first, before the worker
        can take it (so its removal never precedes its write): a process SIGKILLed with copies
        still queued leaves them owed on the primary, and the next start completes them."""
        self._journal(w, name, digest, again=True)
        with self._lock:
            w.pending.append(name)
            w.since.setdefault(name, (time.monotonic(), size))
            if w.thread is None and not self._closed:
                self._start(w)  # the first copy of a forked child
        deadline = time.monotonic() + self.handoff
        while True:
            if w.dead():
                why = w.died or "replication thread stopped"
                failure = MirrorStopped(f"{name} not replicated to {w.mirror.url}: {why}")
                self._fail(w, name, failure)
                self._done(w, name)
                return
            left = deadline - time.monotonic()
            try:  # waits when full: back-pressure, bounded by the hand-off
                w.jobs.put(name, timeout=max(0.001, min(POLL, left)))
            except queue.Full:
                if left > POLL:
                    continue
            else:
                return
            with self._lock:
                w.handed[name] = None
                warn, w.stalled = not w.stalled, True
            if warn:
                log.warning(
                    "mirror %s takes no copies (its queue stayed full for %gs): %s and later "
                    "commits are owed to it; they are copied as soon as it catches up, or by "
                    "sync() (see mirror_status())",
                    w.mirror.url,
                    self.handoff,
                    name,
                )
            return

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued artifact was replicated or failed; raise MirrorError under
        ``required`` if any failed. Raises TimeoutError if ``timeout`` passes first. Returns even
        if a worker thread stopped (what it owed is then marked failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check_workers()
            with self._lock:
                if not any(w.pending for w in self.workers):
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("mirror replication still pending")
                self._idle.wait(POLL if left is None else min(left, POLL))
        self._raise_unreported()

    def close(self) -> None:
        """Flush, then stop the workers. Idempotent."""
        self._closed = True
        _exitflush.forget(self)
        try:
            self.flush()
        finally:
            for w in self.workers:
                while w.thread is not None and w.thread.is_alive():
                    try:
                        w.jobs.put(None, timeout=POLL)
                    except queue.Full:
                        continue
                    w.thread.join()

    def exit_flush(self, deadline: float, *, warn: bool = True) -> None:
        """At interpreter exit: wait until the monotonic time ``deadline`` for pending copies,
        then (``warn``) warn (log and ``warnings.warn``) about every artifact that did not reach
        a mirror, saying whether it failed or was still being copied. Never raises."""
        if self._closed:
            return
        started = _exitflush.exit_started()
        try:
            self.flush(max(0.0, deadline - time.monotonic()))
        except (TimeoutError, MirrorError):
            pass
        except Exception as exc:  # exit must go on
            log.warning("mirror flush at exit failed: %s", exc)
        try:  # what is still owed outlives the process
            self._journal_unsent()
        except Exception as exc:  # exit must go on
            log.warning("owed copies not journaled at exit: %s", exc)
        if not warn:
            return
        with self._lock:
            missing = {
                w.mirror.url: (sorted(set(w.pending)), sorted(set(w.failed) - set(w.pending)))
                for w in self.workers
            }
        lines = []
        for url, (pending, failed) in missing.items():
            said = [f"{n} (still copying)" for n in pending] + [f"{n} (failed)" for n in failed]
            if said:
                lines.append(f"{url}: {', '.join(said)}")
        if lines:
            bound = _exitflush.exit_flush_seconds()
            msg = (
                "the store was not closed and these artifacts did not reach their "
                f"mirror before exit (the exit flush waited {time.monotonic() - started:.1f}s, "
                f"bounded by COMMITSTORE_EXIT_FLUSH_SECONDS={bound:g}; they are "
                "journaled as owed on the primary: the next start with these mirrors, or sync(), "
                "completes them): " + "; ".join(lines)
            )
            log.warning("%s", msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=1)

    def pending(self) -> dict[str, set[str]]:
        """Per mirror URL: the artifacts queued or being copied there (prune keeps them)."""
        with self._lock:
            return {w.mirror.url: set(w.pending) for w in self.workers}

    def settled(self, url: str, names: set[str]) -> None:
        """``names`` are whole on mirror ``url`` now (``sync`` made or found them): they are no
        longer owed there as failed copies (queued ones still run: they may be newer)."""
        with self._lock:
            for w in self.workers:
                if w.mirror.url != url:
                    continue
                for name in names & set(w.failed):
                    del w.failed[name]
                    if name not in w.pending:
                        w.since.pop(name, None)
        for w in self.workers:  # their journal entries go too
            if w.mirror.url != url:
                continue
            with self._lock:
                done = {n: w.journaled[n] for n in names & set(w.journaled) if n not in w.pending}
            for name, generation in done.items():
                self._unjournal(w, name, generation)

    def owed(self, w: _Worker) -> tuple[tuple[str, ...], float | None, int]:
        """What ``w``'s mirror is owed (pending and failed copies), oldest first, the age of
        the oldest in seconds, and their bytes (from memory: no I/O)."""
        now = time.monotonic()
        with self._lock:
            names = list(dict.fromkeys([*w.pending, *w.failed]))
            stamps = {n: w.since.get(n, (now, 0)) for n in names}
        names.sort(key=lambda n: stamps[n][0])
        age = now - stamps[names[0]][0] if names else None
        return tuple(names), age, sum(stamps[n][1] for n in names)

    def status(self) -> list[MirrorState]:
        """Per mirror: what is pending, what failed, what it lacks and owes as of this call.
        Never raises for a mirror's state: one that cannot be listed is ``reachable=False``
        with the error as ``last_error`` (``mirrors/status.py``)."""
        primary = {r.name: r for r in list_records(self.primary.backend)}
        out = []
        for w in self.workers:
            seen = probe(w.mirror)
            with self._lock:
                pending, failed, last = tuple(w.pending), dict(w.failed), w.last_error
            lacks = set(primary) - seen.held - set(pending) if seen.reachable else set()
            unsent = [n for n in failed if not seen.reachable or n not in seen.held]
            debt = owed_by_records(primary, [*pending, *unsent, *lacks])
            out.append(
                MirrorState(
                    url=w.mirror.url,
                    pending=pending,
                    failed=failed,
                    last_error=seen.error or last,
                    missing=tuple(sorted(lacks)),
                    reachable=seen.reachable,
                    owed=debt.count,
                    owed_bytes=debt.size,
                    oldest_owed_age=debt.oldest_age,
                )
            )
        return out
