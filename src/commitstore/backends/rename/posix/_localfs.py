"""POSIX filesystem helpers of the local strategies (see ``backend.py``): error translation (the
one place), stat results, the one-step publish (no-replace, link, replace or exchange) with its
retries, read-back digests."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import stat as statmod
import sys
import time
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from commitstore.backends.base import CommitInfo, FileInfo
from commitstore.backends.localtree import close_quietly, hash_fd
from commitstore.backends.rename import aside
from commitstore.backends.rename.ops import CommitPolicy
from commitstore.backends.rename.posix import _syscalls as _posix
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    IntegrityError,
    NotFoundError,
    StorageError,
    StoragePathError,
)
from commitstore.layout import Parts

_NOSPACE = (errno.ENOSPC, errno.EDQUOT)
_UNREACHABLE = (
    errno.ENOTCONN,
    errno.ESTALE,
    errno.ETIMEDOUT,
    errno.EHOSTDOWN,
    errno.EHOSTUNREACH,
    errno.ECONNRESET,
    errno.ECONNABORTED,
)
"""A mount whose server or daemon went away (retryable): FUSE "transport endpoint is not
connected", NFS stale handles, network timeouts."""


def os_error(exc: Exception, what: str, path: str) -> Exception:
    """Translate an OSError from a write path into the error tree (one place); anything else is
    returned unchanged."""
    if not isinstance(exc, OSError):
        return exc
    if exc.errno in _NOSPACE:
        return InsufficientSpaceError(f"no space left while {what} {path}", path=path)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return StoragePathError(
            exc.errno, f"{path}: a path component is a symlink or not a folder", path=path
        )
    if exc.errno in _UNREACHABLE:
        return BackendUnavailableError(f"{what} {path}: storage unreachable ({exc.strerror})")
    return CommitError(f"{what} {path} failed: {exc.strerror or exc}")


def storage_error(exc: OSError, what: str, path: str) -> Exception:
    """Translate an OSError of a call outside the commit recipe (stat, listing, read, lock,
    removal) into the error tree (one place): no space, a vanished server and symlinks as in
    :func:`os_error`, a vanished entry as NotFoundError, anything else StorageError with the
    same errno."""
    if exc.errno in _NOSPACE or exc.errno in _UNREACHABLE or exc.errno in (errno.ELOOP,):
        return os_error(exc, what, path)
    if exc.errno == errno.ENOENT:
        return NotFoundError(f"{path} does not exist")
    code = exc.errno if exc.errno is not None else errno.EIO
    return StorageError(code, f"{what} {path} failed: {exc.strerror or exc}", path=path)


def rmtree_at(dirfd: int, name: str) -> None:
    """Remove the folder tree ``name`` in ``dirfd`` (never following symlinks). What is gone
    already (another remover got there first: gc and a replace removing the old version it
    exchanged out) counts as removed; any other error raises."""
    if sys.version_info >= (3, 12):
        shutil.rmtree(name, dir_fd=dirfd, onexc=_gone_ok)
    elif sys.version_info >= (3, 11):
        shutil.rmtree(name, dir_fd=dirfd, onerror=_gone_ok_info)
    else:  # pragma: no cover - python 3.10
        shutil.rmtree(os.path.join(f"/proc/self/fd/{dirfd}", name), onerror=_gone_ok_info)


def _gone_ok(_fn: object, _path: object, exc: BaseException) -> None:
    if not isinstance(exc, FileNotFoundError):
        raise exc


def _gone_ok_info(_fn: object, _path: object, info: tuple[object, BaseException, object]) -> None:
    _gone_ok(_fn, _path, info[1])


RETRY_RENAME_ERRNOS = (errno.EACCES, errno.EPERM, errno.EBUSY)
_NO_LINK = (errno.EPERM, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK, errno.EXDEV, errno.EINVAL)


def _retrying(policy: CommitPolicy, info: CommitInfo | None, call: Callable[[], None]) -> None:
    for attempt in range(policy.rename_attempts):
        try:
            call()
            if attempt and info is not None:
                info.notes.append(f"rename succeeded after {attempt + 1} attempts")
            return
        except OSError as exc:
            if exc.errno not in RETRY_RENAME_ERRNOS or attempt + 1 >= policy.rename_attempts:
                raise
            time.sleep(min(0.05 * 2**attempt, 1.0))


