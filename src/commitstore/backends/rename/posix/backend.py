"""The local POSIX strategy (``local-rename``): its rename primitives and policy. The recipe
itself is ``sink.py``; mounted bridges and the choice between the two are ``bridge.py``.

Every operation walks from the root with directory file descriptors opened ``O_NOFOLLOW``, so no
symlink inside the tree can redirect a write (or a read) outside the root. Opening a store
creates its root folder (the CLI refuses a local path that names no folder before opening it).

Errors: inside the commit recipe every ``OSError`` goes through :meth:`LocalBackend.error`
(``_localfs.os_error``); every other public method translates through ``_localfs.storage_error``
(``_localfs.translated``), so no raw ``OSError`` leaves this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import logging
import os
import stat as statmod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO

from commitstore.backends.base import Capabilities, CommitInfo, FileInfo, PutMode
from commitstore.backends.localtree import close_quietly, fsync_dir
from commitstore.backends.rename import _earlysync
from commitstore.backends.rename.ops import CommitPolicy
from commitstore.backends.rename.posix import _forkheld, _liveness, _syscalls
from commitstore.backends.rename.posix._direct import ALIGN, DirectWriter, set_direct
from commitstore.backends.rename.posix._dirreads import DIR_FLAGS, FolderReader, open_regular
from commitstore.backends.rename.posix._heldfolders import HeldFolders
from commitstore.backends.rename.posix._localfs import (
    not_regular,
    os_error,
    publish_at,
    readback_digest,
    rmtree_at,
    stat_info,
    storage_error,
    translated,
)
from commitstore.backends.rename.posix._localwalk import files_below, folders_below, stats_below
from commitstore.backends.rename.posix._maphash import ReadFile
from commitstore.backends.rename.posix._waitlock import LOCK_TIMEOUT, flock_within
from commitstore.backends.rename.sink import RenameBackend
from commitstore.digest import READ_CHUNK
from commitstore.errors import (
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
    StorageError,
    StoragePathError,
)
from commitstore.layout import META_DIR, Parts

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

WRITEBACK_EVERY = 16 * 1024 * 1024
"""Start writeback of each finished 16 MiB range while later bytes are still written."""
DIRECT_AFTER = 4 * 1024 * 1024
"""A staging file's bytes past this offset are written with direct I/O (``_direct``), where the
backend allows it (:attr:`LocalBackend.direct_io`) and the filesystem takes it."""

LOCAL_POLICY = CommitPolicy()


@dataclasses.dataclass(slots=True)
class Staging:
    """An open staging file: its fd, bytes written, and how far writeback was started."""

    fd: int
    written: int = 0
    synced: int = 0
    closed: bool = False
    direct: DirectWriter | None = None
    tried_direct: bool = False
    sync: Future[None] | None = None
    """The early ``fsync`` of a buffered file (``_earlysync``), once its commit began."""


_LOCK_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def _not_a_folder(dirfd: int, part: str, shown: str) -> StoragePathError:
    """The error of ``part`` of ``dirfd``, found on a path where a folder should be: ``ELOOP``
    for a symlink (never followed below the root), ``ENOTDIR`` for anything else."""
    try:
        link = statmod.S_ISLNK(os.lstat(part, dir_fd=dirfd).st_mode)
    except OSError:
        link = False
    if link:
        return StoragePathError(
            errno.ELOOP,
            f"{shown}: {part!r} is a symlink; commitstore never follows symlinks below the root",
            path=shown,
        )
    return StoragePathError(errno.ENOTDIR, f"{shown}: {part!r} is not a folder", path=shown)


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
    lock_timeout = LOCK_TIMEOUT
    """Seconds a publish-lock waiter waits before it raises BackendUnavailableError (storage
    option ``lock_timeout``; ``_waitlock``)."""
    direct_io = True
    """Large staging files are written with ``O_DIRECT`` (``_direct``); bridges turn it off."""
    rereads_locally = True
    """Readers are local files (:class:`ReadFile`, with ``pread``) read from the page cache."""

    def __init__(
        self, root: str | os.PathLike[str], *, reason: str = "local path", direct_io: bool = True
    ) -> None:
        """``direct_io=False``: never write with ``O_DIRECT`` (a copy that is read right after,
        which buffered writes leave in the page cache)."""
        self.root = os.path.abspath(os.fspath(root))
        self.reason = reason
        if not direct_io:
            self.direct_io = False
        # Opening creates nothing: the root is made by the first write (``open_dir(create=True)``).

    def root_exists(self) -> bool:
        """Whether the store's root folder exists (a symlink to a folder counts)."""
        return os.path.isdir(self.root)

    def _make_root(self) -> None:
        """Create the root and its missing parents, each made durable in its parent folder."""
        missing: list[str] = []
        path = self.root
        while not os.path.isdir(path):
            missing.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        for folder in reversed(missing):
            try:
                os.mkdir(folder, 0o777)
            except FileExistsError:
                pass
            except OSError as exc:
                raise storage_error(exc, "creating the store's folder", self.root) from exc
            parent_fd = os.open(
                os.path.dirname(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            )
            try:
                fsync_dir(parent_fd, CommitInfo(0), self.policy.dir_fsync_tolerated)
            finally:
                close_quietly(parent_fd)

    def __repr__(self) -> str:
        return f"LocalBackend({self.root!r})"

    def local_root(self) -> str:
        """The root with symlinks resolved (it need not exist yet)."""
        return os.path.realpath(self.root)

    def place(self) -> tuple[str, ...]:
        """``("file", *parts of the resolved root)``."""
        return ("file", *Path(self.local_root()).parts)

    def path_of(self, parts: Parts) -> str:
        """The absolute path of ``parts`` (for messages and for tools outside the store)."""
        return os.path.join(self.root, *parts)

    def local_path(self, parts: Parts) -> Path | None:
        """The path of ``parts`` below the root (:meth:`path_of`)."""
        return Path(self.path_of(parts))

    def hold_folder(
        self, parts: Parts, *, move_from: str | None = None, own: object | None = None
    ) -> object | None:
        """A shared ``flock`` on the staging folder itself, made if missing (its parents
        too), or with ``move_from`` that local folder renamed onto it (only while no writer
        but the holder of ``own`` holds it), under the folder's creation lock
        (``_liveness.hold_shared_folder``)."""
        dirfd = self.open_dir(parts[:-1], create=True)
        try:
            return _liveness.hold_shared_folder(dirfd, parts[-1], move_from=move_from, own=own)
        finally:
            os.close(dirfd)

    def release_folder(self, held: object) -> None:
        self.release(held)

    def make_folders(self, parts: Parts) -> None:
        os.close(self.open_dir(parts, create=True))

    # -- directory walking -------------------------------------------------------------
    _held: HeldFolders | None = None
    """The folders kept open while this backend's publish lock is held (``_heldfolders``)."""

    def open_dir(self, parts: Parts, *, create: bool) -> int:
        """Open the folder ``parts`` below the root without following symlinks; return its fd.
        With ``create`` missing folders are made. During a hold of kept folders
        (``_heldfolders``: under the publish lock, or :meth:`folders_kept`), in the thread
        that made it, the walk starts from the deepest folder of ``parts`` kept by this hold
        and keeps the ones it opens."""
        held = self._held
        if held is None or not held.usable():
            return self._walk(parts, create, None)
        start = held.deepest(parts)
        if start is not None and start[0] == len(parts):
            return held.lend(start[1])
        return self._walk(parts, create, held, start)

    def _lent_dir(self, parts: Parts, *, create: bool) -> tuple[int, bool]:
        """:meth:`open_dir`, except that a folder this thread's hold keeps is lent as it is
        (no ``dup``): ``(fd, own)``, and the caller closes ``fd`` only if ``own``. For a use
        that ends before anything else runs on this backend (one stat, one open, a rename and
        its folder's sync; never a removal, which would close the kept ones)."""
        held = self._held
        if held is not None and held.usable():
            start = held.deepest(parts)
            if start is not None and start[0] == len(parts):
                return start[1], False
        return self.open_dir(parts, create=create), True

    def _walk(
        self,
        parts: Parts,
        create: bool,
        held: HeldFolders | None,
        start: tuple[int, int] | None = None,
    ) -> int:
        """The walk of :meth:`open_dir`, from ``start`` (a kept folder, lent: never closed
        here) or from the root. Each folder it leaves is closed, or handed to ``held`` when
        that keeps it; the one returned is the caller's (a ``dup`` when ``held`` keeps it)."""
        if start is not None:
            done, fd = start
            own = False
        else:
            done, fd = 0, self._open_root(create)
            own = True
        at = done  # fd is the folder parts[:at]
        try:
            for i in range(done, len(parts)):
                part = parts[i]
                try:
                    nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                        fsync_dir(fd, CommitInfo(0), self.policy.dir_fsync_tolerated)
                    except FileExistsError:
                        pass
                    nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _not_a_folder(fd, part, self.path_of(parts)) from exc
                    raise
                if own:
                    self._leave(held, parts[:i], fd)
                fd, own, at = nfd, True, i + 1
            if held is not None and held.wants(parts):
                held.take(parts, fd)
                own = False  # the hold's own now, even if no dup of it can be made
                fd = held.lend(fd)
        except BaseException:
            if own:  # the deepest folder reached (kept, as any folder the walk left)
                self._leave(held, parts[:at], fd)
            raise
        return fd

    @staticmethod
    def _leave(held: HeldFolders | None, parts: Parts, fd: int) -> None:
        """A walk is done with the folder ``parts`` (its own ``fd``): kept, or closed."""
        if held is not None and held.wants(parts):
            held.take(parts, fd)
        else:
            close_quietly(fd)

    def _open_root(self, create: bool) -> int:
        try:
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                raise
            self._make_root()
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _forget_held(self) -> None:
        """Before a folder is removed: no folder kept open under the lock is used again."""
        held = self._held
        if held is not None and held.usable():
            held.forget()

    # -- rename primitives (see sink.RenameOps) --------------------------------------------
    def shown(self, parts: Parts) -> str:
        return self.path_of(parts)

    def open_folder(self, parts: Parts) -> int:
        return self.open_dir(parts, create=True)

    def close_folder(self, folder: int) -> None:
        close_quietly(folder)

    def create_staging(self, folder: int, name: str) -> Staging:
        return Staging(os.open(name, _CREATE_FLAGS, 0o666, dir_fd=folder))

    def write(self, handle: Staging, data: memoryview) -> int:
        if handle.direct is not None:
            n = handle.direct.write(data)
            handle.written += n
            return n
        if self.direct_io and not handle.tried_direct:
            if handle.written < DIRECT_AFTER:  # the bytes up to DIRECT_AFTER go buffered
                data = data[: DIRECT_AFTER - handle.written]
            elif handle.written % ALIGN:  # (after a short write) up to an aligned offset
                data = data[: ALIGN - handle.written % ALIGN]
            else:
                handle.tried_direct = True
                if set_direct(handle.fd, True):
                    # the buffered head is written back while the direct writes run
                    _syscalls.start_writeback(
                        handle.fd, handle.synced, handle.written - handle.synced
                    )
                    handle.synced = handle.written
                    handle.direct = DirectWriter(handle.fd)
                    return self.write(handle, data)
        n = os.write(handle.fd, data)
        handle.written += n
        if handle.written - handle.synced >= WRITEBACK_EVERY:
            _syscalls.start_writeback(handle.fd, handle.synced, handle.written - handle.synced)
            handle.synced = handle.written
        return n

    def prepare(self, handle: Staging) -> None:
        """At commit, before the pending record is written: the file's ``fsync`` is started
        in a worker (the direct writer's own, or ``_earlysync`` for a buffered file), so it
        runs while the pending record is written; :meth:`finish` waits for it."""
        if handle.direct is not None:
            handle.direct.start_sync()
        elif handle.sync is None and not handle.closed:
            handle.sync = _earlysync.start_fsync(handle.fd)

    def finish(self, handle: Staging) -> int:
        try:
            if handle.direct is not None:
                handle.direct.flush()
            if handle.sync is not None:
                sync, handle.sync = handle.sync, None
                sync.result()  # the early fsync's error, if it met one
            elif handle.direct is None or not handle.direct.synced:
                os.fsync(handle.fd)
            return os.fstat(handle.fd).st_size
        finally:
            self.discard(handle)

    def discard(self, handle: Staging) -> None:
        if not handle.closed:
            handle.closed = True
            try:
                if handle.sync is not None:
                    _earlysync.wait_quietly(handle.sync)
                if handle.direct is not None:
                    handle.direct.close()
            finally:
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
            self._forget_held()
            rmtree_at(folder, name)
        else:
            os.unlink(name, dir_fd=folder)

    def staging_folder(self, folder: int, parts: Parts) -> Path:
        os.mkdir(parts[-1], 0o777, dir_fd=folder)
        return Path(self.path_of(parts))

    def hold(self, folder: int, name: str) -> object | None:
        """A shared ``flock`` on the staging entry itself (a folder's own fd: no file is added
        to what the caller fills), held on an fd kept open until :meth:`release`."""
        return _liveness.hold(folder, name)

    def creating(self, folder: int) -> contextlib.AbstractContextManager[None]:
        return _liveness.creating(folder)

    def still_held(self, folder: int, name: str, token: object) -> bool:
        return _liveness.same_entry(folder, name, token)

    def release(self, token: object) -> None:
        _liveness.release(token)

    def folder_in_place(self, folder: int, parts: Parts) -> bool:
        """The folder at ``parts``' path (not followed if a link) is the one ``folder`` holds:
        the same device and inode. One stat."""
        try:
            at = os.stat(os.path.join(self.root, *parts), follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(folder)
        return (at.st_dev, at.st_ino) == (held.st_dev, held.st_ino)

    def held(self, parts: Parts) -> bool:
        """True if a live writer holds the staging entry ``parts`` (:meth:`hold`)."""
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (OSError, InvalidNameError):
            return False
        try:
            return _liveness.is_held(dirfd, parts[-1])
        finally:
            close_quietly(dirfd)

    def claimed(self, parts: Parts) -> contextlib.AbstractContextManager[str | None]:
        """gc's exclusive ``flock`` on the staging entry ``parts`` (``_liveness.claimed``)."""
        return _liveness.claimed(lambda: self.open_dir(parts[:-1], create=False), parts[-1])

    def error(self, exc: Exception, what: str, shown: str) -> Exception:
        return os_error(exc, what, shown)

    # -- Backend API -------------------------------------------------------------------
    @translated("opening")
    def open_read(self, parts: Parts) -> BinaryIO:
        """Open a regular file for reading. Opened ``O_NONBLOCK|O_NOFOLLOW`` and checked with
        ``fstat`` before anything is read (``_dirreads.open_regular``), so a FIFO never blocks
        and a symlink is never followed: both (and sockets, devices, symlinked folders on the
        way) raise IntegrityError."""
        try:
            dirfd, own = self._lent_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFoundError(f"{self.path_of(parts)} does not exist") from exc
        except InvalidNameError as exc:
            raise not_regular(self.path_of(parts), "a folder on its path is a symlink") from exc
        try:
            fd, _st = open_regular(dirfd, parts[-1], lambda: self.path_of(parts))
        finally:
            if own:
                close_quietly(dirfd)
        try:
            self.drop_cached(fd)
        except BaseException:
            close_quietly(fd)
            raise
        raw: Any = ReadFile(fd, self.path_of(parts))
        return io.BufferedReader(raw, READ_CHUNK)

    def drop_cached(self, fd: int) -> None:
        """Called on every file opened to read, before it is read: local disks keep their
        cached pages (bridges drop them, so checks see what the far side holds)."""

    @contextlib.contextmanager
    def small_reads(
        self, folder: Parts, *, max_bytes: int | None = None
    ) -> Iterator[Callable[[Parts], tuple[bytes, str | None]]]:
        """Reads below ``folder`` through one directory descriptor held until the block ends
        (``_dirreads.FolderReader``): one ``openat`` per file instead of a walk from the root;
        the same checks as :meth:`open_read` (never a symlink followed, a FIFO opened, a socket
        or device read), and at most ``max_bytes + 1`` bytes read of each file."""
        reader = FolderReader(self, folder, max_bytes)
        try:
            yield reader.read
        finally:
            reader.close()

    @translated("checking")
    def stat(self, parts: Parts) -> FileInfo | None:
        try:
            dirfd, own = self._lent_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError, InvalidNameError):
            return None
        try:
            st = os.stat(parts[-1], dir_fd=dirfd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            if own:
                close_quietly(dirfd)
        return stat_info(st)

    @translated("listing")
    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        try:
            topfd = self.open_dir(parts, create=False)
        except (FileNotFoundError, NotADirectoryError, InvalidNameError):
            return []
        try:
            return files_below(topfd)
        finally:
            close_quietly(topfd)

    @translated("listing")
    def walk_folders(self, parts: Parts) -> list[Parts]:
        try:
            topfd = self.open_dir(parts, create=False)
        except (FileNotFoundError, NotADirectoryError, InvalidNameError):
            return []
        try:
            return folders_below(topfd)
        finally:
            close_quietly(topfd)

    @translated("checking")
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
            close_quietly(dirfd)
        if statmod.S_ISDIR(stats[0].st_mode):
            try:
                topfd = self.open_dir(parts, create=False)
            except (FileNotFoundError, NotADirectoryError, InvalidNameError):
                return None
            try:
                stats += stats_below(topfd)
            finally:
                close_quietly(topfd)
        if any(st.st_mtime <= 0 for st in stats):
            return None
        return max(max(st.st_mtime, st.st_ctime) for st in stats)

    @translated("removing")
    def remove(self, parts: Parts, *, durable: bool = True) -> bool:
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            if self.size_of(dirfd, parts[-1]) is None:
                return False
            self.remove_at(dirfd, parts[-1])
            if durable:
                fsync_dir(dirfd, CommitInfo(0), self.policy.dir_fsync_tolerated)
            return True
        finally:
            close_quietly(dirfd)

    def remove_leftover(self, parts: Parts) -> bool:
        """:meth:`remove` without the folder fsync (see ``Backend.remove_leftover``)."""
        return self.remove(parts, durable=False)

    def publish_small_from(self, src: Parts, dst: Parts, *, mode: PutMode) -> CommitInfo | None:
        """``Backend.publish_small_from`` on a local filesystem: :meth:`rename` of ``src`` onto
        ``dst`` (``publish_at``: ``renameat2(RENAME_NOREPLACE)`` for ``CREATE``, ``rename``
        for ``REPLACE``; one step either way, so a crash leaves the file under exactly one of
        the two names), then the folder's fsync. The file's bytes were fsynced when ``src`` was
        written and a rename moves the name, not the bytes: no file sync is repeated. A refused
        folder sync marks the info not durable (as step 8 of ``sink.py``)."""
        shown = self.path_of(dst)
        if src[:-1] != dst[:-1]:
            raise CommitError(f"{self.path_of(src)}: not beside {shown}")
        info = CommitInfo(0)
        try:
            dirfd, own = self._lent_dir(dst[:-1], create=False)
            try:
                self.rename(dirfd, src[-1], dst[-1], mode=mode, is_dir=False, info=info)
                try:
                    fsync_dir(dirfd, info, self.policy.dir_fsync_tolerated)
                except OSError as exc:
                    info.durable = False
                    info.notes.append(
                        f"{shown} is published, but syncing its folder failed "
                        f"({exc.strerror}): durability unconfirmed"
                    )
            finally:
                if own:
                    close_quietly(dirfd)
        except CommitStoreError:
            raise
        except OSError as exc:
            raise storage_error(exc, "publishing", shown) from exc
        return info

    def put_pending(self, parts: Parts, body: bytes) -> CommitInfo | None:
        """``Backend.put_pending`` on a local disk: the pending record is created in place
        (any earlier one unlinked first; ``O_CREAT|O_EXCL|O_NOFOLLOW``, so no link is followed
        and no other file's bytes are ever truncated), written, then its file's ``fsync`` runs
        in a worker (``_earlysync``) while its folder is fsynced here; both are waited for
        before this returns. Two syncs in flight, which the filesystem can make durable in one
        journal commit, instead of a file sync, a rename, then a folder sync, one after the
        other. The ordering the commit needs is unchanged: the pending record's bytes and name
        are durable before the data's rename is issued. A crash before that leaves no pending
        record, an empty or torn one, or the whole one: the data is not renamed yet, so the name
        verifies as its old version in every case (``Backend.put_pending``). A failed folder
        sync is the returned info's "durability unconfirmed" (:meth:`_sync_pending_folder`);
        any other failure raises (the commit then fails with nothing published) after removing
        the file, best effort."""
        shown = self.path_of(parts)
        info = CommitInfo(len(body))
        try:
            dirfd, own = self._lent_dir(parts[:-1], create=True)
        except CommitStoreError:
            raise
        except OSError as exc:
            raise os_error(exc, "creating the folder of", shown) from exc
        fd = -1
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(parts[-1], dir_fd=dirfd)
            fd = os.open(parts[-1], _CREATE_FLAGS, 0o666, dir_fd=dirfd)
            view = memoryview(body)
            while view.nbytes:
                view = view[os.write(fd, view) :]
            sync = _earlysync.start_fsync(fd)
            try:
                self._sync_pending_folder(dirfd, info, shown)
            finally:
                _earlysync.wait_quietly(sync)
            sync.result()  # the file's fsync error, if it met one
            if os.fstat(fd).st_size != len(body):
                raise CommitError(f"{shown}: {len(body)} bytes written, size differs after fsync")
            return info
        except BaseException as exc:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.unlink(parts[-1], dir_fd=dirfd)
            if isinstance(exc, OSError):
                raise os_error(exc, "writing the pending record", shown) from exc
            raise
        finally:
            if fd >= 0:
                close_quietly(fd)
            if own:
                close_quietly(dirfd)

    def _sync_pending_folder(self, dirfd: int, info: CommitInfo, shown: str) -> None:
        """The pending record's folder sync. A failure (EIO, or a tolerated EINVAL) is not
        raised, as for any folder sync of a small file's publish (step 8 of ``sink.py``): the
        commit goes on with its durability unconfirmed (``info``, which the commit reports)."""
        try:
            fsync_dir(dirfd, info, self.policy.dir_fsync_tolerated)
        except OSError as exc:
            info.durable = False
            info.notes.append(
                f"{shown} is written, but syncing its folder failed ({exc.strerror}): "
                "durability unconfirmed"
            )

    @translated("removing")
    def remove_empty_folder(self, parts: Parts) -> bool:
        """``rmdir``: removes the folder only if it is empty at that instant (a file that
        appears meanwhile is never removed). Never the root, never through a symlink."""
        if not parts:
            return False
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            self._forget_held()
            os.rmdir(parts[-1], dir_fd=dirfd)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        finally:
            close_quietly(dirfd)
        return True

    @contextlib.contextmanager
    def publish_lock(self) -> Iterator[None]:
        """``flock`` on ``<root>/.commitstore/lock`` (released by the kernel if the holder dies;
        a child forked while it is held does not keep it: ``_forkheld``).

        Raises:
            InsufficientSpaceError, StorageError, BackendUnavailableError: the lock file could not
                be created, opened or locked (nothing is done under it).
        """
        held = HeldFolders()  # the lock's own walk is kept, for use once the lock is held
        try:
            fd = self._lock_fd((META_DIR, "lock"), held)
        except BaseException:
            held.forget()
            raise
        self._held = held
        try:
            yield
        finally:
            self._held = None
            held.forget()
            _forkheld.close(fd)

    @contextlib.contextmanager
    def folders_kept(self) -> Iterator[None]:
        """Outside the publish lock, around the checks a commit makes before it stages: the
        root and the metadata folders they walk to are kept open until the block ends
        (``_heldfolders``), so the hierarchy check and the record's absence walk to the records
        folder once. These checks only read; the commit repeats the hierarchy check under the
        lock, and its publish refuses a taken name atomically (``renameat2(RENAME_NOREPLACE)``),
        so a folder another process changes meanwhile is no more than a race lost a moment
        earlier. Inside another hold (the lock's), or in a thread other than the one that made
        it, nothing more is kept."""
        if self._held is not None:
            yield
            return
        held = HeldFolders()
        self._held = held
        try:
            yield
        finally:
            if self._held is held:
                self._held = None
            held.forget()

    @contextlib.contextmanager
    def read_lock(self) -> Iterator[None]:
        """The publish lock taken without writing: the existing lock file is opened (read-only
        where the storage refuses writes; ``flock`` needs no write access) and never created,
        so a check on a read-only mount of a store still waits out a writer publishing through
        another mount of it. No lock file (no writer
        ever published here), or one that cannot be opened or locked: nothing is held
        (``Backend.read_lock``)."""
        try:
            fd = self._read_lock_fd((META_DIR, "lock"))
        except (StorageError, InsufficientSpaceError, NotFoundError, IntegrityError) as exc:
            logging.getLogger("commitstore").debug("checking without the publish lock: %s", exc)
            fd = None
        try:
            yield
        finally:
            if fd is not None:
                _forkheld.close(fd)

    @translated("locking")
    def _read_lock_fd(self, parts: Parts) -> int | None:
        try:
            dirfd = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError, InvalidNameError):
            return None
        try:
            with _forkheld.no_fork():  # tracked before it is locked (``_forkheld``)
                fd = self._open_lock_file(dirfd, parts)
                if fd is not None:
                    _forkheld.track(fd)
        finally:
            close_quietly(dirfd)
        if fd is None:
            return None
        try:
            flock_within(fd, self.lock_timeout, self.path_of(parts))
        except BaseException:
            _forkheld.close(fd)
            raise
        return fd

    def _open_lock_file(self, dirfd: int, parts: Parts) -> int | None:
        """The existing lock file, opened for reading and writing where the storage allows it
        (an emulated ``flock``, as on NFS, needs write access), else read-only; never created,
        never a FIFO waited on. None if there is none."""
        shown = self.path_of(parts)
        try:
            fd = os.open(parts[-1], _LOCK_OPEN_FLAGS, dir_fd=dirfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            try:
                return open_regular(dirfd, parts[-1], lambda: shown)[0]
            except NotFoundError:
                return None
        try:
            if not statmod.S_ISREG(os.fstat(fd).st_mode):
                raise not_regular(shown, "not a regular file")
        except BaseException:
            close_quietly(fd)
            raise
        return fd

    @translated("locking")
    def _lock_fd(self, parts: Parts, held: HeldFolders | None = None) -> int:
        dirfd = self._walk(parts[:-1], True, held)
        try:
            with _forkheld.no_fork():  # tracked before it is locked (``_forkheld``)
                fd = _forkheld.track(
                    os.open(
                        parts[-1],
                        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o666,
                        dir_fd=dirfd,
                    )
                )
        finally:
            close_quietly(dirfd)
        try:
            flock_within(fd, self.lock_timeout, self.path_of(parts))
        except BaseException:
            _forkheld.close(fd)
            raise
        return fd

    @translated("checking the free space of")
    def free_space(self, parts: Parts) -> int | None:
        path = self.root  # before the first write, the nearest folder that exists
        while not os.path.isdir(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
