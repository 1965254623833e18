"""Writes through the one commit path: a staged file (:class:`Stage`) and a staged folder.

Both validate name, step and metadata before any I/O (``check_new``), hash every byte on its way
to the sink, and publish through ``Committer.commit`` with the new record as the pending record
(the versioned commit: old or new, never neither). ``after`` runs once the artifact is committed
(replication, automatic retention); it never turns a commit into a failure.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from commitstore._commit import Committer, check_flag, check_new, make_record, mode_of
from commitstore._stagefile import Stage
from commitstore.backends import CommitInfo, FileSink, PutMode, hash_and_sync_tree
from commitstore.digest import copy_chunks, manifest_digest
from commitstore.errors import (
    CommitError,
    CommitStoreError,
    ConfigurationError,
    NotFoundError,
    StorageError,
)
from commitstore.records import FileRecord, Record

if TYPE_CHECKING:
    from typing_extensions import Buffer

After = Callable[[Record], None]
StageFn = Callable[..., Stage]
"""``CommitStore.stage``: the puts go through it, so replication and retention follow."""


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
    parts, step, meta = check_new(name, step, metadata)
    check_flag(alias, "alias")
    mode = mode_of(overwrite)
    started = time.monotonic()
    sink = committer.open_file(parts, mode)

    def finish(s: FileSink, size: int, digest: str) -> Record:
        record = make_record(name, step, meta, size=size, digest=digest, alias=alias)

        def publish_data() -> tuple[Record, CommitInfo]:
            return record, s.publish(size=size, digest=digest)

        return committer.commit(parts, mode, publish_data, intent=record, started=started)

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
    try:
        yield sink.local_path
    except BaseException:
        sink.abort()
        raise

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

    try:
        # Hashed once before anything is published, so the record is known first (the
        # commit's pending record); the sink hashes again as it publishes.
        intent = dir_record(hash_and_sync_tree(sink.local_path))

        def publish_data() -> tuple[Record, CommitInfo]:
            info = sink.publish()
            same = sorted(info.files) == sorted((f.path, f.size, f.digest) for f in intent.files)
            return (intent if same else dir_record(info.files)), info

        record = committer.commit(parts, mode, publish_data, intent=intent, started=started)
    except BaseException:
        sink.abort()
        raise
    after(record)


def put_bytes(
    committer: Committer, stage: StageFn, name: str, data: Buffer, kw: dict[str, Any]
) -> Record:
    """Commit ``data`` as ``name`` through ``stage``, after checking the free space."""
    parts, _, _ = check_new(name, kw.get("step"), kw.get("metadata"))
    try:
        size = memoryview(data).nbytes
    except TypeError:
        hint = " (encode text first: data.encode())" if isinstance(data, str) else ""
        raise ConfigurationError(
            f"{name}: data must be bytes-like, not {type(data).__name__}{hint}"
        ) from None
    committer.check_free(parts, size)
    with stage(name, **kw) as st:
        st.write(data)
    assert st.record is not None
    return st.record


def put_file(
    committer: Committer,
    stage: StageFn,
    name: str,
    local_path: str | os.PathLike[str],
    kw: dict[str, Any],
    *,
    progress: Callable[[int], None] | None,
) -> Record:
    """Commit a local file as ``name``, streamed with constant memory; the source must keep its
    size while it is copied (CommitError otherwise: nothing published)."""
    parts, _, _ = check_new(name, kw.get("step"), kw.get("metadata"))
    src = open_source(local_path)
    with src:
        size = os.fstat(src.fileno()).st_size
        committer.check_free(parts, size)
        with stage(name, **kw) as st:
            st.offer_source(PreadSource(src.fileno(), os.fspath(local_path)), size)
            copy_chunks(src, st.write, progress=progress)
            if st.tell() != size:
                raise CommitError(f"{local_path}: changed size while it was copied")
    assert st.record is not None
    return st.record


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