def publish_at(
    dirfd: int,
    tmp: str,
    final: str,
    *,
    overwrite: bool,
    shown: str,
    policy: CommitPolicy,
    info: CommitInfo | None = None,
) -> None:
    """Move ``tmp`` onto ``final`` in ``dirfd`` in one step. Never copies.

    ``overwrite=False``: ``renameat2(RENAME_NOREPLACE)``, so of two racing writers exactly one
    wins; where the filesystem lacks it (FUSE, 9p), ``link`` + ``unlink`` for files, and where links
    are refused too, check-then-rename under the store's publish lock. ``overwrite=True``:
    ``rename``, or ``RENAME_EXCHANGE`` then removal of the old copy when the types differ or the old
    one is a non-empty folder; where the filesystem refuses the exchange (FUSE, 9p: EINVAL), the
    move-aside protocol of ``aside.py`` (the old entry to its aside name, the new one in, the
    aside removed). Renames are retried per ``policy``. Raises AlreadyExistsError or OSError;
    ``tmp`` is left for the caller to clean.
    """

    def rename() -> None:
        os.rename(tmp, final, src_dir_fd=dirfd, dst_dir_fd=dirfd)

    def exists() -> bool:
        try:
            os.stat(final, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    if not overwrite:
        try:
            _retrying(
                policy,
                info,
                lambda: _posix.renameat2(dirfd, tmp, dirfd, final, _posix.RENAME_NOREPLACE),
            )
            return
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise AlreadyExistsError(f"{shown} already exists") from exc
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
                raise
        if not statmod.S_ISDIR(os.stat(tmp, dir_fd=dirfd, follow_symlinks=False).st_mode):
            try:
                os.link(tmp, final, src_dir_fd=dirfd, dst_dir_fd=dirfd, follow_symlinks=False)
            except FileExistsError as exc:
                raise AlreadyExistsError(f"{shown} already exists") from exc
            except OSError as exc:
                if exc.errno not in _NO_LINK:
                    raise
            else:
                os.unlink(tmp, dir_fd=dirfd)
                return
        if exists():
            raise AlreadyExistsError(f"{shown} already exists")
        _retrying(policy, info, rename)
        return
    # An aside entry a stopped move-aside replace left (FUSE, 9p) is settled first (one stat
    # of a missing name otherwise), so the name holds its old version before it is replaced.
    aside.settle_stale(_DirMoves(dirfd, shown, policy, info), final)
    try:
        _retrying(policy, info, rename)
        return
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
    try:
        _posix.renameat2(dirfd, tmp, dirfd, final, _posix.RENAME_EXCHANGE)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise
        # FUSE, 9p, CIFS: no exchange. The move-aside protocol, under the publish lock.
        notes = info.notes if info is not None else []
        aside.replace(_DirMoves(dirfd, shown, policy, info), tmp, final, notes)
        return
    # ``tmp`` now holds the previous artifact, which is no longer visible; drop it. No writer
    # holds it (this one's lock is on the new entry, now at ``final``), so gc may remove it
    # first: the name holds the new version either way, and "already gone" is done.
    try:
        st = os.stat(tmp, dir_fd=dirfd, follow_symlinks=False)
        if statmod.S_ISDIR(st.st_mode):
            rmtree_at(dirfd, tmp)
        else:
            os.unlink(tmp, dir_fd=dirfd)
    except FileNotFoundError:
        pass


class _DirMoves:
    """:class:`aside.AsideMoves` on the entries of the open folder ``dirfd``."""

    def __init__(
        self, dirfd: int, shown: str, policy: CommitPolicy, info: CommitInfo | None
    ) -> None:
        self.dirfd, self.shown, self.policy, self.info = dirfd, shown, policy, info

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def move(self, src: str, dst: str) -> None:
        publish_at(
            self.dirfd, src, dst, overwrite=False, shown=dst, policy=self.policy, info=self.info
        )

    def remove(self, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=self.dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if statmod.S_ISDIR(st.st_mode):
            rmtree_at(self.dirfd, name)
        else:
            os.unlink(name, dir_fd=self.dirfd)


def readback_digest(dirfd: int, name: str) -> tuple[int, str]:
    """Re-read ``name`` from the filesystem (cached pages dropped first) and hash it."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        return hash_fd(fd, uncached=True)
    finally:
        close_quietly(fd)


class _HasPaths(Protocol):
    def path_of(self, parts: Parts) -> str: ...


B = TypeVar("B", bound=_HasPaths)
P = ParamSpec("P")
R = TypeVar("R")


def translated(
    what: str,
) -> Callable[[Callable[Concatenate[B, Parts, P], R]], Callable[Concatenate[B, Parts, P], R]]:
    """Translate every ``OSError`` of a public method on ``parts`` into the error tree (no space:
    InsufficientSpaceError; permission, read-only, I/O errors: StorageError; a gone server:
    BackendUnavailableError), the OSError chained as ``__cause__``."""

    def wrap(fn: Callable[Concatenate[B, Parts, P], R]) -> Callable[Concatenate[B, Parts, P], R]:
        @functools.wraps(fn)
        def call(self: B, parts: Parts, /, *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(self, parts, *args, **kwargs)
            except CommitStoreError:
                raise
            except OSError as exc:
                raise storage_error(exc, what, self.path_of(parts)) from exc

        return call

    return wrap


def stat_info(st: os.stat_result) -> FileInfo:
    mode = statmod.S_IFMT(st.st_mode)
    mtime = st.st_mtime
    is_dir = mode == statmod.S_IFDIR
    return FileInfo(st.st_size, mtime if mtime > 0 else None, is_dir, None, is_dir or mode == _REG)


_REG = statmod.S_IFREG


def kind_of(mode: int) -> str:
    for test, what in (
        (statmod.S_ISLNK, "a symlink"),
        (statmod.S_ISDIR, "a folder"),
        (statmod.S_ISFIFO, "a FIFO"),
        (statmod.S_ISSOCK, "a socket"),
        (statmod.S_ISCHR, "a character device"),
        (statmod.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def not_regular(path: str, what: str) -> IntegrityError:
    """The error for reading something that is not a regular file (never read, never followed)."""
    return IntegrityError(f"{path}: not a regular file ({what})", status="size_mismatch")
