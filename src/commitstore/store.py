"""The user-facing facade: :class:`CommitStore` (opened with :func:`commitstore.open_store`)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from commitstore import _read
from commitstore._reads import Reads
from commitstore._stage import Stage
from commitstore.backends import Backend, CommitInfo, FileSink, PutMode
from commitstore.digest import digest_bytes, manifest_digest
from commitstore.errors import (
    AlreadyExistsError,
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    InvalidNameError,
    NotFoundError,
)
from commitstore.layout import infer_step, record_parts, validate_name
from commitstore.maintenance.adopt import AdoptReport, adopt
from commitstore.maintenance.gc import GcReport, collect
from commitstore.maintenance.prune import PruneReport, prune
from commitstore.maintenance.retention import Retention
from commitstore.mirrors.replicator import MirrorState, Replicator
from commitstore.mirrors.sync import SyncReport, restore, sync_mirrors
from commitstore.records import (
    FileRecord,
    Record,
    encode_record,
)

__all__ = ["CommitStore"]

log = logging.getLogger("commitstore")

RECORD_HEADROOM = 64 * 1024
"""Space reserved for the record when checking free space before a write of known size."""

Progress = Callable[[int], None]


def redact_url(url: str) -> str:
    """``url`` without a password (``smb://user:pw@host`` -> ``smb://user@host``)."""
    parts = urlsplit(url)
    if "://" not in url or parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))


def _mode(overwrite: bool) -> PutMode:
    return PutMode.REPLACE if overwrite else PutMode.CREATE


