"""A local folder a caller filled, made ready to publish: every file fsynced and hashed, every
folder fsynced. Used by every folder sink (each family stages folders locally first or in place)."""

from __future__ import annotations

import errno
import logging
import os
import stat as statmod
from pathlib import Path

from commitstore.backends.base import CommitInfo
from commitstore.digest import hash_stream
from commitstore.errors import (
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    InvalidNameError,
)
from commitstore.layout import validate_name

log = logging.getLogger("commitstore")


def close_quietly(fd: int) -> None:
    """Close a descriptor opened only to read, to fsync or to name a folder (a directory, the
    lock file, a file already fsynced): close(2) has no unflushed write of it to report, so an
    error there (EIO, ENOSPC from a network client) loses nothing. Linux releases the descriptor
    even then, so it is logged, never raised, and never closed twice. EBADF (a descriptor that
    was not open: a bug) still raises."""
    try:
        os.close(fd)
    except OSError as exc:
        if exc.errno == errno.EBADF:
            raise
        log.debug("closing descriptor %d: %s (ignored: nothing unflushed)", fd, exc)


def fsync_dir(
    fd: int,
    info: CommitInfo | None = None,
    tolerated: tuple[int, ...] = (errno.EINVAL, errno.ENOTSUP),
) -> None:
    """fsync a directory; a ``tolerated`` error marks durability unconfirmed in ``info``."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno in tolerated and info is not None:
            info.durable = False
            info.notes.append(f"directory fsync failed ({exc.strerror}): durability unconfirmed")
            return
        raise


def hash_fd(fd: int, *, uncached: bool) -> tuple[int, str]:
    """Hash an open file from its start; ``uncached`` drops its cached pages first."""
    if uncached:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", buffering=0, closefd=False) as f:
        return hash_stream(f)


def hash_and_sync_tree(
    top: Path,
    *,
    uncached: bool = False,
    tolerated: tuple[int, ...] = (errno.EINVAL, errno.ENOTSUP),
    info: CommitInfo | None = None,
) -> list[tuple[str, int, str]]:
    """:func:`_hash_and_sync_tree`, with every I/O error typed: ENOSPC/EDQUOT as
    InsufficientSpaceError, anything else as CommitError naming the file (nothing is published
    by then; callers hash before they publish)."""
    try:
        return _hash_and_sync_tree(top, uncached=uncached, tolerated=tolerated, info=info)
    except CommitStoreError:
        raise
    except OSError as exc:
        where = exc.filename or str(top)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientSpaceError(f"no space left while syncing {where}") from exc
        raise CommitError(f"syncing {where} failed: {exc.strerror or exc}") from exc


def _hash_and_sync_tree(
    top: Path,
    *,
    uncached: bool = False,
    tolerated: tuple[int, ...] = (errno.EINVAL, errno.ENOTSUP),
    info: CommitInfo | None = None,
) -> list[tuple[str, int, str]]:
    """fsync every file under ``top``, then hash it (past the page cache when ``uncached``);
    fsync every folder bottom-up (``tolerated`` errors mark ``info`` durability unconfirmed).
    Returns (path, size, digest), sorted by path.

    Raises CommitError, before anything is published, for what a record cannot hold: a symlink,
    FIFO, socket or device (opened ``O_NONBLOCK|O_NOFOLLOW`` and checked with ``fstat`` before
    any read, so nothing blocks), a path that breaks the artifact-name rules, or a folder that
    cannot be listed (never skipped: the record would miss its files).
    """
    files: list[tuple[str, int, str]] = []
    dirs: list[str] = []

    def failed(exc: OSError) -> None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientSpaceError(f"no space left while listing {exc.filename}") from exc
        raise CommitError(f"{exc.filename}: cannot be listed ({exc.strerror})") from exc

    for dirpath, dirnames, filenames in os.walk(top, onerror=failed):
        dirs.append(dirpath)
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                raise CommitError(f"{os.path.join(dirpath, d)}: symlinks are not stored")
            _storable(top, os.path.join(dirpath, d))
        for fname in filenames:
            full = os.path.join(dirpath, fname)
            rel = _storable(top, full)
            try:
                fd = os.open(full, _READ_FLAGS)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise CommitError(f"{full}: symlinks are not stored") from exc
                if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):
                    raise CommitError(f"{full}: only regular files can be stored") from exc
                raise
            try:
                if not statmod.S_ISREG(os.fstat(fd).st_mode):
                    raise CommitError(f"{full}: only regular files can be stored")
                os.set_blocking(fd, True)
                os.fsync(fd)
                size, digest = hash_fd(fd, uncached=uncached)
            finally:
                close_quietly(fd)
            files.append((rel, size, digest))
    for d in reversed(dirs):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fsync_dir(dfd, info or CommitInfo(0), tolerated)
        finally:
            close_quietly(dfd)
    return sorted(files)


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


def _storable(top: Path, full: str) -> str:
    """The record path of ``full`` (relative to ``top``, ``/``-separated), if it follows the
    artifact-name rules a record's file paths are held to; else CommitError."""
    rel = os.path.relpath(full, top).replace(os.sep, "/")
    try:
        validate_name(rel, inside_folder=True)
    except InvalidNameError as exc:
        raise CommitError(f"{full}: cannot be stored in a folder artifact: {exc}") from exc
    return rel


class LocalStagingFolder:
    """A local temporary folder for the caller to fill, uploaded at publish (object stores,
    SMB), whose identity is pinned by an fd kept open for the writer's life: a folder removed
    and made again under the writer (another tool, a ``copytree(..., dirs_exist_ok=True)``
    refilling it) is not this one, and :meth:`check` raises CommitError instead of letting a
    remainder be published (as ``_liveness`` does for staging folders on local stores)."""

    def __init__(self) -> None:
        import tempfile

        self.path = Path(tempfile.mkdtemp(prefix=".commitstore.tmp."))
        self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        st = os.fstat(self._fd)
        self._id = (st.st_dev, st.st_ino)

    def check(self, shown: str) -> None:
        """Raise CommitError unless the folder at :attr:`path` is still the one made here."""
        try:
            st = os.lstat(self.path)
            same = (st.st_dev, st.st_ino) == self._id and statmod.S_ISDIR(st.st_mode)
        except FileNotFoundError:
            same = False
        if not same:
            raise CommitError(
                f"{shown}: the local staging folder was removed (or made again) while it was "
                "being filled; nothing is published"
            )

    def close(self) -> None:
        """Drop the pin and the folder (idempotent)."""
        import shutil

        fd, self._fd = self._fd, None
        if fd is not None:
            close_quietly(fd)
        shutil.rmtree(self.path, ignore_errors=True)
