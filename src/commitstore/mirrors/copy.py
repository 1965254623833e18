"""Copy one committed artifact from one store to another through the target's own commit protocol.

The copy is streamed (constant memory), hashed on the way and compared with the source's record
before anything is published on the target: a source copy that does not match its record is never
copied. The target gets a byte-for-byte copy of the source's record, or, where the source's bytes
are a pending version (a commit stopped between its data and record steps; resolved as every
reader resolves it, ``_verify``), of that pending record, written as the target's record.

A file read from a local disk is offered to the target's sink to be read again
(``FileSink.reread_from``): a sink that would hold the file in memory until its upload (an object
store's, up to its ``whole_max``) sends its bodies from the source file instead, the server checking
each against the MD5 of the bytes hashed here, so a copy holds one read buffer whatever the target.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import BinaryIO, cast

from commitstore._commit import Committer
from commitstore._filecommit import Options
from commitstore._scan import StoredRecord, read_intent, read_record
from commitstore._sinkwrite import aborting
from commitstore._slots import read_slots
from commitstore._verify import (
    PLACES,
    check_exact,
    compare,
    folder_files,
    locate,
    pending_version,
    record_of,
    served_version,
    stored_version,
)
from commitstore.backends import DirSink, FileSink, PutMode, Rereadable, local_error
from commitstore.digest import copy_hashed
from commitstore.errors import (
    AlreadyExistsError,
    CommitStoreError,
    IntegrityError,
    NotFoundError,
    SourceMismatch,
)
from commitstore.layout import Parts, validate_name
from commitstore.records import Record, RecordFormatError, VerifyResult

RETRIES = 3
"""Attempts per artifact and mirror (background replication and ``sync`` alike) before it is
reported failed; only errors that say they are ``retryable`` are tried again."""
RETRY_DELAY = 0.2
"""Seconds before the first retry; doubled before each next one."""
COPY_CHUNK = 2 * 1024 * 1024
"""Read buffer of one copy. ``sync`` runs several copies per mirror and mirrors side by side,
each with its own buffer; reads of this size from a primary already cost little next to hashing
and sending them."""


REREADS = 4
"""Times a copy reads the source's record and data again when its bytes did not match the
record it read first and the source has moved on meanwhile (another version committed, or
being committed, under the name: an alias overwritten quickly)."""
REREAD_DELAY = 0.05
"""Seconds before the first such re-read; one more step of it before each next one."""


def _check_source(
    src: Committer, rec: Record, where: str, found: tuple[int, str], expected: tuple[int, str]
) -> None:
    size, digest = found
    mismatch = compare(*expected, found_size=size, found_digest=digest, level="full")
    if mismatch is not None:
        raise SourceMismatch(
            f"{rec.name}{'/' + where if where else ''} on {src.url} does not match its record "
            f"({size} bytes, {digest}); not copied",
            name=rec.name,
            status=mismatch.status,
            actual_size=size,
            actual_digest=digest,
        )


def _rereadable(src: Committer, reader: object) -> Rereadable | None:
    """The raw file under ``reader`` if the source can read it again at no transfer cost."""
    if not src.backend.capabilities.rereads_locally:
        return None
    raw = getattr(reader, "raw", reader)
    return raw if isinstance(raw, Rereadable) else None


def _size_of(source: Rereadable, recorded: int) -> int:
    """The size of the local file ``source`` (its bytes may be a pending version of another
    size than the record's), else ``recorded``."""
    fileno = getattr(source, "fileno", None)
    if callable(fileno):
        with contextlib.suppress(OSError, ValueError):
            return os.fstat(fileno()).st_size
    return recorded


def held_in_memory(src: Committer, dst: Committer, rec: Record) -> int:
    """Bytes a copy of ``rec`` from ``src`` to ``dst`` holds in memory at most, beyond its read
    buffer: an object store's sink holds a file artifact up to its ``whole_max`` until it sends
    it whole, unless it sends it from the source file (a local source, a store that takes
    ``reread_from``). Sinks that stage on disk (local folders, SMB, bridges) and folder
    artifacts (staged in a local folder) hold nothing."""
    if rec.kind != "file":
        return 0
    return dst.backend.sink_memory(
        rec.size, source_rereads=src.backend.capabilities.rereads_locally
    )


def copy_artifact(
    src: Committer,
    dst: Committer,
    name: str,
    *,
    publish_slots: threading.Semaphore | None = None,
    guard: Callable[[], None] | None = None,
    keep_unrecorded: bool = False,
) -> Record:
    """Copy committed ``name`` from ``src`` to ``dst`` (replacing what ``dst`` has under it).

    ``keep_unrecorded`` (a mirror's copies: ``sync``, replication): what ``dst`` holds at the
    name is replaced only where ``dst``'s own records name it (:func:`check_replaceable`); an
    unrecorded file or folder there (another tool's) is refused with AlreadyExistsError and
    left untouched, checked before anything is read and again under the publish lock.

    ``publish_slots``: held while publishing (not while reading and staging), so a caller running
    more copies than slots stages the next artifact while others publish.
    ``guard``: called under ``dst``'s publish lock just before anything is published there; if
    it raises, nothing is published (``restore`` uses it to refuse a primary that changed).

    Raises:
        NotFoundError: not committed on ``src``.
        IntegrityError: ``src``'s bytes (or record) are bad (nothing published on ``dst``).
        AlreadyExistsError: ``keep_unrecorded`` and an unrecorded file or folder is at the
            name on ``dst`` (nothing published there).
        InsufficientSpaceError, CommitError, BackendUnavailableError: from ``dst``.
    """
    parts = validate_name(name)
    for attempt in range(REREADS + 1):
        stored = record_of(src.backend, src.url, name)
        checked = guard
        if keep_unrecorded and not check_replaceable(dst, parts, stored.record):
            # again under the publish lock, where this copy's own pending record now stands
            def checked(version: Record = stored.record) -> None:
                check_replaceable(dst, parts, version, pending=False)
                if guard is not None:
                    guard()

        dst.check_free(parts, stored.record.size)

        try:
            with contextlib.ExitStack() as keep:  # a source the sink reads again stays open
                return _copy(src, dst, name, stored, keep=keep, slots=publish_slots, guard=checked)
        except (SourceMismatch, NotFoundError):
            if attempt == REREADS or not _source_moved(src, stored):
                raise
        time.sleep(REREAD_DELAY * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


def check_replaceable(
    dst: Committer, parts: Parts, version: Record, *, pending: bool = True
) -> bool:
    """Raise AlreadyExistsError when what ``dst`` holds at ``parts`` is no artifact of its own:
    data (a file, or a folder with anything in it) without a record, without a pending record
    (a commit of the name that stopped before its record step: an interrupted copy, which the
    copy completes; not looked for unless ``pending``), and not exactly ``version`` (a copy
    whose record step was lost: the same bytes, adopted by the copy). Nothing there, or a
    record there (whole or damaged: the mirror's own version), may be replaced. A mirror never
    replaces another tool's file. Returns True when a pending record is what allowed it."""
    backend = dst.backend
    if backend.stat(parts) is None or _has_record(dst, parts):
        return False
    if pending and (read_intent(backend, parts) is not None or read_slots(backend, parts)):
        return True
    if check_exact(backend, version, "full").status == "ok":
        return False
    name = "/".join(parts)
    raise AlreadyExistsError(
        f"{name} on {dst.url} holds data without a record (another tool's file or folder, or "
        "a copy of another version whose record was lost); a mirror never replaces it, so it "
        "was not copied and nothing there was changed. Move it away (or adopt it there) and "
        "sync again",
        name=name,
    )


def _has_record(dst: Committer, parts: Parts) -> bool:
    """Whether ``dst`` has a record of ``parts``: a readable one (also the old record a stopped
    move-aside replace left under its aside name), or a damaged one (unreadable: the name's
    record is still ``dst``'s own, which a repair replaces)."""
    try:
        return read_record(dst.backend, parts) is not None
    except RecordFormatError:
        return True


def _source_moved(src: Committer, stored: StoredRecord) -> bool:
    """Whether ``src`` committed (or is committing) another version of the artifact since
    ``stored`` was read: its record changed (or is gone), or a pending record of a different
    version is there (a commit between its data and record steps). Only then is a copy whose
    bytes did not match ``stored`` read again, record and data together."""
    parts = validate_name(stored.record.name)
    try:
        now = read_record(src.backend, parts)
    except RecordFormatError:
        return True
    if now is None or now.raw != stored.raw:
        return True
    return pending_version(src.backend, stored.record) is not None


def _copy(
    src: Committer,
    dst: Committer,
    name: str,
    stored: StoredRecord,
    *,
    keep: contextlib.ExitStack,
    slots: threading.Semaphore | None,
    guard: Callable[[], None] | None,
) -> Record:
    """One copy of ``name``, whose record on ``src`` is ``stored``. The version copied is the
    one the source's bytes are, resolved as every reader resolves them: the record, or a pending
    version (a commit stopped after its data step; ``_verify.served_version`` for a file, whose
    bytes are hashed on the way, ``_verify.locate`` for a folder whose files do not match the
    record). The target gets that version's record bytes, as its record."""
    parts, rec = validate_name(name), stored.record
    held = slots if slots is not None else contextlib.nullcontext()
    if rec.kind != "file":
        dsink, version = _stage_dir(src, dst, parts, rec)
        with aborting(dsink):
            body = stored_version(src.backend, stored, version).raw

        def changed(files: list[tuple[str, int, str]]) -> Record:
            del files  # a copy publishes the version it read, or nothing
            raise IntegrityError(f"{name}: folder changed while copied", name=name)

        return dst.publish_dir(
            parts,
            PutMode.REPLACE,
            dsink,
            version,
            changed,
            body=body,
            options=Options(guard=guard, slots=held),
        )

    def fill(sink: FileSink) -> tuple[int, str]:
        with contextlib.ExitStack() as reading:
            f = reading.enter_context(src.backend.open_read(parts))
            source = _rereadable(src, f)
            if source is not None and sink.reread_from(source, _size_of(source, rec.size)):
                keep.push(reading.pop_all())  # the sink reads it again until it is done
            # A local file is read straight into the copy's buffer (not through the reader's
            # own, which is then never filled).
            reader = cast(BinaryIO, source) if source is not None else f
            return copy_hashed(reader, sink.write, chunk_size=COPY_CHUNK)

    def version_of(size: int, digest: str) -> Record:
        try:
            return served_version(src.backend, rec, "full", size=size, digest=digest)
        except IntegrityError:
            _check_source(src, rec, "", (size, digest), (rec.size, rec.digest))
            raise

    def body_of(version: Record) -> bytes:
        return stored_version(src.backend, stored, version).raw

    return dst.write_file(
        parts,
        PutMode.REPLACE,
        fill,
        version_of,
        body=body_of,
        options=Options(guard=guard, slots=held),
    )


def _stage_dir(src: Committer, dst: Committer, parts: Parts, rec: Record) -> tuple[DirSink, Record]:
    """Stage folder artifact ``rec`` of ``src`` on ``dst``, every file checked on the way; when
    the files are not ``rec``'s, the version they are (``_verify.locate``: a pending version,
    under the name or in an object store's staged copy) is staged instead. Returns the sink
    and the version staged.

    Raises:
        SourceMismatch, NotFoundError: the files are no version of the name (nothing staged).
    """
    version, where = rec, parts
    tried = []
    while True:
        dsink = dst.open_dir(parts, PutMode.REPLACE)
        with aborting(dsink):
            try:
                _fill_dir(src, dsink, version, where)
                return dsink, version
            except (SourceMismatch, NotFoundError):
                # each place once: a replace going on deletes its staged copy once the final
                # keys hold that version (``_read._get_version`` reads the same way)
                tried.append((version, where))
                if len(tried) == PLACES:
                    raise  # overwritten again and again: the copy's retries decide
                result, version, where = locate(src.backend, rec, "full")
                if result.status != "ok" or (version, where) in tried or version.kind != "dir":
                    raise
            dsink.abort()


def _fill_dir(src: Committer, dsink: DirSink, rec: Record, root: Parts) -> None:
    """Copy the files of folder version ``rec``, stored below ``root`` on ``src``, into the
    staging folder of ``dsink``, each checked against ``rec`` (SourceMismatch); ``root`` must
    be a folder holding exactly the recorded files (``_verify.folder_files``, as ``verify``
    checks it: an empty folder artifact whose folder is gone, or a file in its place, is no
    copy of it, and a folder replace stopped among its copies, its new files beside the old
    ones, is the new version in its staged copy, not the old one)."""
    problem = folder_files(src.backend, root, rec)
    if isinstance(problem, VerifyResult):
        raise SourceMismatch(
            f"{'/'.join(root)} on {src.url}: {problem.detail}; not copied",
            name=rec.name,
            status=problem.status,
        )
    for entry in rec.files:
        out = dsink.local_path.joinpath(*entry.path.split("/"))
        with src.backend.open_read((*root, *entry.path.split("/"))) as f:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                with open(out, "wb") as o:
                    size, digest = copy_hashed(f, o.write, chunk_size=COPY_CHUNK)
            except CommitStoreError:
                raise  # the source's read, typed already
            except OSError as exc:  # the staging folder's disk: typed as its commits type it
                raise local_error(exc, "writing the folder copy's file", str(out)) from exc
        _check_source(src, rec, entry.path, (size, digest), (entry.size, entry.digest))


def copy_with_retries(
    src: Committer,
    dst: Committer,
    name: str,
    *,
    publish_slots: threading.Semaphore | None = None,
    guard: Callable[[], None] | None = None,
    keep_unrecorded: bool = False,
) -> Record:
    """:func:`copy_artifact`, tried up to :data:`RETRIES` times while the error is
    ``retryable`` (a :class:`CommitStoreError` saying so); any other error is raised at once."""
    delay = RETRY_DELAY
    for attempt in range(1, RETRIES + 1):
        try:
            return copy_artifact(
                src,
                dst,
                name,
                publish_slots=publish_slots,
                guard=guard,
                keep_unrecorded=keep_unrecorded,
            )
        except Exception as exc:
            if attempt == RETRIES or not (isinstance(exc, CommitStoreError) and exc.retryable):
                raise
            if _timed_out_after_retries(dst, exc):
                raise
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def _timed_out_after_retries(dst: Committer, exc: BaseException) -> bool:
    """A request to an object-store mirror that timed out: its client already tried it as often
    as the store allows (each attempt bounded by the store's timeouts), so the copy is not tried
    again as a whole (an unanswering endpoint would otherwise cost every attempt of every
    request again, per copy)."""
    if not dst.backend.capabilities.client_retries:
        return False
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, TimeoutError) or "Timeout" in type(cause).__name__:
            return True
        cause = cause.__cause__ or cause.__context__
    return False
