"""The strategy seam: what every backend implements, and nothing more.

A backend owns one root and knows its storage's single atomic "make it visible" step. The
facade (:class:`commitstore.CommitStore`) hashes, checks and records; a backend only stages bytes,
publishes them in one step, reads, lists and removes. Paths are tuples of already-validated
parts, relative to the root.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

from commitstore._recordrules import MAX_RECORD_BYTES, RecordFormatError

# re-exported: backends import what they declare and how they take options from here
from commitstore.backends.capabilities import LEGACY_FLAGS as LEGACY_FLAGS  # noqa: PLC0414
from commitstore.backends.capabilities import Capabilities as Capabilities  # noqa: PLC0414
from commitstore.backends.storageoptions import Kinds as Kinds  # noqa: PLC0414
from commitstore.backends.storageoptions import take_options as take_options  # noqa: PLC0414
from commitstore.errors import (
    CommitError,
    InsufficientSpaceError,
    IntegrityError,
    StorageError,
)
from commitstore.layout import Parts

log = logging.getLogger("commitstore")


class StagingTaken(Exception):
    """A writer's new staging entry was gone, or held by gc (which takes only an entry no
    writer holds), before the writer could take its liveness lock on it: the writer gives it up
    and makes another under a new name. Never leaves the commit machinery."""


class PutMode(enum.Enum):
    """How a publish treats a name that already holds something."""

    CREATE = "create"
    """Publish only if the name is free, else AlreadyExistsError. Atomic (one winner among racing
    writers) where :attr:`Capabilities.exclusive_create` says so; elsewhere the caller checks
    absence under :meth:`Backend.publish_lock` first."""
    REPLACE = "replace"
    """Publish over whatever is there, in one step where :attr:`Capabilities.atomic_replace`."""


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What a backend knows of one stored file."""

    size: int
    """Bytes."""
    mtime: float | None
    """Seconds since the epoch; None (or 0, as some network filesystems return) means unknown."""
    is_dir: bool = False
    """True for a folder."""
    tag: str | None = None
    """The stored version's tag from a listing (S3/Azure ETag, GCS generation): it changes whenever
    the content is replaced. None where the storage has none (file systems)."""
    regular: bool = True
    """False for what is neither a regular file nor a folder: a symlink (never followed; ``size``
    is then the link's own), a FIFO, a socket, a device. Never read as an artifact or a record.
    Object stores hold only regular objects."""


@dataclass(slots=True)
class CommitInfo:
    """What a publish did, for logs and for the caller's commit result."""

    bytes_written: int
    durable: bool = True
    """False when the backend could not confirm durability (directory fsync refused)."""
    notes: list[str] = field(default_factory=list)
    files: list[tuple[str, int, str]] = field(default_factory=list)
    """For folder artifacts: (path, size, digest) of every file published, sorted by path."""
    tag: str | None = None
    """The version tag of the published object (S3/Azure ETag, GCS generation), as the store
    returned it, where the store has one: the record cache's key for a record (``_recordcache``)."""


@dataclass(frozen=True, slots=True)
class PendingUpload:
    """An object-store upload that was started and neither completed nor aborted."""

    key: str
    """The object key it would have created (relative to the bucket)."""
    upload_id: str
    started: float | None
    """Seconds since the epoch; None if the store did not say."""


