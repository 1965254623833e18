"""Local POSIX strategies (local disk, mounted bridges): their rename primitives, their policies
and the factory that picks one from the mount. The recipe itself is ``sink.py``.

Every operation walks from the root with directory file descriptors opened ``O_NOFOLLOW``, so no
symlink inside the tree can redirect a write (or a read) outside the root.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import stat as statmod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from commitstore.backends.base import (
    Backend,
    Capabilities,
    CommitInfo,
    FileInfo,
    PutMode,
    take_options,
)
from commitstore.backends.localtree import fsync_dir
from commitstore.backends.rename import _syscalls
from commitstore.backends.rename._localfs import os_error, publish_at, readback_digest, rmtree_at
from commitstore.backends.rename.mounts import Mount, mount_of
from commitstore.backends.rename.ops import CommitPolicy
from commitstore.backends.rename.sink import RenameBackend
from commitstore.digest import READ_CHUNK
from commitstore.errors import (
    ConfigurationError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
)
from commitstore.layout import META_DIR, Parts

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

WRITEBACK_EVERY = 16 * 1024 * 1024
"""Start writeback of each finished 16 MiB range while later bytes are still written."""

LOCAL_POLICY = CommitPolicy()
BRIDGE_POLICY = CommitPolicy(
    rename_attempts=6,
    fresh_stat=True,
    readback=True,
    check_after_rename=True,
    dir_fsync_tolerated=(errno.EINVAL, errno.ENOTSUP, errno.EIO),
)


@dataclasses.dataclass(slots=True)
class Staging:
    """An open staging file: its fd, bytes written, and how far writeback was started."""

    fd: int
    written: int = 0
    synced: int = 0
    closed: bool = False


class LocalBackend(RenameBackend[int, Staging]):
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

    # -- rename primitives (see sink.RenameOps) --------------------------------------------
    def shown(self, parts: Parts) -> str:
        return self.path_of(parts)

    def open_folder(self, parts: Parts) -> int:
        return self.open_dir(parts, create=True)

    def close_folder(self, folder: int) -> None:
        os.close(folder)

    def create_staging(self, folder: int, name: str) -> Staging:
        return Staging(os.open(name, _CREATE_FLAGS, 0o666, dir_fd=folder))

    def write(self, handle: Staging, data: memoryview) -> int:
        n = os.write(handle.fd, data)
        handle.written += n
        if handle.written - handle.synced >= WRITEBACK_EVERY:
            _syscalls.start_writeback(handle.fd, handle.synced, handle.written - handle.synced)
            handle.synced = handle.written
        return n

    def finish(self, handle: Staging) -> int:
        try:
            os.fsync(handle.fd)
            return os.fstat(handle.fd).st_size
        finally:
            self.discard(handle)

    def discard(self, handle: Staging) -> None:
        if not handle.closed:
            handle.closed = True
            os.close(handle.fd)

    def size_of(self, folder: int, name: str) -> int | None:
        try:
            return os.stat(name, dir_fd=folder, follow_symlinks=False).st_size
        except FileNotFoundError:
            return None

    def digest_of(self, folder: int, name: str) -> tuple[int, str]:
        return readback_digest(folder, name)

    def rename(
        self, folder: int, src: str, dst: str, *, mode: PutMode, is_dir: bool, info: CommitInfo
    ) -> None:
        overwrite = mode is PutMode.REPLACE
        publish_at(folder, src, dst, overwrite=overwrite, shown=dst, policy=self.policy, info=info)

    def sync_folder(self, folder: int, info: CommitInfo) -> None:
        fsync_dir(folder, info, self.policy.dir_fsync_tolerated)

    def remove_at(self, folder: int, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return
        if statmod.S_ISDIR(st.st_mode):
            rmtree_at(folder, name)
        else:
            os.unlink(name, dir_fd=folder)

    def staging_folder(self, folder: int, parts: Parts) -> Path:
        os.mkdir(parts[-1], 0o777, dir_fd=folder)
        return Path(self.path_of(parts))

    def error(self, exc: Exception, what: str, shown: str) -> Exception:
        return os_error(exc, what, shown)

    # -- Backend API -------------------------------------------------------------------
    def open_read(self, parts: Parts) -> BinaryIO:
        """Open a regular file for reading. Opened ``O_NONBLOCK|O_NOFOLLOW`` and checked with
        ``fstat`` before anything is read, so a FIFO never blocks and a symlink is never
        followed: both (and sockets, devices, symlinked folders on the way) raise IntegrityError."""
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFoundError(f"{self.path_of(parts)} does not exist") from exc
        except InvalidNameError as exc:
            raise _not_regular(self.path_of(parts), "a folder on its path is a symlink") from exc
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dirfd)
        except FileNotFoundError as exc:
            raise NotFoundError(f"{self.path_of(parts)} does not exist") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _not_regular(self.path_of(parts), "a symlink; not followed") from exc
            if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):
                raise _not_regular(self.path_of(parts), "a socket or device") from exc
            raise
        finally:
            os.close(dirfd)
        try:
            mode = os.fstat(fd).st_mode
            if statmod.S_ISDIR(mode):
                raise NotFoundError(f"{self.path_of(parts)} is a folder, not a file")
            if not statmod.S_ISREG(mode):
                raise _not_regular(self.path_of(parts), _kind(mode))
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
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

    def walk_folders(self, parts: Parts) -> list[Parts]:
        try:
            topfd = self.open_dir(parts, create=False)
        except (FileNotFoundError, NotADirectoryError, InvalidNameError):
            return []
        out: list[Parts] = []
        try:
            for dirpath, dirnames, _files, dfd in os.fwalk(".", dir_fd=topfd):
                rel = tuple(p for p in dirpath.split("/") if p not in ("", "."))
                for entry in dirnames:
                    try:
                        st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if statmod.S_ISDIR(st.st_mode):
                        out.append((*rel, entry))
        finally:
            os.close(topfd)
        return out

    def last_change(self, parts: Parts) -> float | None:
        """Newest of mtime and ctime of ``parts`` and everything below it (``lstat``, no link
        followed); None if it is gone or any mtime is 0."""
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError, InvalidNameError):
            return None
        try:
            stats = [os.stat(parts[-1], dir_fd=dirfd, follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            os.close(dirfd)
        if statmod.S_ISDIR(stats[0].st_mode):
            try:
                topfd = self.open_dir(parts, create=False)
            except (FileNotFoundError, NotADirectoryError, InvalidNameError):
                return None
            try:
                for _dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=topfd):
                    for entry in (*dirnames, *filenames):
                        with contextlib.suppress(FileNotFoundError):
                            stats.append(os.stat(entry, dir_fd=dfd, follow_symlinks=False))
            finally:
                os.close(topfd)
        if any(st.st_mtime <= 0 for st in stats):
            return None
        return max(max(st.st_mtime, st.st_ctime) for st in stats)

    def remove(self, parts: Parts) -> bool:
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            if self.size_of(dirfd, parts[-1]) is None:
                return False
            self.remove_at(dirfd, parts[-1])
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


class BridgeBackend(LocalBackend):
    """A folder on a mounted network or FUSE filesystem."""

    strategy = "bridge-checked"
    capabilities = Capabilities(
        atomic_replace=True,
        exclusive_create=True,
        dir_fsync=False,
        atomic_dir_publish=True,
        free_space=True,
    )

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        reason: str,
        mount: Mount | None,
        readback: bool = True,
    ) -> None:
        super().__init__(root, reason=reason)
        self.mount = mount
        self.policy: CommitPolicy = dataclasses.replace(BRIDGE_POLICY, readback=readback)

    def __repr__(self) -> str:
        return f"BridgeBackend({self.root!r})"

    def open_read(self, parts: Parts) -> BinaryIO:
        """Open for reading with the client's cached pages of the file dropped first, so checks
        see what the far side holds."""
        f = super().open_read(parts)
        with contextlib.suppress(OSError):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return f

    def describe_more(self) -> dict[str, Any]:
        m, p = self.mount, self.policy
        return {
            "mount": {"mount_point": m.mount_point, "fstype": m.fstype} if m else None,
            "checks": {
                "fresh_stat": p.fresh_stat,
                "readback": p.readback,
                "rename_attempts": p.rename_attempts,
                "size_after_rename": p.check_after_rename,
                "dir_fsync_errors_tolerated": [errno.errorcode[e] for e in p.dir_fsync_tolerated],
            },
        }


def _info(st: os.stat_result) -> FileInfo:
    mtime = st.st_mtime if st.st_mtime > 0 else None
    is_dir = statmod.S_ISDIR(st.st_mode)
    return FileInfo(
        size=st.st_size,
        mtime=mtime,
        is_dir=is_dir,
        regular=is_dir or statmod.S_ISREG(st.st_mode),
    )


def _kind(mode: int) -> str:
    for test, what in (
        (statmod.S_ISLNK, "a symlink"),
        (statmod.S_ISFIFO, "a FIFO"),
        (statmod.S_ISSOCK, "a socket"),
        (statmod.S_ISCHR, "a character device"),
        (statmod.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def _not_regular(path: str, what: str) -> IntegrityError:
    """The error for reading something that is not a regular file (never read, never followed)."""
    return IntegrityError(f"{path}: not a regular file ({what})", status="size_mismatch")


def factory(url: str, options: dict[str, Any]) -> Backend:
    opts = take_options(options, {"strategy": "auto", "readback": True})
    if url.startswith("file://"):
        parsed = urlsplit(url)
        if parsed.netloc not in ("", "localhost"):
            raise ConfigurationError(f"file:// URL with a remote host is not supported: {url!r}")
        path, how = unquote(parsed.path), "file:// URL"
    else:
        path, how = os.path.expanduser(url), "local path"
    strategy = opts["strategy"]
    if strategy not in ("auto", "local", "bridge"):
        raise ConfigurationError(f"strategy must be 'auto', 'local' or 'bridge', not {strategy!r}")
    mount = mount_of(path)
    where = f"on {mount.fstype} mounted at {mount.mount_point}" if mount else "mount unknown"
    if strategy == "bridge" or (strategy == "auto" and mount is not None and mount.is_bridge):
        why = "strategy='bridge' requested" if strategy == "bridge" else "network/FUSE mount"
        return BridgeBackend(
            path, reason=f"{how} {where} ({why})", mount=mount, readback=bool(opts["readback"])
        )
    why = "strategy='local' requested" if strategy == "local" else "local filesystem"
    return LocalBackend(path, reason=f"{how} {where} ({why})")
