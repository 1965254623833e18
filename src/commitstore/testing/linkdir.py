"""``linkdir``: a small directory backend written from scratch with ``os`` calls, the worked
example of a plugin backend that passes :class:`~commitstore.testing.BackendContract`.

Commit strategy (``linkdir-link``): a file is staged under a staging name beside its
destination, fsynced, its size checked with a fresh ``fstat``, then published with ``link(2)``
for ``CREATE`` (which fails, atomically, if the name exists: ``exclusive_create``) or
``rename(2)`` for ``REPLACE`` (``atomic_replace``); the folder is fsynced after either. A folder
is staged as a staging folder and renamed into place under an ``flock`` publish lock (a replace
moves the old folder aside first: ``backends/rename/aside.py``). Only a name's last component is
guarded against symlinks (``O_NOFOLLOW``, ``lstat``): a worked example, not a hardened backend
(``LocalBackend`` walks every component with ``O_NOFOLLOW``).

Open by URL after ``commitstore.backends.register("linkdir", factory)``: ``linkdir:///abs/path``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat as statmod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from commitstore.backends.base import (
    Backend,
    Capabilities,
    CommitInfo,
    DirSink,
    FileInfo,
    FileSink,
    PutMode,
    take_options,
)
from commitstore.backends.localtree import hash_and_sync_tree
from commitstore.backends.rename import aside
from commitstore.errors import (
    AlreadyExistsError,
    CommitError,
    CommitStoreError,
    ConfigurationError,
    InsufficientSpaceError,
    IntegrityError,
    NotFoundError,
    StorageError,
)
from commitstore.layout import META_DIR, Parts, staging_part


def _typed(exc: OSError, what: str, *, commit: bool) -> CommitStoreError:
    """An OSError as commitstore's error tree: no space, else CommitError inside a commit,
    StorageError outside it."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientSpaceError(f"{what}: {exc}")
    if commit:
        return CommitError(f"{what}: {exc}")
    return StorageError(exc.errno or errno.EIO, f"{what}: {exc}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> None:
    """``mkdir -p``, each new folder fsynced in its parent."""
    if path.is_dir():
        return
    _make_dirs(path.parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)
        _fsync_dir(path.parent)


def _info(st: os.stat_result) -> FileInfo:
    is_dir = statmod.S_ISDIR(st.st_mode)
    return FileInfo(
        size=st.st_size,
        mtime=st.st_mtime,
        is_dir=is_dir,
        regular=is_dir or statmod.S_ISREG(st.st_mode),
    )


class LinkDirBackend(Backend):
    """A folder on a local disk, published with ``link``/``rename``."""

    strategy = "linkdir-link"
    capabilities = Capabilities(
        atomic_replace=True,
        exclusive_create=True,
        dir_fsync=True,
        atomic_dir_publish=True,
        free_space=True,
        empty_folders=True,
        mtime_resolution=0.0,
        client_retries=False,
    )

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))  # made by the first write, never at open

    def __repr__(self) -> str:
        return f"LinkDirBackend({str(self.root)!r})"

    def path(self, parts: Parts) -> Path:
        """The local path of ``parts``."""
        return self.root.joinpath(*parts)

    # -- writing -------------------------------------------------------------------------------
    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return LinkFileSink(self, parts, mode)

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        return LinkDirSink(self, parts, mode)

    @contextlib.contextmanager
    def publish_lock(self) -> Iterator[None]:
        """``flock`` on ``<root>/.commitstore/lock``."""
        folder = self.path((META_DIR,))
        try:
            _make_dirs(folder)
            fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _typed(exc, f"{self.root}: publish lock", commit=False) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- reading -------------------------------------------------------------------------------
    def open_read(self, parts: Parts) -> BinaryIO:
        path = self.path(parts)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFoundError(f"{path} does not exist", name="/".join(parts)) from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise IntegrityError(f"{path} is a symlink", status="size_mismatch") from exc
            raise _typed(exc, f"{path}: reading", commit=False) from exc
        if not statmod.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise IntegrityError(f"{path} is not a regular file", status="size_mismatch")
        os.set_blocking(fd, True)
        return open(fd, "rb")

    def stat(self, parts: Parts) -> FileInfo | None:
        try:
            return _info(os.lstat(self.path(parts)))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise _typed(exc, f"{self.path(parts)}: stat", commit=False) from exc

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        top = self.path(parts)
        out: list[tuple[Parts, FileInfo]] = []
        for dirpath, dirnames, filenames in os.walk(top):
            rel = Path(dirpath).relative_to(top).parts
            for name in filenames + [d for d in dirnames if os.path.islink(Path(dirpath, d))]:
                with contextlib.suppress(FileNotFoundError):
                    out.append(((*rel, name), _info(os.lstat(Path(dirpath, name)))))
        return out

    def walk_folders(self, parts: Parts) -> list[Parts]:
        top = self.path(parts)
        out: list[Parts] = []
        for dirpath, dirnames, _files in os.walk(top):
            rel = Path(dirpath).relative_to(top).parts
            out += [(*rel, d) for d in dirnames if not os.path.islink(Path(dirpath, d))]
        return out

    def free_space(self, parts: Parts) -> int | None:
        path = self.path(parts)
        while not path.is_dir() and path != path.parent:
            path = path.parent
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def root_exists(self) -> bool:
        return self.root.is_dir()

    # -- removing ------------------------------------------------------------------------------
    def remove(self, parts: Parts) -> bool:
        path = self.path(parts)
        info = self.stat(parts)
        if info is None:
            return False
        try:
            if info.is_dir:
                shutil.rmtree(path)
            else:
                os.unlink(path)
            _fsync_dir(path.parent)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _typed(exc, f"{path}: removing", commit=False) from exc
        return True

    def remove_empty_folder(self, parts: Parts) -> bool:
        """``rmdir``: only a folder empty at that instant; never the root."""
        if not parts:
            return False
        try:
            os.rmdir(self.path(parts))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise _typed(exc, f"{self.path(parts)}: removing", commit=False) from exc
        return True

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "reason": "linkdir:// URL (a plugin backend)",
            "location": str(self.root),
            "capabilities": {
                k: getattr(self.capabilities, k) for k in Capabilities.__dataclass_fields__
            },
        }