@runtime_checkable
class Rereadable(Protocol):
    """A source that can give its bytes again, by position, at no transfer cost (a local file
    read from the page cache): :meth:`FileSink.reread_from`."""

    def pread(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer only at the end), without moving any read
        position; safe to call from several threads at once. Raises StorageError."""
        ...


class FileSink(abc.ABC):
    """Staged bytes of one file, invisible under the final name until :meth:`publish`."""

    bytes_written: int
    """Bytes the storage accepted so far."""

    def reread_from(self, source: Rereadable, size: int) -> bool:
        """Offer the sink ``source``, which holds the very bytes about to be written (from
        offset 0, ``size`` of them expected), before the first :meth:`write`.

        True: the sink keeps no copy of the bytes; it sends them from ``source`` again, and the
        caller keeps ``source`` open until :meth:`publish` or :meth:`abort` returns. The sink
        still sees every byte through :meth:`write` and only takes this offer where the bytes
        sent are bound to the bytes written (the server checks each body against a checksum
        computed from the written bytes): a source that changed in between fails the commit,
        never stores different bytes. False (the default): nothing changes."""
        del source, size
        return False

    @abc.abstractmethod
    def write(self, data: memoryview) -> None:
        """Write all of ``data`` to the staging location (loops on short writes)."""

    def prepare(self) -> None:
        """Called once the last byte is written, before the commit's pending record: a sink may
        start making its bytes durable now, in the background (:meth:`publish` waits for it and
        raises what it met). Publishes nothing. Default: nothing to start."""
        return None

    @abc.abstractmethod
    def publish(self, *, size: int, digest: str) -> CommitInfo:
        """Make the staged bytes durable, then visible under the final name in one step.

        ``size`` and ``digest`` are what the caller hashed on the way; a backend that can check
        what it stored (a fresh stat, a read-back, a server checksum) compares against them first.
        On failure nothing is visible under the final name and the staging location is removed.
        Raises AlreadyExistsError when the sink was opened with ``PutMode.CREATE`` and the name
        appeared meanwhile, CommitError when a check fails.
        """

    @abc.abstractmethod
    def abort(self) -> None:
        """Remove the staging location. Idempotent; never raises for a sink already gone."""


class DirSink(abc.ABC):
    """A folder artifact being staged: the caller fills :attr:`local_path`."""

    local_path: Path
    """A local folder the caller writes into."""

    @abc.abstractmethod
    def publish(self) -> CommitInfo:
        """Make every file and folder durable, then publish the folder under its name."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Remove the staging folder. Idempotent."""


