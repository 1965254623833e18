"""A local folder a caller filled, made ready to publish: every file fsynced and hashed, every
folder fsynced. Used by every folder sink (each family stages folders locally first or in place)."""

from __future__ import annotations

import errno
import os
import stat as statmod
from pathlib import Path

from commitstore.backends.base import CommitInfo
from commitstore.digest import hash_stream
from commitstore.errors import CommitError


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
    """fsync every file under ``top``, then hash it (past the page cache when ``uncached``);
    fsync every folder bottom-up (``tolerated`` errors mark ``info`` durability unconfirmed).
    Refuses symlinks and special files (CommitError). Returns (path, size, digest), sorted."""
    files: list[tuple[str, int, str]] = []
    dirs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirs.append(dirpath)
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                raise CommitError(f"{os.path.join(dirpath, d)}: symlinks are not stored")
        for fname in filenames:
            full = os.path.join(dirpath, fname)
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise CommitError(f"{full}: symlinks are not stored") from exc
                raise
            try:
                if not statmod.S_ISREG(os.fstat(fd).st_mode):
                    raise CommitError(f"{full}: only regular files can be stored")
                os.fsync(fd)
                size, digest = hash_fd(fd, uncached=uncached)
            finally:
                os.close(fd)
            rel = os.path.relpath(full, top).replace(os.sep, "/")
            files.append((rel, size, digest))
    for d in reversed(dirs):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fsync_dir(dfd, info or CommitInfo(0), tolerated)
        finally:
            os.close(dfd)
    return sorted(files)
