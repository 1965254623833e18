"""The user-facing facade: :class:`CommitStore` (opened with :func:`commitstore.open_store`).

The facade validates its arguments (before any I/O) and hands each call to the module that owns
it: writes to the one commit path (``_commit``), checks to ``_verify``, verified reads to ``_read``,
mirrors to ``mirrors/``, pruning, gc and adoption to ``maintenance/``. This module holds the
store's state, its writes and its mirror methods; its reading and checking methods are
``_storereads.StoreReads``, its pruning, gc and adoption ``_storeupkeep.StoreUpkeep`` (both
bases of :class:`CommitStore`, over the state declared in ``_storebase``).
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, final

from commitstore import _folderwrite, _write
from commitstore._background import BackgroundCommits, check_inflight
from commitstore._commit import Committer, check_flag, check_new
from commitstore._stagefile import Stage
from commitstore._storebase import Progress
from commitstore._storereads import StoreReads
from commitstore._storeupkeep import StoreUpkeep
from commitstore.backends import Backend, resolve
from commitstore.errors import ConfigurationError
from commitstore.layout import redact_url, validate_name
from commitstore.maintenance.retention import Retention
from commitstore.maintenance.scrub import ScrubReport, check_budget, scrub
from commitstore.mirrors.replicator import MirrorState, Replicator
from commitstore.mirrors.sync import SyncReport, restore, sync_mirrors
from commitstore.options import (
    MirrorMode,
    MirrorPolicy,
    check_callback,
    check_timeout,
)
from commitstore.records import Record

__all__ = ["CommitStore"]

log = logging.getLogger("commitstore")

S = TypeVar("S")


def _unpickle(
    backend: Backend | None,
    opened: tuple[str, dict[str, Any]] | None,
    url: str,
    retention: Retention | None,
    async_inflight: int,
) -> CommitStore:
    """A pickled :class:`CommitStore` made again (``CommitStore.__reduce__``): over its own
    backend, or over one resolved again from the URL and options it was opened from."""
    if backend is None:
        assert opened is not None
        backend = resolve(*opened)
    return CommitStore(backend, url=url, retention=retention, async_inflight=async_inflight)


@final
class CommitStore(StoreReads, StoreUpkeep):
    """Staged writes, commits, verification and reads of artifacts under one root.

    Guarantees, on every backend:

    - An artifact is visible under its name only when it is whole; a committed artifact has a
      record (size, xxh3_128 digest) written after its data.
    - A failed or interrupted write publishes nothing and leaves every earlier artifact intact.
    - Reads never hand out bytes that do not match their record, unless ``verify="none"``.
    - With mirrors, every mirror receives each commit through its own commit primitive, with a
      byte-identical record.
    """

    _mirrors: builtins.list[CommitStore]

    def __init__(
        self,
        backend: Backend,
        *,
        url: str,
        mirrors: Sequence[CommitStore] = (),
        mirror_mode: MirrorMode = "background",
        mirror_policy: MirrorPolicy = "best_effort",
        mirror_queue: int = 8,
        retention: Retention | None = None,
        async_inflight: int = 1,
    ) -> None:
        self._backend = backend
        self.url = redact_url(url)
        """The store's URL, without any password."""
        self._committer = Committer(backend, self.url)
        """The one commit path into this store (used by mirrors copying into it)."""
        self._mirrors = list(mirrors)
        self._replicator: Replicator | None = None
        """The mirrors' replication, when the store has any."""
        if self._mirrors:
            self._replicator = Replicator(
                self._committer,
                [m._committer for m in self._mirrors],
                mode=mirror_mode,
                policy=mirror_policy,
                queue_size=mirror_queue,
            )
        self.retention = retention
        """Applied after every successful commit, when set."""
        self.warn_missing = True
        """Whether a read that finds nothing warns (``UserWarning`` and the log) when the
        store's root does not exist, so a mistyped URL is never taken for an empty store. Set
        it to False where the caller has its own answer for "not there"."""
        self._async_inflight = check_inflight(async_inflight)
        self._background: BackgroundCommits | None = None
        self._background_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CommitStore({self.url!r}, strategy={self._backend.strategy!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """A store without mirrors can be sent to another process (pickled, e.g. into torch's
        checkpoint process): it travels as its backend, URL, retention and ``async_inflight``
        and is made again there (the same root, the same commit protocol). A backend that
        cannot be pickled (an object store's client) travels as the URL and storage options
        it was opened from, credentials included, and is opened from them again.

        Raises:
            ConfigurationError: the store has mirrors (their queues live in this process), or
                its backend cannot be pickled and was not opened from a URL whose options can
                be.
        """
        if self._mirrors:
            raise ConfigurationError(
                f"{self.url}: a store with mirrors cannot be sent to another process (its "
                "mirror queues live in this one); send a store without mirrors, and sync after"
            )
        state = (self.url, self.retention, self._async_inflight)
        try:
            pickle.dumps(self._backend)
            return (_unpickle, (self._backend, None, *state))
        except Exception as exc:
            opened = self._backend.opened_from
            try:
                if opened is None:
                    raise
                pickle.dumps(opened)
            except Exception as again:
                raise ConfigurationError(
                    f"{self.url}: this store cannot be sent to another process: {again}"
                ) from exc
            return (_unpickle, (None, opened, *state))

    def __enter__(self) -> CommitStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def describe(self) -> dict[str, Any]:
        """Which commit strategy this store uses and why, with its declared capabilities."""
        return {"url": self.url, **self._backend.describe()}

    def exists(self) -> bool:
        """Whether the store's root exists, found without creating anything: a folder on a file
        system, at least one object under the prefix on an object store (storage that cannot
        tell says True). Opening a store never creates its root; the first write does.

        Raises:
            BackendUnavailableError, StorageError: the storage could not be asked.
        """
        return self._backend.root_exists()

    def local_path(self, name: str | None = None) -> Path | None:
        """Where the store's root (``name`` None) or ``name`` lies on a file system this process
        opens directly (a local or mounted folder), or None where the store is not such a
        folder (object stores, SMB, fsspec). No I/O; a path is returned whether or not anything
        is committed there. Writing through it bypasses every guarantee: use it to read, or to
        tell whether another path lies inside the store.

        Raises:
            InvalidNameError: a bad name.
        """
        return self._backend.local_path(() if name is None else validate_name(name))

    # -- mirrors: each call is handed to mirrors/ with the committers of the store and its mirrors

    def close(self) -> None:
        """Wait for asynchronous commits (``commit_async``), then for background replication,
        then stop both. Idempotent. Replication is stopped even if a commit failed.

        Raises:
            CommitStoreError: an asynchronous commit failed and the failure was not observed.
            MirrorError: under ``mirror_policy="required"``, if a mirror failed.
        """
        try:
            if self._background is not None:
                self._background.close()
        finally:
            if self._replicator is not None:
                self._replicator.close()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every asynchronous commit ended, then until every queued artifact reached
        every mirror (or failed there); ``timeout`` bounds the whole wait.

        Raises:
            CommitStoreError: an asynchronous commit failed and the failure was not observed.
            MirrorError: under ``mirror_policy="required"``, if a mirror failed.
            TimeoutError: ``timeout`` seconds passed first.
            ConfigurationError: ``timeout`` is not None or a finite number >= 0 (before
                waiting).
        """
        check_timeout(timeout)
        end = None if timeout is None else time.monotonic() + timeout
        if self._background is not None:
            self._background.flush(timeout)
        if self._replicator is not None:
            self._replicator.flush(None if end is None else max(0.0, end - time.monotonic()))

    @property
    def mirrors(self) -> list[CommitStore]:
        """The mirror stores, in the order given."""
        return list(self._mirrors)

    def mirror_status(self) -> list[MirrorState]:
        """Per mirror, in the order given: whether it could be listed now (``reachable``), the
        last error (the listing's when it could not be), pending and failed replications, the
        primary artifacts it lacks, and the copies it is owed (count, bytes, oldest age).

        Never raises for a mirror's state: a mirror that is down, refuses or times out is
        reported ``reachable=False``. Lists the primary once and every mirror once.

        Raises:
            BackendUnavailableError, StorageError: the primary itself could not be listed.
        """
        return self._replicator.status() if self._replicator else []

    def sync(self, *, repair: bool = True, progress: Progress | None = None) -> SyncReport:
        """Copy to every mirror what it lacks and, with ``repair``, replace copies that fail
        verification. Never deletes on a mirror; artifacts only the mirror has are reported.
        A primary artifact that fails its own check is never copied. Idempotent.
        ``progress``: called with the bytes published on mirrors so far, after each copy
        (one call at a time, from the copying threads).

        Raises:
            ConfigurationError: a bad ``repair`` or ``progress``, before any I/O.
        """
        repair = check_flag(repair, "repair")
        check_callback(progress, "progress")
        self.flush()
        report = sync_mirrors(
            self._committer,
            [m._committer for m in self._mirrors],
            repair=repair,
            progress=progress,
        )
        if self._replicator is not None:  # what sync made whole is no longer owed
            for m in report.mirrors:
                self._replicator.settled(m.url, {*m.copied, *m.repaired, *m.ok})
        return report

    def scrub(
        self,
        *,
        budget_bytes: int | None = None,
        budget_seconds: float | None = None,
        repair: bool = True,
        progress: Callable[[int, int], None] | None = None,
    ) -> ScrubReport:
        """Fully verify copies on the primary and every mirror, least recently verified first,
        until ``budget_bytes`` bytes were read or ``budget_seconds`` spent (None: no limit; the
        budget is honoured within one artifact). When each version was last verified is kept on
        each target (``.commitstore/scrub/``), so successive runs from any machine cover every
        copy. With ``repair``: a mirror's bad or missing copy is copied from the primary, a
        primary copy that fails its record is restored from a mirror copy with a byte-identical
        record that verifies; a copy that verifies is never overwritten (checked again right
        before publishing, so a version a writer committed meanwhile is kept), nothing is
        deleted, and a name whose copies disagree on the record is reported, not repaired.

        ``progress(done, total)``: called as bytes are verified (``total``: what the budget
        allows, or every copy).

        Raises:
            ConfigurationError: a budget that is not a positive number, a bad ``repair`` or
                ``progress`` (before any I/O).
        """
        budget_b = check_budget(budget_bytes, "budget_bytes")
        budget_s = check_budget(budget_seconds, "budget_seconds")
        repair = check_flag(repair, "repair")
        check_callback(progress, "progress")
        self.flush()
        report = scrub(
            self._committer,
            [m._committer for m in self._mirrors],
            budget_bytes=budget_b,
            budget_seconds=budget_s,
            repair=repair,
            progress=progress,
        )
        if self._replicator is not None:  # what scrub made whole on a mirror is no longer owed
            for t in report.targets[1:]:
                self._replicator.settled(t.url, set(t.repaired))
        return report

    def restore(
        self,
        name: str,
        *,
        source: CommitStore | str | os.PathLike[str] | None = None,
        overwrite: bool = False,
    ) -> Record:
        """Copy a verified mirror copy of ``name`` (from ``source``: a store, or the URL of one
        of this store's mirrors; default: the first mirror that has a whole one) back to the
        primary, through the primary's commit protocol.

        Copies only where nothing is lost: the primary's copy is missing or fails its full
        check, or verifies as a version whose record is byte-identical to the mirror's. A mirror
        copy that verifies as a pending version (a commit stopped after its data step) is
        restored as that version, its pending record written as the primary's record. A
        different primary version that verifies is kept unless ``overwrite=True``.

        Raises:
            NotFoundError: no mirror holds a whole copy.
            AlreadyExistsError: the primary holds a different version that verifies (the message
                says which is newer by record ``created``), or one was committed meanwhile.
            ConfigurationError: ``source`` is a URL that names none of this store's mirrors, or
                neither a store nor a URL (before any I/O).
        """
        validate_name(name)
        sources = [self._source(source)] if source is not None else self._mirrors
        return restore(self._committer, [m._committer for m in sources], name, overwrite=overwrite)

    def _source(self, source: object) -> CommitStore:
        """``restore``'s ``source``: a store as it is, a URL as the mirror it names."""
        if isinstance(source, CommitStore):
            return source
        if not isinstance(source, str | os.PathLike):
            raise ConfigurationError(
                f"source must be a CommitStore or the URL of one of its mirrors, not {source!r}"
            )
        text = os.fspath(source)
        wanted = {redact_url(text)}
        if "://" not in text:
            wanted.add(os.path.abspath(text))
        for mirror in self._mirrors:
            url = mirror.url
            if url in wanted or ("://" not in url and os.path.abspath(url) in wanted):
                return mirror
        shown = ", ".join(m.url for m in self._mirrors) or "none"
        raise ConfigurationError(
            f"source {redact_url(text)!r} is not one of this store's mirrors ({shown}); pass a "
            "CommitStore to restore from another store"
        )

    def _after_commit(self, record: Record) -> None:
        """After a successful (durable) commit: replicate, then apply automatic retention."""
        if self._replicator is not None:
            self._replicator.submit(record.name, record.size, record.digest)
        if self.retention is not None:
            try:
                self._prune(self.retention, dry_run=False)
            except Exception as exc:  # whatever it is, the commit stands; retention runs again
                log.warning(
                    "retention after %s failed (the commit stands): %s: %s",
                    record.name,
                    type(exc).__name__,
                    exc,
                )

    # -- writing ----------------------------------------------------------------------------
    def stage(
        self,
        name: str,
        *,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        alias: bool = False,
    ) -> Stage:
        """Open a staged write of ``name``: a writable binary file and a context manager.

        Bytes go to a staging location no reader mistakes for the artifact; a clean ``with`` exit
        (or ``commit()``) publishes the artifact and then its record; an exception or
        ``abort()``/``close()`` publishes nothing. With ``overwrite=True`` the replacement is
        atomic for readers. ``alias=True`` records a moving name (``last.ckpt``): never pruned,
        not counted by ``keep_last`` (``Record.alias``).

        Every write call's outcome is binary (here and in :meth:`stage_dir`, :meth:`put_bytes`,
        :meth:`put_file`, folder commits): if it raises, the name holds what it held before; if
        it returns, the name verifies as the new version, and a step after the data's publish
        that failed (the record's write, a folder sync) is reported on the returned record's
        ``outcome`` (``durable`` False, a note) and logged as a warning, never raised.

        Raises:
            InvalidNameError: a bad name, before any I/O.
            ConfigurationError: ``step`` or ``metadata`` cannot be recorded (not an int in
                [0, 2**63), not JSON, too deep or too large: ``docs/format.md``), before any I/O.
            AlreadyExistsError: ``overwrite=False`` and the name is taken (checked now and again,
                atomically, at commit).
        """
        return _write.open_stage(
            self._committer,
            name,
            step=step,
            metadata=metadata,
            overwrite=overwrite,
            alias=alias,
            after=self._after_commit,
        )

    def commit_async(
        self,
        name: str,
        snapshot: Callable[[], S],
        write: Callable[[S, Stage], object],
        *,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        alias: bool = False,
    ) -> concurrent.futures.Future[Record]:
        """Commit ``name`` in the background: returns once ``snapshot()`` returned, with a
        :class:`concurrent.futures.Future` of the :class:`Record`.

        ``snapshot()`` runs now, on the caller's thread, and must return what the commit needs
        as memory the commit owns (a copy: later changes to the caller's objects must not reach
        it); ``write(snap, f)`` then streams it into a staged write of ``name`` on a worker
        thread, through the same versioned commit as :meth:`stage` (old or new, never neither).

        Guarantees: commits land in submission order; at most ``async_inflight``
        (``open_store``) snapshots exist at once, and a further call waits for a slot before it
        takes its snapshot; ``list``/``latest`` never show an in-flight commit; replication and
        automatic retention run only after the commit landed. A failure is set on the future,
        logged, and, until observed (``result()``/``exception()``), raised again by the next
        ``commit_async``, :meth:`flush` or :meth:`close`. :meth:`flush`/:meth:`close` wait for
        every in-flight commit (then for its mirror copies); at interpreter exit they are
        finished within ``COMMITSTORE_EXIT_FLUSH_SECONDS`` and a warning names what did not land.

        Raises:
            InvalidNameError, ConfigurationError: bad arguments, before any I/O or snapshot.
            CommitStoreError: an earlier asynchronous commit's unobserved failure.
        """
        check_new(name, step, metadata)
        check_flag(overwrite, "overwrite")
        check_flag(alias, "alias")

        def run(snap: S) -> Record:
            with self.stage(
                name, step=step, metadata=metadata, overwrite=overwrite, alias=alias
            ) as st:
                write(snap, st)
            assert st.record is not None
            return st.record

        return self.run_async(name, snapshot, run)

    def run_async(
        self, name: str, prepare: Callable[[], S], job: Callable[[S], Record]
    ) -> concurrent.futures.Future[Record]:
        """The engine under :meth:`commit_async`, for a commit that is not one staged file (a
        folder the caller already wrote, say): waits for a free slot (``async_inflight``),
        runs ``prepare()`` on the caller's thread, then ``job(prepared)`` on the store's worker
        thread, in submission order with every other asynchronous commit of the store. The slot
        is held until ``job`` ended. ``name`` names the job in logs and exit warnings; the job
        commits through this store (so replication and retention follow it). Failures are
        handled as :meth:`commit_async`'s.

        An exception of ``prepare()`` propagates as it is (the slot is released, nothing is
        queued).

        Raises:
            CommitStoreError: an earlier asynchronous commit's unobserved failure.
        """
        engine = self._engine()
        release = engine.acquire()
        try:
            prepared = prepare()
        except BaseException:
            release()
            raise
        return engine.submit(name, lambda: job(prepared), release)

    def _engine(self) -> BackgroundCommits:
        with self._background_lock:
            if self._background is None:
                rep = self._replicator
                self._background = BackgroundCommits(
                    self.url,
                    self._async_inflight,
                    after_exit=(lambda d: rep.exit_flush(d, warn=False)) if rep else None,
                )
            return self._background

    @contextlib.contextmanager
    def stage_dir(
        self,
        name: str,
        *,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        records: list[Record] | None = None,
    ) -> Iterator[Path]:
        """Yield a local folder to fill; a clean exit publishes it whole, as one artifact.

        The record lists every file (path, size, digest). An exception publishes nothing; so
        does a file that cannot be stored (a symlink, FIFO or device, a name that breaks the
        naming rules: CommitError). Same checks of ``name``, ``step`` and ``metadata`` as
        :meth:`stage`, before any I/O. With ``records`` (a list), the committed record, with
        its outcome, is appended to it once the folder is published (the commit's own record:
        readable even when the name's record file is not yet).
        """
        got: list[Record] = [] if records is None else records
        with self._stage_dir(name, got, step=step, metadata=metadata, overwrite=overwrite) as path:
            yield path

    @contextlib.contextmanager
    def _stage_dir(
        self,
        name: str,
        got: list[Record],
        *,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Iterator[Path]:
        """:meth:`stage_dir`, appending the committed record (with its outcome) to ``got``
        (the integrations return it: the record may exist only as the pending record)."""

        def after(record: Record) -> None:
            got.append(record)
            self._after_commit(record)

        with _write.stage_dir(
            self._committer, name, step=step, metadata=metadata, overwrite=overwrite, after=after
        ) as path:
            yield path

    def begin_folder(
        self,
        name: str,
        *,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> _folderwrite.FolderWrite:
        """Start a folder artifact that several processes (or hosts) write: hand
        ``.token`` to each, which calls :meth:`join_folder`; each writes its files with
        ``open_file`` (records come back); one calls ``commit(records)``, the single commit point.
        Nothing is visible before it; gc removes what dead writers leave (``_folderwrite``).

        Raises:
            InvalidNameError: as :meth:`stage`, before any I/O.
            ConfigurationError: as :meth:`stage`, before any I/O; also ``overwrite=True`` on an
                object store.
            AlreadyExistsError: the name is taken.
        """
        return _folderwrite.begin(
            self._committer, name, step, metadata, overwrite, after=self._after_commit
        )

    def join_folder(self, token: str) -> _folderwrite.FolderWrite:
        """Join the folder write a coordinator began (its ``token``), from any process that
        opened the same store. ConfigurationError for a malformed token or another store's."""
        return _folderwrite.join(self._committer, token, after=self._after_commit)

    def put_bytes(self, name: str, data: bytes | bytearray | memoryview, **kw: Any) -> Record:
        """Commit ``data`` as ``name`` (same protocol and binary outcome as :meth:`stage`);
        checks free space first. The record returned carries ``outcome``
        (:class:`~commitstore.CommitOutcome`)."""
        return _write.put_bytes(self._committer, name, data, kw, after=self._after_commit)

    def put_file(
        self,
        name: str,
        local_path: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
        **kw: Any,
    ) -> Record:
        """Commit a local file as ``name``, streamed with constant memory; checks free space first.
        On S3 and Azure the parts are sent from the file, and an upload killed midway resumes at
        the next ``put_file`` of the same unchanged file (``docs/guarantees.md``, "Resuming an
        upload"); on GCS its resumable session resumes the same way ("Resuming a GCS upload").

        Raises:
            NotFoundError (a ``FileNotFoundError``), StorageError: the local file cannot be read.
            ConfigurationError: it is a folder (commit one with :meth:`stage_dir`), a FIFO,
                socket or device (refused before it is opened, never waited on).
            CommitError: the source changed size (on S3: or content) while it was copied
                (nothing published).
        """
        return _write.put_file(
            self._committer, name, local_path, kw, after=self._after_commit, progress=progress
        )

    def delete(self, name: str) -> None:
        """Remove the record first, then the data: a crash between leaves nothing claiming to be
        whole. Never removes a write in progress of another writer: data without a record that
        holds a staging entry, or (object stores) that a ``begin_folder`` write still in progress
        uploads to (at, below or above ``name``), is refused with NameConflictError and nothing
        is removed; a committed artifact's delete removes only the files its record names.

        Raises:
            NotFoundError: neither record nor data exists.
            NameConflictError: a write in progress there, or committed artifacts below
                ``name`` (nothing removed).
        """
        self._committer.delete(name)