class Backend(abc.ABC):
    """One storage root and its commit strategy."""

    strategy: str
    """Name of the commit strategy, as shown by ``describe()``."""
    capabilities: Capabilities

    @abc.abstractmethod
    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        """Start staging a file that will be published at ``parts``."""

    @abc.abstractmethod
    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        """Start staging a folder that will be published at ``parts``."""

    @abc.abstractmethod
    def open_read(self, parts: Parts) -> BinaryIO:
        """Open a stored file for reading (seekable). Raises NotFoundError; IntegrityError
        (``status="size_mismatch"``) for a symlink or special file (never blocks on a FIFO)."""

    @abc.abstractmethod
    def stat(self, parts: Parts) -> FileInfo | None:
        """Fresh (uncached) information about ``parts``, or None if it does not exist."""

    @abc.abstractmethod
    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        """Every file below ``parts`` (recursively, hidden ones included), relative to ``parts``."""

    @abc.abstractmethod
    def remove(self, parts: Parts) -> bool:
        """Remove a file or a folder tree, durably; False if nothing was there."""

    def remove_leftover(self, parts: Parts) -> bool:
        """Remove a file whose coming back after a crash is harmless (a commit's pending record,
        once its record is durable): as :meth:`remove`, but the removal itself need not be made
        durable, which saves a folder sync where the storage has one. False if nothing was
        there."""
        return self.remove(parts)

    def publish_small_from(self, src: Parts, dst: Parts, *, mode: PutMode) -> CommitInfo | None:
        """Publish the small file at ``src`` (whole and durable already: a commit's pending
        record) under ``dst``, in the same folder, by one atomic rename that takes ``src`` away,
        then make that rename durable (a folder sync). ``mode`` as for a publish: ``CREATE``
        fails atomically (AlreadyExistsError) if ``dst`` exists, ``REPLACE`` swaps in one step,
        so ``dst`` holds its old bytes or ``src``'s, never a mix, and a crash leaves ``src``'s
        bytes under one of the two names. A failed folder sync after the rename is not raised:
        the returned info says durability unconfirmed.

        Returns None, having done nothing, where the storage has no such step (the default):
        the caller then writes ``dst`` anew. Raises StorageError (and AlreadyExistsError) when
        the rename fails; ``src`` is then left as it was."""
        return None

    def put_pending(self, parts: Parts, body: bytes) -> CommitInfo | None:
        """Write a commit's pending record ``body`` at ``parts`` (``layout.intent_parts``),
        durable (its bytes and its name) when this returns, unless the returned info says
        durability unconfirmed (a failed folder sync, reported on the commit's outcome). Called
        by ``Committer.commit`` only, under the publish lock, after ``promote_earlier`` and
        before the data is published.

        Unlike a record it need not appear whole in one step, so a backend may write it in
        place and make its bytes and its name durable at once: until the data is renamed into
        place, a pending record that the data does not match (none, an empty one, a torn one)
        is ignored by every reader and by gc, and the pending record it replaces is not what
        makes the name verify (``promote_earlier`` made that one the record first). What a
        crash leaves before this returns is therefore the old version.

        Returns None, having done nothing, where the storage has no such path (the default):
        the caller then writes it with ``put_small`` (a staged write renamed into place). Raises
        as a sink's publish does (nothing is published then; a partial file left is removed
        where it can be)."""
        return None

    def remove_files(self, parts: Parts, files: list[Parts]) -> bool:
        """Remove exactly the files ``files`` (paths relative to the folder ``parts``, as a
        folder record names them), then every folder below ``parts``, and ``parts`` itself, that
        is left empty. Never a file not named, nor a folder (a named path that is a folder stays);
        the removals need not be durable (the caller removed the record first: see
        :meth:`remove_leftover`). False if none of the files was there. Default: one
        :meth:`stat` and :meth:`remove_leftover` per file, then :meth:`remove_empty_folder`
        bottom-up; nothing when ``parts`` is not a folder."""
        info = self.stat(parts)
        if info is None or not info.is_dir:
            return False
        removed = False
        for rel in files:
            info = self.stat((*parts, *rel))
            if info is not None and not info.is_dir:
                removed = self.remove_leftover((*parts, *rel)) or removed
        for rel in sorted(self.walk_folders(parts), key=len, reverse=True):
            self.remove_empty_folder((*parts, *rel))
        self.remove_empty_folder(parts)
        return removed

    def remove_empty_folder(self, parts: Parts) -> bool:
        """Remove the folder ``parts`` if it is empty; False (nothing removed) if it is not, or
        is not a folder, or is gone. Default: checks with :meth:`walk` and
        :meth:`walk_folders`, then :meth:`remove` (storage with a real ``rmdir`` overrides it, so
        a file that appears meanwhile is never removed)."""
        if not parts:
            return False  # never the root
        info = self.stat(parts)
        if info is None or not info.is_dir or self.walk(parts) or self.walk_folders(parts):
            return False
        return self.remove(parts)

    @abc.abstractmethod
    def free_space(self, parts: Parts) -> int | None:
        """Bytes available for new data near ``parts``, or None if unknown."""

    def root_exists(self) -> bool:
        """Whether the store's root exists, found without creating anything: a folder on a
        file system, at least one object under the prefix on an object store. Opening a store
        never creates its root; the first write does. Default (storage whose connection makes
        the root, or that cannot tell): True.

        Raises:
            BackendUnavailableError, StorageError: the storage could not be asked.
        """
        return True

    opened_from: tuple[str, dict[str, Any]] | None = None
    """The URL and storage options this backend was opened from (set by ``resolve``), so that
    another process can open the same root again (``commitstore.dcp`` under torch's PROCESS
    checkpointer) where the backend itself holds what cannot be pickled (an object store's
    client). None for a backend built directly."""

    @property
    def staging_names(self) -> bool:
        """:attr:`Capabilities.staging_names` of this backend (a read-only view)."""
        return self.capabilities.staging_names

    @property
    def writer_slots(self) -> bool:
        """:attr:`Capabilities.writer_slots` of this backend (a read-only view)."""
        return self.capabilities.writer_slots

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Fold a behaviour a subclass still declares as a class attribute named like a
        :class:`Capabilities` field (``rereads_locally = True``, as backends written before
        those fields did) into its class-level :attr:`capabilities`, so the core, which reads
        only :attr:`capabilities`, sees it. A backend whose capabilities are a property
        (object stores) builds them itself."""
        super().__init_subclass__(**kwargs)
        caps = getattr(cls, "capabilities", None)
        if not isinstance(caps, Capabilities):
            return
        declared: dict[str, Any] = {}
        for name in LEGACY_FLAGS:
            for klass in cls.__mro__:
                if klass is Backend:
                    break
                if name in vars(klass) and not isinstance(vars(klass)[name], property):
                    declared[name] = vars(klass)[name]
                    break
        if any(getattr(caps, k) != v for k, v in declared.items()):
            cls.capabilities = dataclasses.replace(caps, **declared)

    def place(self) -> tuple[str, ...] | None:
        """Where the store lives, as a path: a kind of storage (and its server), then the
        root's parts. Two stores overlap when one's place is the other's or starts with it (the
        same folder or prefix, or one inside the other): ``open_store`` refuses such a mirror.
        None: unknown (never compared). No I/O beyond resolving a local path's symlinks."""
        return None

    def local_root(self) -> str | None:
        """The store's root as a local path with symlinks resolved, where it is one (local
        disks and mounted bridges); None elsewhere. ``get_file`` and ``fetch`` refuse a
        destination inside it."""
        return None

    def local_path(self, parts: Parts) -> Path | None:
        """The path of ``parts`` on a file system this process opens directly (a local or
        mounted folder: the integrations and folder writes then work on it in place), or None
        where the store is not such a folder (object stores, SMB, fsspec). ``()`` is the root.
        Default: None."""
        return None

    def hold_folder(
        self, parts: Parts, *, move_from: str | None = None, own: object | None = None
    ) -> object | None:
        """Take this process's liveness lock on the staging folder ``parts``, made if missing
        (or, with ``move_from``, that local folder renamed onto it, missing or empty, and only
        while no writer but the one holding ``own``, its earlier lock on it, holds it), kept
        until :meth:`release_folder`; the kernel drops it if the process dies: while it is
        held, gc never removes the folder, whatever its age, and gc never finds it made and
        not yet locked. None where the store has no such lock or the folder cannot be locked.
        Default: None.

        Raises:
            StagingTaken: gc held the folder (removing it) before this lock: make it again.
            OSError: the folder cannot be made, or (``move_from``) nothing could be moved
                (another writer holds the folder, a file is there, gc claims beside it).
        """
        return None

    def release_folder(self, held: object) -> None:
        """Drop a lock :meth:`hold_folder` took. Default: nothing."""
        return None

    def make_folders(self, parts: Parts) -> None:
        """Create the folder ``parts`` and its missing parents, never through a symlink. Only
        where :meth:`local_path` answers. Default: not supported.

        Raises:
            OSError, StoragePathError: a component is a symlink or cannot be made.
        """
        raise NotImplementedError(f"{type(self).__name__} has no local folders")

    def settle_staged(self, parts: Parts, files: list[tuple[str, int, str]], staged: Parts) -> None:
        """Finish a folder replace of ``parts`` that stopped while copying from its whole staged
        copy at ``staged`` (``files``: the new version's path, size and digest): copy every
        staged file over its final key, delete what the new version lacks and the staged copy.
        Idempotent (roll forward). Only stores that stage folder replaces (object stores).

        Raises:
            CommitError: this store never stages folders (default).
        """
        raise CommitError(f"{'/'.join(parts)}: a staged folder copy on {self!r}")

    def sink_memory(self, size: int, *, source_rereads: bool) -> int:
        """Bytes a file sink of this store holds in memory at most, beyond the caller's read
        buffer, for a file of ``size`` bytes; ``source_rereads``: the bytes come from a reader
        whose raw file is :class:`Rereadable` (:attr:`Capabilities.rereads_locally`). From the
        declared capabilities: up to :attr:`Capabilities.whole_max` (0: the sink stages on the
        storage), none where the sink sends from a rereadable source
        (:attr:`Capabilities.reread_bodies`)."""
        caps = self.capabilities
        if source_rereads and caps.reread_bodies:
            return 0
        return min(size, caps.whole_max)

    def publish_folder(self, staging: Parts, parts: Parts, *, mode: PutMode) -> CommitInfo:
        """Publish the staging folder ``staging`` (a staging name beside ``parts``, filled in
        place by other sinks, each file already durable) under ``parts`` in one step per
        ``mode``, as :meth:`open_dir_sink`'s publish would; the folders are made durable first.
        Only where :attr:`Capabilities.staging_names` is declared. Default: not supported."""
        raise NotImplementedError(f"{type(self).__name__} cannot publish a staged folder")

    def restore_aside(self, parts: Parts) -> bool:
        """Move the entry a stopped move-aside replace left under the aside name of ``parts``
        (``layout.aside_parts``) back under ``parts``, with a no-replace move (never a copy):
        the roll-back of ``backends/rename/aside.py``. The caller holds the publish lock and
        has checked that ``parts`` is missing and the aside entry is a version of it. False if
        there was no aside entry. Default: storage whose replaces never move anything aside
        (object stores, memory): nothing to restore.

        Raises:
            AlreadyExistsError: ``parts`` exists (nothing was moved). CommitError,
                StorageError: the move failed (the aside entry stays where it was).
        """
        return False

    def walk_folders(self, parts: Parts) -> list[Parts]:
        """Every folder below ``parts`` (recursively, empty ones included), relative to
        ``parts``. Default: none (storage without real folders)."""
        return []

    def last_change(self, parts: Parts) -> float | None:
        """The latest time ``parts`` or anything below it was modified or changed: the newest
        modification time, and status-change time (ctime) where the storage keeps one, of the
        entry itself and of every file and folder below it. A copy that preserves old mtimes
        (``shutil.copytree``) still shows a fresh ctime. None if the entry is gone or any time
        is unknown (None or 0). Default: the newest mtime of ``stat(parts)`` and ``walk(parts)``.
        """
        info = self.stat(parts)
        if info is None:
            return None
        times = [info.mtime]
        if info.is_dir:
            times += [i.mtime for _rel, i in self.walk(parts)]
        if any(t is None or t <= 0 for t in times):
            return None
        return max(t for t in times if t is not None)

    def read_small(self, parts: Parts) -> bytes:
        """All bytes of a small file (a record, a pending record, a marker, a cache shard), in
        as few requests as the storage allows.

        Raises:
            RecordFormatError: the file is larger than :data:`MAX_SMALL_BYTES` (the maximum
                record size, ``docs/format.md``); its size is checked before anything is read,
                and at most ``MAX_SMALL_BYTES + 1`` bytes are ever read (a file that grows while
                it is read); also anything at the path that is not a regular file (a FIFO,
                a device, a symlink, a folder): a record there is damaged, and it is never
                opened for reading (a FIFO would block). NotFoundError, StorageError: as
                :meth:`open_read`.
        """
        try:
            f = self.open_read(parts)
        except IntegrityError as exc:  # the storage's state at a record's path: a bad record
            raise RecordFormatError(str(exc)) from exc
        with f:
            return read_bounded(f, lambda: "/".join(parts))

    def read_small_tagged(self, parts: Parts) -> tuple[bytes, str | None]:
        """Like :meth:`read_small` (the same bound), plus the tag (see :attr:`FileInfo.tag`) of
        the version read, taken from the same response; None where the storage has no tags."""
        return self.read_small(parts), None

    def small_reads(
        self, folder: Parts, *, max_bytes: int | None = None
    ) -> contextlib.AbstractContextManager[Callable[[Parts], tuple[bytes, str | None]]]:
        """A reader of many small files below ``folder`` (a scan's records), valid inside the
        ``with`` block: ``read(rel)`` is :meth:`read_small_tagged` of ``(*folder, *rel)``, with
        its errors. Backends that can hold the folder open for the block override it (the local
        family: one directory descriptor per scan instead of a walk from the root per file);
        those may stop reading a file after ``max_bytes + 1`` bytes (the caller refuses it as too
        large), or refuse a larger one from its size with RecordFormatError. Thread-safe where
        :attr:`Capabilities.read_concurrency` > 1. Default: a loop of :meth:`read_small_tagged`."""
        return contextlib.nullcontext(lambda rel: self.read_small_tagged((*folder, *rel)))

    @contextlib.contextmanager
    def publish_lock(self) -> Iterator[None]:
        """Held around "publish data, then publish record" so two writers' pairs never interleave.

        Short (a rename and a small record write). Backends without locks rely on conditional
        writes instead; the default holds nothing.
        """
        yield

    def folders_kept(self) -> contextlib.AbstractContextManager[None]:
        """Around read-only checks made outside the publish lock: where walks are costly
        (local disks), the folders they reach may be kept open until the block ends. Nothing
        here."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def read_lock(self) -> Iterator[None]:
        """What a check holds to wait out a publish in flight (the last of its re-reads of a
        changed record): :meth:`publish_lock` where it can be taken, else nothing. A check
        never needs to write: where the lock cannot be taken (a read-only mount, a read-only
        credential, a full disk refusing the lock file) it runs without it, and reports what it
        finds (a damaged artifact is an integrity problem, never a storage error of the lock).
        Errors of the storage being unreachable still raise."""
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self.publish_lock())
            except (StorageError, InsufficientSpaceError) as exc:
                log.debug("checking without the publish lock: %s", exc)
            yield

    def held(self, parts: Parts) -> bool:
        """True if a live writer holds the staging entry ``parts`` (its liveness lock, taken
        for the writer's life): gc never removes it, whatever its age. Default: no such lock
        (False); the entry is aged by its modification times."""
        return False

    def claimed(self, parts: Parts) -> contextlib.AbstractContextManager[str | None]:
        """gc's hold on the staging entry ``parts`` while it judges and removes it: why it is
        kept (a live writer holds it: "held by a live writer", whatever its age; a writer is
        making an entry beside it right now), or None, and where the store has a liveness lock
        no writer can take the entry until the block ends (a writer that made it but had not
        locked it yet gives it up: ``StagingTaken``). Default: :meth:`held`."""
        return contextlib.nullcontext("held by a live writer" if self.held(parts) else None)

    def pending_uploads(self) -> list[PendingUpload]:
        """Unfinished uploads under this store's root (object stores); none elsewhere."""
        return []

    def resume_upload_of(self, state: bytes) -> tuple[str, str] | None:
        """The (key, upload id) that a resumable upload's stored state (``.commitstore/resume/``)
        names, for gc; None when it does not parse. Storage without resumable uploads: None."""
        return None

    def abandon_upload_of(self, state: bytes) -> None:
        """Cancel, where possible, the upload a stale resume state names before gc removes the
        state (GCS: its resumable session, which no listing shows). Default: nothing (S3's
        uploads are aborted by gc's pass over the unfinished uploads)."""
        del state

    def orphan_markers(self, uploads: list[PendingUpload]) -> list[tuple[Parts, float | None]]:
        """The writers' upload markers (object stores that keep them) whose upload is not
        among ``uploads`` (the pending uploads just listed): left by a writer killed between
        its upload's end and its marker's removal. Each with its modification time (None:
        unknown), for gc to age. Default: none."""
        return []

    def abort_upload(self, upload: PendingUpload) -> None:
        """Abort one unfinished upload (object stores)."""
        raise NotImplementedError(f"{type(self).__name__} has no uploads to abort")

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Strategy, reason it was chosen, location and capabilities (no credentials)."""


MAX_SMALL_BYTES = MAX_RECORD_BYTES
"""The largest file :meth:`Backend.read_small` reads: the maximum record size."""


def too_large(shown: str, size: int | None = None) -> RecordFormatError:
    """The error of a small file (a record...) over :data:`MAX_SMALL_BYTES` (``size``: its
    size, where known)."""
    what = "larger than" if size is None else f"{size} bytes, more than"
    return RecordFormatError(f"{shown} is {what} {MAX_SMALL_BYTES} bytes")


def read_bounded(f: BinaryIO, shown: Callable[[], str]) -> bytes:
    """All bytes of the seekable ``f`` (positioned at 0) if there are at most
    :data:`MAX_SMALL_BYTES`: its size is taken by seeking to its end (nothing read), and at most
    one byte more than the bound is read after that.

    Raises:
        RecordFormatError: it is larger.
    """
    size = f.seek(0, io.SEEK_END)
    if size > MAX_SMALL_BYTES:
        raise too_large(shown(), size)
    f.seek(0)
    data: bytes = f.read(MAX_SMALL_BYTES + 1)
    if len(data) > MAX_SMALL_BYTES:  # grew since the seek
        raise too_large(shown(), len(data))
    return data
