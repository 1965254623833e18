"""Writes through the one commit path: a staged file (:class:`Stage`), a put and a staged folder.

Each validates name, step and metadata before any I/O (``check_new``), hashes every byte on its
way to the sink, and says only how its bytes are produced: the lifecycle after that (abort on any
failure, the new record as the pending record, data, record: the versioned commit, old or new,
never neither) is ``Committer.publish_file``, ``write_file`` or ``publish_dir`` (``_filecommit``).
``after`` runs once the artifact is committed (replication, automatic retention); it never turns
a commit into a failure.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from commitstore._commit import Committer, check_flag, check_new, make_record, mode_of
from commitstore._filecommit import Options, Version
from commitstore._sinkwrite import HashedWriter, aborting, write_bytes
from commitstore._stagefile import Stage
from commitstore.backends import FileSink, PutMode, hash_and_sync_tree
from commitstore.digest import copy_chunks, manifest_digest
from commitstore.errors import (
    CommitError,
    CommitStoreError,
    ConfigurationError,
    NotFoundError,
    StorageError,
)
from commitstore.layout import Parts
from commitstore.records import FileRecord, Record

if TYPE_CHECKING:
    from typing_extensions import Buffer

After = Callable[[Record], None]
"""Run once an artifact is committed (replication, automatic retention)."""


def open_stage(
    committer: Committer,
    name: str,
    *,
    step: int | None,
    metadata: Mapping[str, Any] | None,
    overwrite: bool,
    alias: bool,
    after: After,
) -> Stage:
    """A :class:`Stage` of ``name`` (see ``CommitStore.stage``)."""
    opts = _PutOptions(step=step, metadata=metadata, overwrite=overwrite, alias=alias)
    parts, mode, version = _check_put(name, opts)
    started = time.monotonic()
    sink = committer.open_file(parts, mode)

    def finish(s: FileSink, size: int, digest: str) -> Record:
        return committer.publish_file(
            parts, mode, s, (size, digest), version, options=Options(started=started)
        )

    def precheck() -> None:
        committer.check_place(parts)
        if mode is PutMode.CREATE:
            committer.check_absent(parts)

    return Stage(name, sink, finish, after=after, precheck=precheck)


@contextlib.contextmanager
def stage_dir(
    committer: Committer,
    name: str,
    *,
    step: int | None,
    metadata: Mapping[str, Any] | None,
    overwrite: bool,
    after: After,
) -> Iterator[Path]:
    """A local folder to fill, published whole on a clean exit (see ``CommitStore.stage_dir``)."""
    parts, step, meta = check_new(name, step, metadata)
    mode = mode_of(overwrite)
    started = time.monotonic()
    sink = committer.open_dir(parts, mode)
    with aborting(sink):
        yield sink.local_path

    def dir_record(files: list[tuple[str, int, str]]) -> Record:
        entries = tuple(FileRecord(p, size, d) for p, size, d in files)
        return make_record(
            name,
            step,
            meta,
            size=sum(f.size for f in entries),
            digest=manifest_digest(files),
            files=entries,
            kind="dir",
        )

    with aborting(sink):
        # Hashed once before anything is published, so the record is known first (the
        # commit's pending record); the sink hashes again as it publishes.
        intent = dir_record(hash_and_sync_tree(sink.local_path))
    record = committer.publish_dir(
        parts, mode, sink, intent, dir_record, options=Options(started=started)
    )
    after(record)


def put_bytes(
    committer: Committer, name: str, data: Buffer, kw: dict[str, Any], *, after: After
) -> Record:
    """Commit ``data`` as ``name`` (``kw``: ``CommitStore.stage``'s options), after checking the
    free space; ``after`` as :func:`open_stage`'s. Bad options and data: before any I/O."""
    parts, mode, version = _check_put(name, _PutOptions(**kw))
    try:
        size = memoryview(data).nbytes
    except TypeError:
        hint = " (encode text first: data.encode())" if isinstance(data, str) else ""
        raise ConfigurationError(
            f"{name}: data must be bytes-like, not {type(data).__name__}{hint}"
        ) from None
    committer.check_free(parts, size)
    record = committer.write_file(
        parts, mode, write_bytes(data), version, options=Options(started=time.monotonic())
    )
    after(record)
    return record


def put_file(
    committer: Committer,
    name: str,
    local_path: str | os.PathLike[str],
    kw: dict[str, Any],
    *,
    after: After,
    progress: Callable[[int], None] | None,
) -> Record:
    """Commit a local file as ``name``, streamed with constant memory; the source must keep its
    size while it is copied (CommitError otherwise: nothing published)."""
    parts, mode, version = _check_put(name, _PutOptions(**kw))
    src = open_source(local_path)
    with src:
        size = os.fstat(src.fileno()).st_size
        committer.check_free(parts, size)

        def fill(sink: FileSink) -> tuple[int, str]:
            writer = HashedWriter(sink)
            writer.offer(PreadSource(src.fileno(), os.fspath(local_path)), size)
            copy_chunks(src, writer.write, progress=progress)
            if writer.count != size:
                raise CommitError(f"{local_path}: changed size while it was copied")
            return writer.done(name)

        record = committer.write_file(
            parts, mode, fill, version, options=Options(started=time.monotonic())
        )
    after(record)
    return record


@dataclass(frozen=True, slots=True, kw_only=True)
class _PutOptions:
    """``CommitStore.stage``'s options (the puts take them as ``**kw``: any other name is a
    TypeError, as ``stage`` raises it)."""

    step: int | None = None
    """The record's step (None: inferred from the name)."""
    metadata: Mapping[str, Any] | None = None
    """The record's metadata."""
    overwrite: bool = False
    """Replace a committed version (``PutMode.REPLACE``)."""
    alias: bool = False
    """A moving name (``Record.alias``)."""


def _check_put(name: str, opts: _PutOptions) -> tuple[Parts, PutMode, Version]:
    """A write's name parts, mode and record maker, all checked before any I/O
    (InvalidNameError, ConfigurationError)."""
    parts, step, meta = check_new(name, opts.step, opts.metadata)
    check_flag(opts.alias, "alias")
    mode = mode_of(opts.overwrite)

    def version(size: int, digest: str) -> Record:
        return make_record(name, step, meta, size=size, digest=digest, alias=opts.alias)

    return parts, mode, version


class PreadSource:
    """The local file being put, read again by position (``Rereadable``): an S3 upload sends
    its parts from it, and resumes from its identity (``backends/object/resume.py``). The
    descriptor stays the caller's."""

    def __init__(self, fd: int, shown: str) -> None:
        self._fd, self._shown = fd, shown

    def fileno(self) -> int:
        return self._fd

    def pread(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer only at the end). Raises StorageError."""
        try:
            data = os.pread(self._fd, n, offset)
            while 0 < len(data) < n:  # a short read before the end: read on
                more = os.pread(self._fd, n - len(data), offset + len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            message = f"{self._shown}: cannot read: {exc.strerror}"
            raise StorageError(exc.errno or 0, message, path=self._shown) from exc
        return data


_SOURCE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def open_source(local_path: str | os.PathLike[str]) -> BinaryIO:
    """The local regular file ``local_path`` opened to read, never blocking: a FIFO, socket,
    device or folder is refused from a ``stat`` before it is opened, and the file is opened
    ``O_NONBLOCK`` and checked again with ``fstat`` (a FIFO swapped in between is refused, not
    waited on); it reads blocking again once it is known to be a regular file.

    Raises:
        ConfigurationError: a folder (commit one with ``stage_dir``), a FIFO, socket or device
            (nothing was opened, or it was closed).
        NotFoundError: nothing there. StorageError: it cannot be read (permissions...).
    """
    shown = os.fspath(local_path)
    try:
        mode = os.stat(local_path).st_mode
    except OSError as exc:
        raise _unreadable(exc, shown) from exc
    _require_regular(mode, shown)  # raised as it is: its message says it once
    try:
        fd = os.open(local_path, _SOURCE_FLAGS)
    except OSError as exc:
        raise _unreadable(exc, shown) from exc
    try:
        _require_regular(os.fstat(fd).st_mode, shown)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _unreadable(exc: OSError, shown: str) -> CommitStoreError:
    """The typed error of a failed ``stat`` or ``open`` of the local source ``shown``."""
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(f"{shown}: no such local file")
    return StorageError(exc.errno or 0, f"{shown}: cannot read: {exc.strerror}", path=shown)


def _require_regular(mode: int, shown: str) -> None:
    """Refuse a source that is not a regular file, before it is opened: a bad argument."""
    if stat.S_ISDIR(mode):
        raise ConfigurationError(
            f"{shown}: is a folder; put_file reads regular files only (commit a folder as one "
            "artifact with stage_dir, or the command line's put)"
        )
    if not stat.S_ISREG(mode):
        raise ConfigurationError(
            f"{shown}: not a regular file (a FIFO, socket or device); put_file reads regular "
            "files only"
        )
