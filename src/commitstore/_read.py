"""Reads that never hand out a byte of an artifact failing its check."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from commitstore._check import read_record
from commitstore.backends.base import PutMode
from commitstore.backends.rename.posix import LocalBackend
from commitstore.digest import copy_hashed, digest_bytes, hash_stream, read_chunks
from commitstore.errors import (
    InsufficientSpaceError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
)
from commitstore.layout import validate_name
from commitstore.records import Record, RecordFormatError

if TYPE_CHECKING:
    from commitstore._reads import Reads as CommitStore

VerifiedFile = BinaryIO
"""What :meth:`CommitStore.open` returns: a readable, seekable binary file."""

ATTEMPTS = 3
"""A check that fails while the record is being replaced (``overwrite=True``) is retried; the
last attempt reads under the publish lock, so a reader that keeps losing the race to a busy writer
still gets old or new bytes (where the storage has a lock: local disks, bridges, ``memory://``)."""


def _attempt(store: CommitStore, attempt: int) -> contextlib.AbstractContextManager[None]:
    if attempt + 1 < ATTEMPTS:
        return contextlib.nullcontext()
    return store.backend.publish_lock()


class _Writer(Protocol):
    def write(self, b: memoryview, /) -> int | None: ...


def copy_stream(src: BinaryIO, dst: _Writer, progress: Callable[[int], None] | None) -> int:
    """Copy ``src`` to ``dst`` in constant memory; report the running byte count."""
    total = 0
    for chunk in read_chunks(src):
        dst.write(chunk)
        total += chunk.nbytes
        if progress is not None:
            progress(total)
    return total


def _mismatch(rec: Record, status: str, size: int, digest: str | None) -> IntegrityError:
    if status == "size_mismatch":
        msg = f"{rec.name}: expected {rec.size} bytes, found {size}"
    else:
        msg = f"{rec.name}: expected {rec.digest}, found {digest}"
    return IntegrityError(
        msg,
        name=rec.name,
        status=status,
        expected_size=rec.size,
        actual_size=size,
        expected_digest=rec.digest,
        actual_digest=digest,
    )


def _compare(rec: Record, level: str, size: int, digest: str | None) -> IntegrityError | None:
    if level == "none":
        return None
    if size != rec.size:
        return _mismatch(rec, "size_mismatch", size, digest)
    if level == "full" and digest != rec.digest:
        return _mismatch(rec, "hash_mismatch", size, digest)
    return None


def _file_record(store: CommitStore, name: str) -> Record:
    rec = store.record(name)
    if rec.kind == "dir":
        raise InvalidNameError(f"{name} is a folder artifact: use get_file() or stage_dir()")
    return rec


def _record_changed(store: CommitStore, rec: Record) -> bool:
    """After a failed check: wait out any publish in flight, then see if the record moved on."""
    with store.backend.publish_lock():
        pass
    try:
        return read_record(store.backend, tuple(rec.name.split("/"))) != rec
    except RecordFormatError:
        return False


def _open_data(store: CommitStore, rec: Record) -> BinaryIO:
    try:
        return store.backend.open_read(validate_name(rec.name))
    except NotFoundError as exc:
        raise IntegrityError(
            f"{rec.name}: recorded, but its data is missing", name=rec.name, status="missing"
        ) from exc


def open_verified(store: CommitStore, name: str, level: str) -> VerifiedFile:
    """Open, check at ``level`` (reading the file once for ``"full"``), rewind and return."""
    for attempt in range(ATTEMPTS):
        with _attempt(store, attempt):
            rec = _file_record(store, name)
            f = _open_data(store, rec)
            try:
                if level == "full":
                    size, digest = hash_stream(f)
                else:
                    size, digest = f.seek(0, os.SEEK_END), None
                problem = _compare(rec, level, size, digest)
            except BaseException:
                f.close()
                raise
        if problem is None:
            f.seek(0)
            return f
        f.close()
        if attempt + 1 == ATTEMPTS or not _record_changed(store, rec):
            raise problem
    raise AssertionError("unreachable")  # pragma: no cover


def read_verified(store: CommitStore, name: str, level: str) -> bytes:
    """Read all bytes once, check them, return them."""
    for attempt in range(ATTEMPTS):
        with _attempt(store, attempt):
            rec = _file_record(store, name)
            with _open_data(store, rec) as f:
                data = f.read()
        problem = _compare(rec, level, len(data), digest_bytes(data) if level == "full" else None)
        if problem is None:
            return data
        if attempt + 1 == ATTEMPTS or not _record_changed(store, rec):
            raise problem
    raise AssertionError("unreachable")  # pragma: no cover


def get_verified(
    store: CommitStore,
    name: str,
    dest: Path,
    level: str,
    progress: Callable[[int], None] | None,
) -> None:
    """Stream ``name`` into ``dest`` through the local commit protocol, checking on the way."""
    rec = store.record(name)
    target = LocalBackend(dest.parent.resolve(), reason="get_file destination")
    free = target.free_space(())
    if free is not None and free < rec.size:
        raise InsufficientSpaceError(
            f"{dest}: {rec.size} bytes needed, {free} available",
            path=str(dest),
            needed=rec.size,
            available=free,
        )
    if rec.kind == "file":
        sink = target.open_sink((dest.name,), mode=PutMode.REPLACE)
        try:
            with _open_data(store, rec) as src:
                size, digest = copy_hashed(src, sink.write, progress=progress)
            problem = _compare(rec, level, size, digest)
            if problem is not None:
                raise problem
            sink.publish(size=size, digest=digest)
        except BaseException:
            sink.abort()
            raise
        return
    dsink = target.open_dir_sink((dest.name,), mode=PutMode.REPLACE)
    try:
        parts = validate_name(rec.name)
        done = 0
        for entry in rec.files:
            out = dsink.local_path.joinpath(*entry.path.split("/"))
            out.parent.mkdir(parents=True, exist_ok=True)
            with (
                store.backend.open_read((*parts, *entry.path.split("/"))) as src,
                out.open("wb") as dst,
            ):
                size, digest = copy_hashed(src, dst.write, progress=progress, start=done)
            done += size
            expected = Record(entry.path, None, entry.size, entry.digest)
            problem = _compare(expected, level, size, digest)
            if problem is not None:
                raise IntegrityError(f"{rec.name}/{problem}", name=rec.name, status=problem.status)
        dsink.publish()
    except BaseException:
        dsink.abort()
        raise