class CommitStore(Reads):
    """Staged writes, commits, verification and reads of artifacts under one root.

    Guarantees, on every backend:

    - An artifact is visible under its name only when it is whole; a committed artifact has a
      record (size, xxh3_128 digest) written after its data.
    - A failed or interrupted write publishes nothing and leaves every earlier artifact intact.
    - Reads never hand out bytes that do not match their record, unless ``verify="none"``.
    """

    def __init__(self, backend: Backend, *, url: str) -> None:
        self.backend = backend
        self.url = redact_url(url)
        """The store's URL, without any password."""
        self.replicator: Replicator | None = None
        """The mirrors, when the store has any."""
        self.retention: Retention | None = None
        """Applied after every successful commit, when set."""

    def __repr__(self) -> str:
        return f"CommitStore({self.url!r}, strategy={self.backend.strategy!r})"

    def __enter__(self) -> CommitStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Wait for background replication, then stop it. Idempotent.

        Raises:
            MirrorError: under ``mirror_policy="required"``, if a mirror failed.
        """
        if self.replicator is not None:
            self.replicator.close()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued artifact reached every mirror (or failed there).

        Raises:
            MirrorError: under ``mirror_policy="required"``, if a mirror failed.
            TimeoutError: ``timeout`` seconds passed first.
        """
        if self.replicator is not None:
            self.replicator.flush(timeout)

    @property
    def mirrors(self) -> list[CommitStore]:
        """The mirror stores, in the order given."""
        return [w.mirror for w in self.replicator.workers] if self.replicator else []

    def mirror_status(self) -> list[MirrorState]:
        """Per mirror: pending and failed (with the last error) replications, and the primary
        artifacts it lacks."""
        return self.replicator.status() if self.replicator else []

    def sync(self, *, repair: bool = True) -> SyncReport:
        """Copy to every mirror what it lacks and, with ``repair``, replace copies that fail
        verification. Never deletes on a mirror; artifacts only the mirror has are reported.
        A primary artifact that fails its own check is never copied. Idempotent."""
        self.flush()
        return sync_mirrors(self, self.mirrors, repair=repair)

    def restore(self, name: str, *, source: CommitStore | None = None) -> Record:
        """Copy a verified mirror copy of ``name`` (from ``source``, or the first mirror that
        has a whole one) back to the primary, through the primary's commit protocol."""
        validate_name(name)
        return restore(self, self.mirrors, name, source)

    def _replicate(self, record: Record) -> None:
        """After a successful (durable) commit: replicate, then apply automatic retention."""
        if self.replicator is not None:
            self.replicator.submit(record.name)
        if self.retention is not None:
            try:
                prune(self, self.retention, dry_run=False)
            except CommitStoreError as exc:  # the commit stands; retention retries next time
                log.warning("retention after %s failed: %s", record.name, exc)

    def describe(self) -> dict[str, Any]:
        """Which commit strategy this store uses and why, with its declared capabilities."""
        return {"url": self.url, **self.backend.describe()}

    # -- writing ------------------------------------------------------------------------
    def _check_free(self, parts: tuple[str, ...], size: int) -> None:
        free = self.backend.free_space(parts)
        if free is not None and free < size + RECORD_HEADROOM:
            raise InsufficientSpaceError(
                f"{self.url}: {size} bytes needed for {'/'.join(parts)}, {free} available",
                path="/".join(parts),
                needed=size,
                available=free,
            )

    def _check_absent(self, name: str, parts: tuple[str, ...]) -> None:
        if self.backend.stat(record_parts(parts)) is not None:
            raise AlreadyExistsError(f"{name} is already committed (overwrite=False)", name=name)
        if self.backend.stat(parts) is not None:
            raise AlreadyExistsError(
                f"{name} exists without a record (left by another tool or an interrupted commit); "
                "pass overwrite=True to replace it",
                name=name,
            )

    def _new_record(
        self, name: str, step: int | None, metadata: Mapping[str, Any] | None, **kw: Any
    ) -> Record:
        return Record(
            name=name,
            step=step if step is not None else infer_step(name),
            created=datetime.now(timezone.utc),
            metadata=dict(metadata or {}),
            **kw,
        )

    def _commit(
        self,
        parts: tuple[str, ...],
        overwrite: bool,
        publish_data: Callable[[], Record],
        body: bytes | None = None,
    ) -> Record:
        """Under the publish lock: publish the data (``publish_data`` returns its record), then
        the record with the same protocol (``body``: exact record bytes, for mirrors). Two
        writers' pairs never interleave."""
        with self.backend.publish_lock():
            if not overwrite:
                self._check_absent("/".join(parts), parts)
            record = publish_data()
            body = body if body is not None else encode_record(record)
            rsink = self.backend.open_sink(record_parts(parts), mode=_mode(overwrite))
            try:
                rsink.write(memoryview(body))
            except BaseException:
                rsink.abort()
                raise
            self._published(rsink.publish(size=len(body), digest=digest_bytes(body)), record.name)
        log.info("committed %s (%d bytes, %s)", record.name, record.size, record.digest)
        return record

    def _published(self, info: CommitInfo, name: str) -> None:
        if not info.durable:
            log.warning("%s: durability unconfirmed: %s", name, "; ".join(info.notes))

    def stage(
        self,
        name: str,
        *,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Stage:
        """Open a staged write of ``name``: a writable binary file and a context manager.

        Bytes go to a staging location no reader mistakes for the artifact; a clean ``with`` exit
        (or ``commit()``) publishes the artifact and then its record; an exception or
        ``abort()``/``close()`` publishes nothing. With ``overwrite=True`` the replacement is
        atomic for readers.

        Raises:
            InvalidNameError: before any I/O.
            AlreadyExistsError: ``overwrite=False`` and the name is taken (checked now and again,
                atomically, at commit).
        """
        parts = validate_name(name)
        if not overwrite:
            self._check_absent(name, parts)
        sink = self.backend.open_sink(parts, mode=_mode(overwrite))

        def finish(s: FileSink, size: int, digest: str) -> tuple[Record, CommitInfo]:
            infos: list[CommitInfo] = []

            def publish_data() -> Record:
                infos.append(s.publish(size=size, digest=digest))
                self._published(infos[0], name)
                return self._new_record(name, step, metadata, size=size, digest=digest)

            return self._commit(parts, overwrite, publish_data), infos[0]

        return Stage(name, sink, finish, after=self._replicate)

    @contextlib.contextmanager
    def stage_dir(
        self,
        name: str,
        *,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Iterator[Path]:
        """Yield a local folder to fill; a clean exit publishes it whole, as one artifact.

        The record lists every file (path, size, digest). An exception publishes nothing.
        """
        parts = validate_name(name)
        if not overwrite:
            self._check_absent(name, parts)
        sink = self.backend.open_dir_sink(parts, mode=_mode(overwrite))
        try:
            yield sink.local_path
        except BaseException:
            sink.abort()
            raise

        def publish_data() -> Record:
            info = sink.publish()
            self._published(info, name)
            files = tuple(FileRecord(p, size, d) for p, size, d in info.files)
            return self._new_record(
                name,
                step,
                metadata,
                size=sum(f.size for f in files),
                digest=manifest_digest(info.files),
                files=files,
                kind="dir",
            )

        try:
            record = self._commit(parts, overwrite, publish_data)
        except BaseException:
            sink.abort()
            raise
        self._replicate(record)

    def put_bytes(self, name: str, data: bytes | bytearray | memoryview, **kw: Any) -> Record:
        """Commit ``data`` as ``name`` (same protocol as :meth:`stage`); checks free space first."""
        parts = validate_name(name)
        self._check_free(parts, memoryview(data).nbytes)
        with self.stage(name, **kw) as st:
            st.write(data)
        assert st.record is not None
        return st.record

    def put_file(
        self,
        name: str,
        local_path: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
        **kw: Any,
    ) -> Record:
        """Commit a local file as ``name``, streamed with constant memory; checks free space first.

        Raises:
            CommitError: the source changed size while it was copied (nothing published).
        """
        parts = validate_name(name)
        with open(local_path, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            self._check_free(parts, size)
            with self.stage(name, **kw) as st:
                _read.copy_stream(src, st, progress)
                if st.tell() != size:
                    raise CommitError(f"{local_path}: changed size while it was copied")
        assert st.record is not None
        return st.record

    def delete(self, name: str) -> None:
        """Remove the record first, then the data: a crash between leaves nothing claiming to be
        whole. Raises NotFoundError if neither exists."""
        parts = validate_name(name)
        with self.backend.publish_lock():
            had_record = self.backend.remove(record_parts(parts))
            had_data = self.backend.remove(parts)
        if not (had_record or had_data):
            raise NotFoundError(f"{name} does not exist", name=name)

    def prune(
        self,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep: Sequence[str] = (),
        min_age: float = 300,
        dry_run: bool = False,
    ) -> PruneReport:
        """Delete committed artifacts outside the keep-set, on the primary and every mirror.

        The keep-set (``keep_last`` newest, every step multiple of ``keep_every``, names in
        ``keep``) comes from the primary's committed steps and applies to every target. Never
        deleted: anything modified less than ``min_age`` seconds ago, anything whose modification
        time is unknown or zero, the newest whole artifact of each target, anything whose
        replication to that target is pending, anything without a record. Deletion removes the
        record first. Idempotent; safe to run from two processes at once.
        """
        try:
            policy = Retention(keep_last, keep_every, tuple(keep), min_age)
        except ValueError as exc:
            raise InvalidNameError(str(exc)) from exc
        for name in keep:
            validate_name(name)
        return prune(self, policy, dry_run=dry_run)

    def adopt(self, name: str | None = None, *, trust: bool = False) -> AdoptReport:
        """Write records for files that have none (checkpoints written before commitstore), after
        a structural check: a torch ``.pt``/zip needs an intact end-of-central-directory with
        every member inside the file, a ``.safetensors`` a parseable header whose data offsets fit.
        Truncated files are reported, never adopted; unknown formats only with ``trust=True``."""
        if name is not None:
            validate_name(name)
        return adopt(self, name, trust=trust)

    def gc(self, *, min_age: float = 3600, dry_run: bool = False) -> GcReport:
        """Remove what dead writers left: staging files and folders, and (object stores)
        unfinished multipart uploads, older than ``min_age`` seconds.

        Never touches a committed artifact, a record, or anything outside the store's root;
        anything younger than ``min_age`` or of unknown age is kept and reported. Idempotent.
        With ``dry_run=True`` nothing is removed; ``removed`` lists what would be.
        """
        if min_age < 0:
            raise InvalidNameError(f"min_age must be >= 0, not {min_age!r}")
        report = collect(self.backend, min_age=min_age, dry_run=dry_run)
        for item in report.removed:
            log.info(
                "gc: %s %s (%s)", "would remove" if dry_run else "removed", item.path, item.kind
            )
        return report
