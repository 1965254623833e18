"""Local filesystem primitives shared by the local strategies: error translation, directory fsync,
the one-step publish (no-replace, replace or exchange), and hashing+syncing a staged folder."""

from __future__ import annotations

import errno
import os
import shutil
import stat as statmod
import sys
from pathlib import Path

from .._digest import READ_CHUNK, Hasher
from ..errors import AlreadyExistsError, CommitError, InsufficientSpaceError, InvalidNameError
from . import _posix
from ._base import CommitInfo

_NOSPACE = (errno.ENOSPC, errno.EDQUOT)


def os_error(exc: OSError, what: str, path: str) -> Exception:
    """Translate an OSError from a write path into the error tree (one place)."""
    if exc.errno in _NOSPACE:
        return InsufficientSpaceError(f"no space left while {what} {path}", path=path)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return InvalidNameError(f"{path}: a path component is a symlink or not a folder")
    return CommitError(f"{what} {path} failed: {exc.strerror or exc}")


def fsync_dir(fd: int, info: CommitInfo | None = None) -> None:
    """fsync a directory; EINVAL/ENOTSUP mean "not supported here": durability unconfirmed."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOTSUP) and info is not None:
            info.durable = False
            info.notes.append(f"directory fsync not supported ({exc.strerror})")
            return
        raise


def rmtree_at(dirfd: int, name: str, shown: str) -> None:
    if sys.version_info >= (3, 11):
        shutil.rmtree(name, dir_fd=dirfd)
    else:  # pragma: no cover - python 3.10
        shutil.rmtree(os.path.join(f"/proc/self/fd/{dirfd}", name))


def publish_at(dirfd: int, tmp: str, final: str, *, overwrite: bool, shown: str) -> None:
    """Move ``tmp`` onto ``final`` in ``dirfd`` in one step.

    ``overwrite=False``: ``renameat2(RENAME_NOREPLACE)`` (or link+unlink for files where the
    filesystem lacks it), so of two racing writers exactly one wins. ``overwrite=True``: ``rename``,
    or ``RENAME_EXCHANGE`` then removal of the old copy when the types differ or the old one is a
    non-empty folder. Raises AlreadyExistsError or OSError; ``tmp`` is left for the caller to clean.
    """
    if not overwrite:
        try:
            _posix.renameat2(dirfd, tmp, dirfd, final, _posix.RENAME_NOREPLACE)
            return
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise AlreadyExistsError(f"{shown} already exists") from exc
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
                raise
        st = os.stat(tmp, dir_fd=dirfd, follow_symlinks=False)
        if statmod.S_ISDIR(st.st_mode):
            try:
                os.stat(final, dir_fd=dirfd, follow_symlinks=False)
                raise AlreadyExistsError(f"{shown} already exists")
            except FileNotFoundError:
                os.rename(tmp, final, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            return
        try:
            os.link(tmp, final, src_dir_fd=dirfd, dst_dir_fd=dirfd, follow_symlinks=False)
        except FileExistsError as exc:
            raise AlreadyExistsError(f"{shown} already exists") from exc
        os.unlink(tmp, dir_fd=dirfd)
        return
    try:
        os.replace(tmp, final, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        return
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
    _posix.renameat2(dirfd, tmp, dirfd, final, _posix.RENAME_EXCHANGE)
    # ``tmp`` now holds the previous artifact, which is no longer visible; drop it.
    st = os.stat(tmp, dir_fd=dirfd, follow_symlinks=False)
    if statmod.S_ISDIR(st.st_mode):
        rmtree_at(dirfd, tmp, shown)
    else:
        os.unlink(tmp, dir_fd=dirfd)


def hash_and_sync_tree(top: Path) -> list[tuple[str, int, str]]:
    """Hash every file below ``top``, fsync every file and folder; refuse symlinks and specials."""
    files: list[tuple[str, int, str]] = []
    dirs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirs.append(dirpath)
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                raise CommitError(f"{os.path.join(dirpath, d)}: symlinks are not stored")
        for fname in filenames:
            full = os.path.join(dirpath, fname)
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if not statmod.S_ISREG(os.fstat(fd).st_mode):
                    raise CommitError(f"{full}: only regular files can be stored")
                h = Hasher()
                buf = bytearray(READ_CHUNK)
                view = memoryview(buf)
                while n := os.readv(fd, [buf]):
                    h.update(view[:n])
                os.fsync(fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise CommitError(f"{full}: symlinks are not stored") from exc
                raise
            finally:
                os.close(fd)
            rel = os.path.relpath(full, top).replace(os.sep, "/")
            files.append((rel, h.count, h.digest()))
    for d in reversed(dirs):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fsync_dir(dfd, CommitInfo(0))
        finally:
            os.close(dfd)
    return sorted(files)
