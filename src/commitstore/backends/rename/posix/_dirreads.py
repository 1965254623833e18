"""Safe reads of local files relative to an open folder: the one open-and-check of a file to
read (``open_read`` and scans share it), and :class:`FolderReader`, which reads many small files
(a scan's records) below one folder through directory descriptors held for the whole scan.

Every open is ``openat`` relative to a directory descriptor with ``O_NOFOLLOW|O_NONBLOCK``, and
the opened descriptor is checked with ``fstat`` before anything is read: a symlink is never
followed (in a folder on the way either: folders are opened one part at a time, ``O_NOFOLLOW``),
a FIFO never blocks, a socket or device is never read. A scan of N records in one folder opens
that folder once and each record once, instead of walking from the root again for every record.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat as statmod
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from commitstore._recordrules import RecordFormatError
from commitstore.backends.localtree import close_quietly
from commitstore.backends.rename.posix._localfs import kind_of, not_regular, storage_error
from commitstore.errors import InvalidNameError, NotFoundError, StoragePathError
from commitstore.layout import Parts

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_READ_CHUNK = 64 * 1024


def open_regular(dirfd: int, name: str, shown: Callable[[], str]) -> tuple[int, os.stat_result]:
    """Open the regular file ``name`` of the folder ``dirfd`` to read (blocking again once it is
    known to be one); return its descriptor and ``fstat``. ``shown()`` names it in errors.

    Raises:
        NotFoundError: nothing there. IntegrityError (``size_mismatch``): a folder, symlink,
            FIFO, socket or device (a record's path holding a folder is a bad record, never
            "no record"; a file artifact's, a mismatch, as ``verify`` says). OSError: anything
            else (the caller translates).
    """
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dirfd)
    except FileNotFoundError as exc:
        raise NotFoundError(f"{shown()} does not exist") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise not_regular(shown(), "a symlink; not followed") from exc
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):
            raise not_regular(shown(), "a socket or device") from exc
        raise
    try:
        st = os.fstat(fd)
        if not statmod.S_ISREG(st.st_mode):  # a folder too: something stands there
            raise not_regular(shown(), kind_of(st.st_mode))
        fcntl.fcntl(fd, fcntl.F_SETFL, 0)  # blocking again: of READ_FLAGS, F_SETFL sets only that
    except BaseException:
        close_quietly(fd)
        raise
    return fd, st


def read_all(fd: int, size_hint: int, max_bytes: int | None) -> bytes:
    """The bytes of ``fd`` from its offset to the end (``size_hint``: its expected length), or
    the first ``max_bytes + 1`` of them when there are more: the caller then refuses the file as
    too large, and nothing past that is read."""
    cap = sys.maxsize if max_bytes is None else max_bytes + 1
    chunks = []
    total = 0
    want = size_hint + 1  # one read for the whole file, and the next one sees its end
    while total < cap:
        asked = max(1, min(want, cap - total))
        chunk = os.read(fd, asked)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if len(chunk) < asked and total >= size_hint:
            break  # a short read of a regular file is its end, and the whole file was read
        want = _READ_CHUNK
    return b"".join(chunks)


class _Opener(Protocol):
    def open_dir(self, parts: Parts, *, create: bool) -> int: ...

    def path_of(self, parts: Parts) -> str: ...

    def drop_cached(self, fd: int) -> None: ...


class FolderReader:
    """Reads whole small files below the folder ``folder`` (relative to a backend's root).

    The folder is opened once, on the first read; the subfolder of the latest read stays open
    too, so files read folder by folder (a walk's order) cost one ``openat`` each. Thread-safe
    (reads are serialised). :meth:`close` releases every descriptor.
    """

    def __init__(self, backend: _Opener, folder: Parts, max_bytes: int | None) -> None:
        self._backend = backend
        self._folder = folder
        self._max_bytes = max_bytes
        self._top: int | Exception | None = None
        self._sub: tuple[Parts, int | Exception] | None = None
        self._lock = threading.Lock()

    def read(self, rel: Parts) -> tuple[bytes, None]:
        """All bytes of the file ``rel`` below the folder (at most ``max_bytes + 1``) and no tag.

        Raises:
            RecordFormatError: larger than ``max_bytes`` (by its ``fstat``: nothing read).
            NotFoundError: gone. IntegrityError (``size_mismatch``): a folder, symlink,
                FIFO, socket or device there or a symlinked folder on the way. StorageError,
                BackendUnavailableError...: a read error, translated.
        """
        try:
            with self._lock:
                dirfd = self._dir(rel[:-1], rel)
                fd, st = open_regular(dirfd, rel[-1], lambda: self._shown(rel))
            try:
                if self._max_bytes is not None and st.st_size > self._max_bytes:
                    raise RecordFormatError(  # refused from its size, before any byte is read
                        f"{self._shown(rel)} is {st.st_size} bytes, more than {self._max_bytes}"
                    )
                self._backend.drop_cached(fd)
                return read_all(fd, st.st_size, self._max_bytes), None
            finally:
                close_quietly(fd)
        except OSError as exc:
            raise storage_error(exc, "reading", self._shown(rel)) from exc

    def _shown(self, rel: Parts) -> str:
        """The file ``rel`` below the folder as errors name it (built only for an error)."""
        return self._backend.path_of((*self._folder, *rel))

    def _dir(self, sub: Parts, rel: Parts) -> int:
        """The open folder ``sub`` below the folder (under the lock), to read ``rel``."""
        if self._top is None:
            try:
                self._top = self._backend.open_dir(self._folder, create=False)
            except (FileNotFoundError, NotADirectoryError, InvalidNameError) as exc:
                self._top = exc
        if not sub:
            return self._check(self._top, rel)
        if self._sub is None or self._sub[0] != sub:
            self._drop_sub()
            self._sub = (sub, self._open_sub(self._check(self._top, rel), sub))
        return self._check(self._sub[1], rel)

    def _check(self, opened: int | Exception, rel: Parts) -> int:
        if isinstance(opened, int):
            return opened
        shown = self._shown(rel)
        if isinstance(opened, InvalidNameError):
            raise not_regular(shown, "a folder on its path is a symlink") from opened
        raise NotFoundError(f"{shown} does not exist") from opened

    @staticmethod
    def _open_sub(top: int, sub: Parts) -> int | Exception:
        """``sub`` opened from ``top`` one part at a time (``O_NOFOLLOW``), or why it cannot be:
        FileNotFoundError, or StoragePathError for a symlink or a file on the way."""
        fd = top
        try:
            for part in sub:
                try:
                    nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError as exc:
                    return exc
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        return StoragePathError(exc.errno, f"{part!r} is a symlink or not a folder")
                    raise
                if fd != top:
                    close_quietly(fd)
                fd = nfd
            opened, fd = fd, top
            return opened
        finally:
            if fd != top:
                close_quietly(fd)

    def _drop_sub(self) -> None:
        if self._sub is not None and isinstance(self._sub[1], int):
            close_quietly(self._sub[1])
        self._sub = None

    def close(self) -> None:
        """Release the descriptors. Idempotent."""
        with self._lock:
            self._drop_sub()
            if isinstance(self._top, int):
                close_quietly(self._top)
            self._top = None
