"""The local commit protocol's two sinks: one file, one folder (see ``local.py``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from commitstore.backends.base import CommitInfo, DirSink, FileSink
from commitstore.backends.localtree import fsync_dir
from commitstore.backends.rename import _syscalls as _posix
from commitstore.backends.rename._localfs import (
    CommitPolicy,
    hash_and_sync_tree,
    os_error,
    publish_at,
    readback_digest,
    rmtree_at,
)
from commitstore.errors import AlreadyExistsError, CommitError
from commitstore.layout import Parts, staging_part

if TYPE_CHECKING:
    from commitstore.backends.rename.posix import LocalBackend

WRITEBACK_EVERY = 16 * 1024 * 1024
"""Start writeback of each finished 16 MiB range while later bytes are still written."""


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