class LinkFileSink(FileSink):
    """A staging file beside the destination, published by ``link`` or ``rename``."""

    def __init__(self, backend: LinkDirBackend, parts: Parts, mode: PutMode) -> None:
        self.final = backend.path(parts)
        self.mode = mode
        self.bytes_written = 0
        try:
            _make_dirs(self.final.parent)
            self.staging = self.final.with_name(staging_part(parts[-1]))
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self.fd: int | None = os.open(self.staging, flags, 0o644)
        except OSError as exc:
            raise _typed(exc, f"{self.final}: staging", commit=True) from exc

    def write(self, data: memoryview) -> None:
        assert self.fd is not None, "written after publish or abort"
        try:
            while data:
                n = os.write(self.fd, data)
                data = data[n:]
                self.bytes_written += n
        except OSError as exc:
            self.abort()
            raise _typed(exc, f"{self.final}: writing", commit=True) from exc

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert self.fd is not None, "published after publish or abort"
        try:
            os.fsync(self.fd)
            stored = os.fstat(self.fd).st_size
            os.close(self.fd)
            self.fd = None
            if stored != size:
                raise CommitError(f"{self.final}: {stored} bytes stored, {size} written")
            if self.mode is PutMode.CREATE:
                try:
                    os.link(self.staging, self.final)
                except FileExistsError as exc:
                    raise AlreadyExistsError(f"{self.final} already exists") from exc
                os.unlink(self.staging)
            else:
                os.replace(self.staging, self.final)
            _fsync_dir(self.final.parent)
        except CommitStoreError:  # typed already (AlreadyExistsError is an OSError too)
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise _typed(exc, f"{self.final}: publishing", commit=True) from exc
        except BaseException:
            self.abort()
            raise
        return CommitInfo(bytes_written=size)

    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.staging)


class _Moves:
    """The move-aside primitives (``aside.AsideMoves``) in one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def exists(self, name: str) -> bool:
        return os.path.lexists(self.folder / name)

    def move(self, src: str, dst: str) -> None:
        if self.exists(dst):  # callers hold the publish lock: no one else moves here
            raise FileExistsError(errno.EEXIST, "exists", str(self.folder / dst))
        os.rename(self.folder / src, self.folder / dst)

    def remove(self, name: str) -> None:
        path = self.folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


class LinkDirSink(DirSink):
    """A staging folder beside the destination, renamed into place under the publish lock."""

    def __init__(self, backend: LinkDirBackend, parts: Parts, mode: PutMode) -> None:
        self.backend = backend
        self.final = backend.path(parts)
        self.mode = mode
        try:
            _make_dirs(self.final.parent)
            self.local_path = self.final.with_name(staging_part(parts[-1]))
            os.mkdir(self.local_path)
        except OSError as exc:
            raise _typed(exc, f"{self.final}: staging", commit=True) from exc

    def publish(self) -> CommitInfo:
        info = CommitInfo(bytes_written=0)
        try:
            info.files = hash_and_sync_tree(self.local_path, info=info)
            info.bytes_written = sum(size for _p, size, _d in info.files)
            moves = _Moves(self.final.parent)
            with self.backend.publish_lock():
                if self.mode is PutMode.CREATE or not moves.exists(self.final.name):
                    if moves.exists(self.final.name):
                        raise AlreadyExistsError(f"{self.final} already exists")
                    moves.move(self.local_path.name, self.final.name)
                else:
                    aside.replace(moves, self.local_path.name, self.final.name, info.notes)
            _fsync_dir(self.final.parent)
        except CommitStoreError:  # typed already (AlreadyExistsError is an OSError too)
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise _typed(exc, f"{self.final}: publishing", commit=True) from exc
        except BaseException:
            self.abort()
            raise
        return info

    def abort(self) -> None:
        shutil.rmtree(self.local_path, ignore_errors=True)


def factory(url: str, options: dict[str, Any]) -> Backend:
    """``linkdir:///abs/path`` -> a :class:`LinkDirBackend` (no options).

    Raises:
        ConfigurationError: an option, or a URL without an absolute path, before any I/O.
    """
    take_options(options, {})
    path = url.removeprefix("linkdir://")
    if not path.startswith("/"):
        raise ConfigurationError(f"{url}: linkdir:// needs an absolute path (linkdir:///data)")
    return LinkDirBackend(path)
