"""Reads that never hand out a byte of an artifact failing its check."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from commitstore._destination import check_destination, local_destination, placed
from commitstore._scan import read_record
from commitstore._sinkwrite import aborting, write_sink
from commitstore._verify import (
    PLACES,
    compare,
    folder_files,
    folder_problem,
    locate,
    pending_versions,
    record_of,
    same_shape,
    served_version,
)
from commitstore.backends import Backend, FileSink, PutMode, local_folder
from commitstore.digest import copy_hashed, digest_bytes, hash_stream
from commitstore.errors import (
    BackendUnavailableError,
    CommitStoreError,
    ConfigurationError,
    InsufficientSpaceError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
)
from commitstore.layout import aside_parts, validate_name
from commitstore.records import Record, RecordFormatError, VerifyResult

VerifiedFile = BinaryIO
"""What :meth:`CommitStore.open` returns: a readable, seekable binary file."""

log = logging.getLogger("commitstore")

ATTEMPTS = 3
"""A check that fails while the record is being replaced (``overwrite=True``) is retried; the
last attempt reads under the publish lock, so a reader that keeps losing the race to a busy writer
still gets old or new bytes (where the storage has a lock: local disks, bridges, ``memory://``).

A failed check waits for the publish lock only when a publish of that name may be in flight
(:func:`_retry`): a mismatch against a record that is still the name's record, with no pending
record of the name, is the answer at once, whoever holds the lock (a writer of another name
stopped inside its publish never delays it). Where the lock is not free within the store's
``lock_timeout``, the record as read again decides: unchanged, the IntegrityError; moved on (only
on the last attempt), the lock's BackendUnavailableError, since the name is being replaced."""


@contextlib.contextmanager
def _attempt(backend: Backend, attempt: int) -> Iterator[BackendUnavailableError | None]:
    """The hold of one attempt: nothing before the last; the last takes the publish lock
    (``Backend.read_lock``) to wait out a publish in flight. Yields None, or the
    BackendUnavailableError of a lock not free within ``lock_timeout``: the attempt then runs
    without it (a check that passes is an answer with or without the lock)."""
    if attempt + 1 < ATTEMPTS:
        yield None
        return
    with contextlib.ExitStack() as held:
        unheld = _take(held, backend)
        yield unheld


def _take(held: contextlib.ExitStack, backend: Backend) -> BackendUnavailableError | None:
    """Enter ``backend.read_lock()`` on ``held``; the BackendUnavailableError if it was not
    free within ``lock_timeout`` (or the storage is unreachable: the reads that follow raise
    that again), else None."""
    try:
        held.enter_context(backend.read_lock())
    except BackendUnavailableError as exc:
        log.debug("checking without the publish lock: %s", exc)
        return exc
    return None


def _file_record(backend: Backend, url: str, name: str) -> Record:
    rec = record_of(backend, url, name).record
    if rec.kind == "dir":
        raise ConfigurationError(f"{name} is a folder artifact: use get_file() or stage_dir()")
    return rec


def _moved(backend: Backend, rec: Record) -> bool:
    """True if the name's record, read again now (no lock), is no longer ``rec`` (another
    version, or none). An unreadable record counts as unchanged: the mismatch stands."""
    try:
        found = read_record(backend, tuple(rec.name.split("/")))
    except RecordFormatError:
        return False
    return found is None or found.record != rec


def _record_changed(backend: Backend, rec: Record) -> bool:
    """After a failed check against ``rec`` (not the last attempt): True if the check is worth
    repeating because the name is being replaced. The record and the pending records are read
    again without the lock. The record moved on: True. Unchanged with no pending record of the
    name: False at once (a commit publishes its pending record before its data and removes it
    only after its record, so bytes that match neither were not left by a publish in flight;
    the lock, which a writer of another name may hold for long, is never waited for). Unchanged
    while a pending record is there (a commit of the name may be publishing, or one stopped
    after writing it): the publish lock is waited for, within ``lock_timeout``, then the record
    read again decides, whether the lock was taken or not."""
    if _moved(backend, rec):
        return True
    if not pending_versions(backend, rec):
        return False
    with contextlib.ExitStack() as held:
        _take(held, backend)
    return _moved(backend, rec)


def _retry(
    backend: Backend,
    rec: Record,
    attempt: int,
    unheld: BackendUnavailableError | None,
    problem: IntegrityError,
) -> None:
    """After attempt ``attempt`` failed its check against ``rec`` with ``problem``: return to
    try again (:func:`_record_changed`), or raise. The last attempt raises ``problem``, except
    when it ran without the lock (``unheld``: not free within ``lock_timeout``) and the record
    moved on meanwhile: then the name is being replaced by a publish that does not end, and
    ``unheld`` is raised (BackendUnavailableError), never an IntegrityError for bytes that may
    be a replace's."""
    if attempt + 1 < ATTEMPTS:
        if _record_changed(backend, rec):
            return
        raise problem
    if unheld is not None and _moved(backend, rec):
        raise unheld from problem
    raise problem


def _served(
    backend: Backend,
    rec: Record,
    level: str,
    size: int,
    digest: str | None,
    *,
    rehash: Callable[[], str] | None = None,
) -> Record | IntegrityError:
    """The version the bytes read (``size``, ``digest``) are: ``rec``, or the pending version
    of a commit whose record was not written yet (``_commit``), the new version of the name
    (``_verify.served_version``, the one resolution); else the IntegrityError."""
    try:
        return served_version(backend, rec, level, size=size, digest=digest, rehash=rehash)
    except IntegrityError as exc:
        return exc


def _open_data(backend: Backend, rec: Record) -> BinaryIO:
    """Open the data of file artifact ``rec``. Never blocks and never follows a link: a symlink
    or special file there is an IntegrityError. The name missing, its aside entry (the old
    version, left by a move-aside replace that stopped between its two moves:
    ``backends/rename/aside.py``) is opened instead; the caller checks those bytes against
    the record (and the pending record) as it checks any."""
    parts = validate_name(rec.name)
    try:
        return _open_parts(backend, rec.name, parts)
    except IntegrityError as exc:
        if exc.status != "missing" or not backend.capabilities.staging_names:
            raise
        missing = exc
    try:
        return backend.open_read(aside_parts(parts))
    except CommitStoreError:
        raise missing from missing.__cause__


def _open_parts(backend: Backend, name: str, parts: tuple[str, ...]) -> BinaryIO:
    """Open ``parts``, stored data of artifact ``name`` (as :func:`_open_data`)."""
    shown = "/".join(parts)
    try:
        return backend.open_read(parts)
    except NotFoundError as exc:
        raise IntegrityError(
            f"{shown}: recorded, but its data is missing", name=name, status="missing"
        ) from exc
    except (IntegrityError, InvalidNameError) as exc:
        raise IntegrityError(
            f"{shown}: not a regular file ({exc})", name=name, status="size_mismatch"
        ) from exc


def _rehash(f: BinaryIO) -> str:
    """The digest of all of ``f`` (a size-level read that sizes cannot settle)."""
    f.seek(0)
    return hash_stream(f)[1]


def open_verified(backend: Backend, url: str, name: str, level: str) -> VerifiedFile:
    """Open, check at ``level`` (reading the file once for ``"full"``), rewind and return."""
    for attempt in range(ATTEMPTS):
        with _attempt(backend, attempt) as unheld:
            rec = _file_record(backend, url, name)
            f = _open_data(backend, rec)
            try:
                if level == "full":
                    size, digest = hash_stream(f)
                else:
                    size, digest = f.seek(0, os.SEEK_END), None
                served = _served(
                    backend, rec, level, size, digest, rehash=functools.partial(_rehash, f)
                )
            except BaseException:
                f.close()
                raise
        if isinstance(served, Record):
            f.seek(0)
            return f
        f.close()
        _retry(backend, rec, attempt, unheld, served)
    raise AssertionError("unreachable")  # pragma: no cover


def read_verified(backend: Backend, url: str, name: str, level: str) -> bytes:
    """Read all bytes once, check them, return them."""
    return read_with_record(backend, url, name, level)[0]


def read_with_record(backend: Backend, url: str, name: str, level: str) -> tuple[bytes, Record]:
    """:func:`read_verified`, and the record of the version the bytes are: the name's record,
    or the pending version they match (a commit stopped after its data step), with its step
    and metadata."""
    for attempt in range(ATTEMPTS):
        with _attempt(backend, attempt) as unheld:
            rec = _file_record(backend, url, name)
            with _open_data(backend, rec) as f:
                data = f.read()
        digest = digest_bytes(data) if level == "full" else None
        rehash = functools.partial(digest_bytes, data)
        served = _served(backend, rec, level, len(data), digest, rehash=rehash)
        if isinstance(served, Record):
            return data, served
        _retry(backend, rec, attempt, unheld, served)
    raise AssertionError("unreachable")  # pragma: no cover


def get_verified(
    backend: Backend,
    url: str,
    name: str,
    *,
    dest: Path,
    level: str,
    progress: Callable[[int], None] | None,
) -> None:
    """Stream ``name`` into ``dest`` (placed per :func:`local_destination`) through the local
    commit protocol, checking on the way: nothing appears at the destination unless every byte
    matched the record. The record and the data are read together, again, when a check fails
    because the name was overwritten meanwhile; the last attempt reads under the publish lock,
    so a commit racing the copy never makes it fail where the storage has a lock (local
    disks, bridges, ``memory://``). A ``dest`` inside the store's own folder is refused first
    (:func:`check_destination`, NameConflictError)."""
    check_destination(backend, dest, name)
    rec = record_of(backend, url, name).record
    for attempt in range(ATTEMPTS):
        with _attempt(backend, attempt) as unheld:
            if attempt:
                rec = record_of(backend, url, name).record
            try:
                _get_version(backend, rec, dest, level=level, progress=progress)
                return
            except IntegrityError as exc:
                problem = exc
                if rec.kind == "file" and _get_folder_over(backend, rec, dest, level, progress):
                    return
        _retry(backend, rec, attempt, unheld, problem)
    raise AssertionError("unreachable")  # pragma: no cover


def _get_folder_over(
    backend: Backend,
    rec: Record,
    dest: Path,
    level: str,
    progress: Callable[[int], None] | None,
) -> bool:
    """File artifact ``rec`` does not verify: if a folder replacing it does (an object-store
    replace deletes the old file's object before it copies the folder's files in, and the
    staged copy is whole: ``backends/object/dirsink``), copy that folder to ``dest``; True
    then. False if nothing verifies as such a folder."""
    result, version, where = locate(backend, rec, level)
    if result.status != "ok" or version.kind != "dir":
        return False
    dest = local_destination(dest, version.name, "dir")
    target = local_folder(dest.parent, reason="get_file destination")
    _get_dir(backend, target, dest, version, where, level=level, progress=progress)
    return True


def _get_version(
    backend: Backend,
    rec: Record,
    dest: Path,
    *,
    level: str,
    progress: Callable[[int], None] | None,
) -> None:
    """One attempt of :func:`get_verified`: artifact ``rec`` into its local destination.

    Raises:
        IntegrityError: the bytes read are not ``rec``'s (nothing published locally).
    """
    dest, there = placed(dest, rec.name, rec.kind)
    target = local_folder(dest.parent, reason="get_file destination")
    free = target.free_space(())
    if free is not None and free < rec.size:
        raise InsufficientSpaceError(
            f"{dest}: {rec.size} bytes needed, {free} available",
            path=str(dest),
            needed=rec.size,
            available=free,
        )
    if rec.kind == "file":
        # over a file only where one was when placed (a folder or FIFO that appears meanwhile
        # where nothing was is never replaced: create-only, AlreadyExistsError)
        mode = PutMode.REPLACE if there else PutMode.CREATE

        def fill(sink: FileSink) -> tuple[int, str]:
            with _open_data(backend, rec) as src:
                return copy_hashed(src, sink.write, progress=progress)

        def check(size: int, digest: str) -> bool:
            served = _served(backend, rec, level, size, digest)
            if isinstance(served, IntegrityError):
                raise served
            return True

        write_sink(target, (dest.name,), mode, fill, check=check)
        return
    if level == "size" and any(same_shape(p, rec) for p in pending_versions(backend, rec)):
        level = "full"  # sizes cannot tell the versions apart: a stopped copy is a mix of both
    version, where = rec, validate_name(rec.name)
    tried = []
    while True:
        try:
            _get_dir(backend, target, dest, version, where, level=level, progress=progress)
            return
        except IntegrityError:
            # Not that version there: a commit in flight or interrupted may have left the new
            # one, under the name or (an object-store folder replace) in its staged copy; a
            # replace going on may have moved it from one to the other meanwhile (its staged
            # copy is deleted once the final keys hold it): each place is tried once.
            tried.append((version, where))
            if len(tried) == PLACES:
                raise  # a name overwritten again and again: the caller's attempts decide
            result, version, where = locate(backend, rec, level)
            if result.status != "ok" or (version, where) in tried:
                raise


def _get_dir(
    backend: Backend,
    target: Backend,
    dest: Path,
    rec: Record,
    root: tuple[str, ...],
    *,
    level: str,
    progress: Callable[[int], None] | None,
) -> None:
    """Copy folder artifact ``rec``, whose files are below ``root``, into ``dest``; every file
    checked against ``rec`` on the way (and first the folder's file set, exactly the recorded
    files: ``_verify.folder_files``, as ``verify`` checks it; at ``"none"`` only that a folder
    is there), and nothing published at ``dest`` unless all pass.
    Create-only: ``dest`` was free (:func:`local_destination`); if anything appeared there
    meanwhile, AlreadyExistsError and it stays."""
    # "none" opts out of the checks: the recorded files, as they are (the folder must be one)
    problem = (
        folder_problem(backend, root, rec) if level == "none" else folder_files(backend, root, rec)
    )
    if isinstance(problem, VerifyResult):
        raise IntegrityError(
            f"{'/'.join(root)}: {problem.detail}", name=rec.name, status=problem.status
        )
    dsink = target.open_dir_sink((dest.name,), mode=PutMode.CREATE)
    with aborting(dsink):
        done = 0
        for entry in rec.files:
            out = dsink.local_path.joinpath(*entry.path.split("/"))
            out.parent.mkdir(parents=True, exist_ok=True)
            fparts = (*root, *entry.path.split("/"))
            with _open_parts(backend, rec.name, fparts) as src, out.open("wb") as dst:
                size, digest = copy_hashed(src, dst.write, progress=progress, start=done)
            done += size
            found = compare(
                entry.size, entry.digest, found_size=size, found_digest=digest, level=level
            )
            if found is not None:
                raise found.error(rec.name, entry.path)
        dsink.publish()
