"""Local POSIX strategy: staging file beside the destination, fsync, one rename, fsync directory.

Every operation walks from the root with directory file descriptors opened ``O_NOFOLLOW``, so no
symlink inside the tree can redirect a write (or a read) outside the root.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat as statmod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from .._digest import READ_CHUNK
from .._names import META_DIR, Parts, staging_part
from ..errors import (
    AlreadyExistsError,
    CommitError,
    InvalidNameError,
    NotFoundError,
)
from . import _posix
from ._base import Backend, Capabilities, CommitInfo, DirSink, FileInfo, FileSink
from ._localio import (
    LOCAL_POLICY,
    CommitPolicy,
    fsync_dir,
    hash_and_sync_tree,
    os_error,
    publish_at,
    readback_digest,
    rmtree_at,
)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
WRITEBACK_EVERY = 16 * 1024 * 1024
"""Start writeback of each finished 16 MiB range while later bytes are still written."""


class LocalBackend(Backend):
    """A folder on a local filesystem."""

    strategy = "local-rename"
    policy: CommitPolicy = LOCAL_POLICY
    capabilities = Capabilities(
        atomic_replace=True,
        exclusive_create=True,
        dir_fsync=True,
        atomic_dir_publish=True,
        free_space=True,
    )

    def __init__(self, root: str | os.PathLike[str], *, reason: str = "local path") -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.reason = reason
        os.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalBackend({self.root!r})"

    def path_of(self, parts: Parts) -> str:
        """The absolute path of ``parts`` (for messages and for tools outside the store)."""
        return os.path.join(self.root, *parts)

    # -- directory walking -------------------------------------------------------------
    def open_dir(self, parts: Parts, *, create: bool) -> int:
        """Open the folder ``parts`` below the root without following symlinks; return its fd."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                        fsync_dir(fd, CommitInfo(0), self.policy.dir_fsync_tolerated)
                    except FileExistsError:
                        pass
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise InvalidNameError(
                            f"{self.path_of(parts)}: {part!r} is a symlink or not a folder; "
                            "commitstore never follows symlinks below the root"
                        ) from exc
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- Backend API -------------------------------------------------------------------
    def open_sink(self, parts: Parts, *, overwrite: bool) -> FileSink:
        try:
            dirfd = self.open_dir(parts[:-1], create=True)
        except OSError as exc:
            raise os_error(exc, "creating the folder of", self.path_of(parts)) from exc
        return LocalFileSink(self, dirfd, parts, overwrite=overwrite)

    def open_dir_sink(self, parts: Parts, *, overwrite: bool) -> DirSink:
        try:
            dirfd = self.open_dir(parts[:-1], create=True)
        except OSError as exc:
            raise os_error(exc, "creating the folder of", self.path_of(parts)) from exc
        return LocalDirSink(self, dirfd, parts, overwrite=overwrite)

    def open_read(self, parts: Parts) -> BinaryIO:
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFoundError(f"{self.path_of(parts)} does not exist") from exc
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
        except FileNotFoundError as exc:
            raise NotFoundError(f"{self.path_of(parts)} does not exist") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InvalidNameError(f"{self.path_of(parts)} is a symlink; not followed") from exc
            raise
        finally:
            os.close(dirfd)
        if statmod.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotFoundError(f"{self.path_of(parts)} is a folder, not a file")
        return os.fdopen(fd, "rb", buffering=READ_CHUNK)

    def stat(self, parts: Parts) -> FileInfo | None:
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError, InvalidNameError):
            return None
        try:
            st = os.stat(parts[-1], dir_fd=dirfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            os.close(dirfd)
        return _info(st)

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        try:
            topfd = self.open_dir(parts, create=False)
        except (FileNotFoundError, NotADirectoryError, InvalidNameError):
            return []
        out: list[tuple[Parts, FileInfo]] = []
        try:
            for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=topfd):
                rel = tuple(p for p in dirpath.split("/") if p not in ("", "."))
                for entry in (*dirnames, *filenames):
                    try:
                        st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if not statmod.S_ISDIR(st.st_mode):
                        out.append(((*rel, entry), _info(st)))
        finally:
            os.close(topfd)
        return out

    def remove(self, parts: Parts) -> bool:
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            try:
                st = os.stat(parts[-1], dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if statmod.S_ISDIR(st.st_mode):
                rmtree_at(dirfd, parts[-1], self.path_of(parts))
            else:
                os.unlink(parts[-1], dir_fd=dirfd)
            fsync_dir(dirfd, CommitInfo(0), self.policy.dir_fsync_tolerated)
            return True
        finally:
            os.close(dirfd)

    @contextlib.contextmanager
    def publish_lock(self) -> Iterator[None]:
        """``flock`` on ``<root>/.commitstore/lock`` (released by the kernel if the holder dies)."""
        dirfd = self.open_dir((META_DIR,), create=True)
        try:
            fd = os.open(
                "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dirfd
            )
        finally:
            os.close(dirfd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def free_space(self, parts: Parts) -> int | None:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "reason": self.reason,
            "location": self.root,
            "capabilities": {
                k: getattr(self.capabilities, k) for k in self.capabilities.__dataclass_fields__
            },
        }


def _info(st: os.stat_result) -> FileInfo:
    mtime = st.st_mtime if st.st_mtime > 0 else None
    return FileInfo(size=st.st_size, mtime=mtime, is_dir=statmod.S_ISDIR(st.st_mode))


class LocalFileSink(FileSink):
    """``<dir>/.commitstore.tmp.<random>.<name>`` created O_EXCL|O_NOFOLLOW, renamed on publish."""

    def __init__(self, backend: LocalBackend, dirfd: int, parts: Parts, *, overwrite: bool) -> None:
        self._backend = backend
        self._dirfd = dirfd
        self._final = parts[-1]
        self._shown = backend.path_of(parts)
        self._overwrite = overwrite
        self._tmp = staging_part(parts[-1])
        self.bytes_written = 0
        self._synced = 0
        self._fd: int | None = None
        self._done = False
        try:
            self._fd = os.open(
                self._tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o666,
                dir_fd=dirfd,
            )
        except OSError as exc:
            os.close(dirfd)
            self._done = True
            raise os_error(exc, "creating the staging file for", self._shown) from exc

    def write(self, data: memoryview) -> None:
        assert self._fd is not None, "write after publish/abort"
        view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        try:
            while view.nbytes:
                n = os.write(self._fd, view)
                self.bytes_written += n
                view = view[n:]
        except OSError as exc:
            err = os_error(exc, "writing", self._shown)
            self.abort()
            raise err from exc
        if self.bytes_written - self._synced >= WRITEBACK_EVERY:
            _posix.start_writeback(self._fd, self._synced, self.bytes_written - self._synced)
            self._synced = self.bytes_written

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert self._fd is not None, "publish after publish/abort"
        policy = self._backend.policy
        info = CommitInfo(self.bytes_written)
        try:
            if size != self.bytes_written:
                raise CommitError(
                    f"{self._shown}: {self.bytes_written} bytes written, {size} expected"
                )
            try:
                os.fsync(self._fd)
                stored = os.fstat(self._fd).st_size
            except OSError as exc:
                raise os_error(exc, "flushing", self._shown) from exc
            self._check(stored, "after fsync")
            os.close(self._fd)
            self._fd = None
            self._check_staged(policy, digest)
            try:
                publish_at(
                    self._dirfd,
                    self._tmp,
                    self._final,
                    overwrite=self._overwrite,
                    shown=self._shown,
                    policy=policy,
                    info=info,
                )
            except OSError as exc:
                if isinstance(exc, AlreadyExistsError):
                    raise
                raise os_error(exc, "renaming into place", self._shown) from exc
            self._done = True
            if policy.check_after_rename:
                self._check_final()
            try:
                fsync_dir(self._dirfd, info, policy.dir_fsync_tolerated)
            except OSError as exc:
                raise os_error(exc, "syncing the folder of", self._shown) from exc
            return info
        except BaseException:
            self.abort()
            raise
        finally:
            if self._done:
                self._close_dir()

    def _check(self, stored: int, when: str) -> None:
        if stored != self.bytes_written:
            raise CommitError(
                f"{self._shown}: post-copy size check failed {when}: "
                f"{stored} bytes stored, {self.bytes_written} written"
            )

    def _check_staged(self, policy: CommitPolicy, digest: str) -> None:
        try:
            if policy.fresh_stat:
                st = os.stat(self._tmp, dir_fd=self._dirfd, follow_symlinks=False)
                self._check(st.st_size, "on a fresh stat")
            if policy.readback:
                size, found = readback_digest(self._dirfd, self._tmp)
                self._check(size, "on read-back")
                if found != digest:
                    raise CommitError(
                        f"{self._shown}: read-back digest {found} differs from written {digest}"
                    )
        except OSError as exc:
            raise os_error(exc, "checking", self._shown) from exc

    def _check_final(self) -> None:
        """After the rename: the final name must hold what was written, else un-publish it."""
        try:
            st = os.stat(self._final, dir_fd=self._dirfd, follow_symlinks=False)
            stored = st.st_size
        except OSError:
            stored = -1
        if stored != self.bytes_written:
            with contextlib.suppress(OSError):
                os.unlink(self._final, dir_fd=self._dirfd)
            self._check(stored, "after the rename")

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._done:
            self._done = True
            try:
                os.unlink(self._tmp, dir_fd=self._dirfd)
            except FileNotFoundError:
                pass
            except OSError:
                pass  # left as an orphan staging file; gc removes it
        self._close_dir()

    def _close_dir(self) -> None:
        if self._dirfd >= 0:
            os.close(self._dirfd)
            self._dirfd = -1


class LocalDirSink(DirSink):
    """``<parent>/.commitstore.tmp.<random>.<name>/``, filled by the caller, renamed on publish."""

    def __init__(self, backend: LocalBackend, dirfd: int, parts: Parts, *, overwrite: bool) -> None:
        self._dirfd = dirfd
        self._policy = backend.policy
        self._final = parts[-1]
        self._shown = backend.path_of(parts)
        self._overwrite = overwrite
        self._tmp = staging_part(parts[-1])
        self._done = False
        try:
            os.mkdir(self._tmp, 0o777, dir_fd=dirfd)
        except OSError as exc:
            os.close(dirfd)
            self._done = True
            raise os_error(exc, "creating the staging folder for", self._shown) from exc
        self.local_path = Path(backend.path_of((*parts[:-1], self._tmp)))

    def publish(self) -> CommitInfo:
        info = CommitInfo(0)
        try:
            try:
                info.files = hash_and_sync_tree(self.local_path, self._policy, info)
            except OSError as exc:
                raise os_error(exc, "syncing", self._shown) from exc
            info.bytes_written = sum(size for _, size, _ in info.files)
            try:
                publish_at(
                    self._dirfd,
                    self._tmp,
                    self._final,
                    overwrite=self._overwrite,
                    shown=self._shown,
                    policy=self._policy,
                    info=info,
                )
            except OSError as exc:
                if isinstance(exc, AlreadyExistsError):
                    raise
                raise os_error(exc, "renaming into place", self._shown) from exc
            self._done = True
            try:
                fsync_dir(self._dirfd, info, self._policy.dir_fsync_tolerated)
            except OSError as exc:
                raise os_error(exc, "syncing the folder of", self._shown) from exc
            return info
        except BaseException:
            self.abort()
            raise
        finally:
            if self._done and self._dirfd >= 0:
                os.close(self._dirfd)
                self._dirfd = -1

    def abort(self) -> None:
        if not self._done:
            self._done = True
            # On failure the folder stays as an orphan with a staging name; gc removes it.
            with contextlib.suppress(OSError):
                rmtree_at(self._dirfd, self._tmp, self._shown)
        if self._dirfd >= 0:
            os.close(self._dirfd)
            self._dirfd = -1
