"""Hash a local file straight from the page cache (no copy into a read buffer), safely.

A full ``verify`` of a local file reads every byte once to hash it. When the file's pages are
already cached, a ``read`` copies each page into a buffer only for the hash to read it again;
hashing a shared read-only mapping of the file skips that copy. Mapping a file has two hazards a
read does not have, and :func:`hash_mapped` guards against both:

Each 8 MiB slice is mapped, hashed and unmapped in turn (so the process never maps more than
one slice: its RSS does not grow with the file).

- **A file that shrinks while mapped** (another process truncates it) makes any access past the
  new end raise SIGBUS, which kills the process. The mapping is used only under a read lease
  (``fcntl(F_SETLEASE, F_RDLCK)``): the kernel refuses the lease while anyone has the file open
  for writing, and while it is held, every ``open`` for writing and every ``truncate`` of the
  file waits (up to ``/proc/sys/fs/lease-break-time``, 45 s by default) until the holder lets
  go. The lease is polled (``F_GETLEASE``) before each slice is hashed; once a break is pending,
  the mapping is dropped, the lease released, and the rest of the file is read with ``pread``
  (whatever the writer left is what gets hashed, as a plain read would). The break notice is
  sent as SIGURG (ignored by default) instead of SIGIO (which would terminate the process); the
  mapped path is used only while the process has no handler of its own for SIGURG.
- **A read error** (a bad sector) while a mapped page is read in also raises SIGBUS. Each slice
  is first read in and mapped with ``madvise(MADV_POPULATE_READ)`` (Linux 5.14), which reports a
  failure as an error instead; the bytes are hashed from the mapping only after it succeeded.
  A slice it fails for is read with ``pread`` into a buffer, so a read error comes out as
  ``OSError``, as a plain read's would. The same call is what pages a cold file in (with
  ``MADV_SEQUENTIAL`` readahead), so cold files take the same path.

The residual risk: a page read in and then evicted (memory pressure) in the moment before it is
hashed, whose re-read then fails; or a holder stopped (SIGSTOP) past the lease-break time while
a writer truncates.

Whatever the mapped path cannot be used for (no lease: the file is open for writing somewhere,
not owned by this user, on a filesystem without leases; a kernel without MADV_POPULATE_READ; no
libc; a small file) returns None,
and the caller reads the file the plain way.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import io
import os
import signal
from typing import Any

from commitstore.backends.rename.posix._localfs import storage_error
from commitstore.digest import Hasher
from commitstore.errors import StorageError

SLICE = 8 * 1024 * 1024
"""The unit of the residency check, the lease poll and the fallback read."""
MIN_SIZE = 4 * 1024 * 1024
"""Smaller files are read the plain way (the mapping's set-up would cost more than the copy)."""

_PROT_READ, _MAP_SHARED, _MADV_SEQUENTIAL, _MADV_POPULATE_READ = 1, 1, 2, 22
_PAGE = os.sysconf("SC_PAGE_SIZE")
_NOTICE = signal.SIGURG

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    _mmap, _munmap, _madvise = _libc.mmap, _libc.munmap, _libc.madvise
except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
    _libc = None
else:
    _mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,
    ]
    _mmap.restype = ctypes.c_void_p
    _munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _notice_is_ours() -> bool:
    """True when the break notice (SIGURG) has no handler here: the default (ignore) or an
    explicit ignore. A handler installed outside Python shows as None: not ours to take."""
    try:
        return signal.getsignal(_NOTICE) in (signal.SIG_DFL, signal.SIG_IGN)
    except (ValueError, OSError):  # pragma: no cover
        return False


def _take_lease(fd: int) -> bool:
    """Set the break notice to SIGURG, then take a read lease; False (nothing held) if refused."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, _NOTICE)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EINVAL, errno.ENOLCK, errno.EPERM):
            return False
        raise
    return True


def _release_lease(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)


def _lease_held(fd: int) -> bool:
    """False once a break is pending (the kernel then reports F_UNLCK for the lease)."""
    return bool(fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK)


def _read_slice(fd: int, buf: memoryview, offset: int, h: Hasher) -> int:
    """pread up to ``len(buf)`` bytes at ``offset`` into ``buf`` and hash them; bytes read."""
    n = os.preadv(fd, [buf], offset)
    if n:
        h.update(buf[:n])
    return n


def hash_mapped(fd: int) -> tuple[int, str] | None:
    """(size, digest) of the whole file open read-only on ``fd``, hashed from the page cache
    (see the module docstring); None when the mapped path cannot be used (the caller then
    reads the file itself). Read errors raise OSError, as a read would."""
    if _libc is None or not _notice_is_ours():
        return None
    if os.fstat(fd).st_size < MIN_SIZE or not _take_lease(fd):
        return None
    try:
        return _hash(fd, os.fstat(fd).st_size)  # the size is stable while the lease is held
    finally:
        _release_lease(fd)
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETSIG, 0)


def _populate(addr: int, length: int) -> bool:
    """Read ``[addr, addr+length)`` in and map it (``MADV_POPULATE_READ``): True when every page
    is now mapped; False when the kernel could not (a read error, no memory, a kernel before
    5.14), reported as an error instead of the SIGBUS a plain access would raise."""
    return bool(_madvise(addr, length, _MADV_POPULATE_READ) == 0)


def _hash_slice(fd: int, offset: int, n: int, h: Hasher) -> bool:
    """Map ``n`` bytes at ``offset`` (one slice: the process maps at most this much at a time,
    so its RSS stays bounded), page them in and hash them; False (nothing hashed) when the
    slice could not be mapped or paged in."""
    addr = _mmap(None, n, _PROT_READ, _MAP_SHARED, fd, offset)
    if addr in (None, _MAP_FAILED):
        return False
    try:
        _madvise(addr, n, _MADV_SEQUENTIAL)
        if not _populate(addr, n):
            return False
        with memoryview((ctypes.c_char * n).from_address(addr)) as raw, raw.cast("B") as view:
            h.update(view)
        return True
    finally:
        _munmap(addr, n)


def _hash(fd: int, size: int) -> tuple[int, str]:
    h = Hasher()
    buf: memoryview | None = None
    offset = 0
    while offset < size:
        if not _lease_held(fd):
            break  # a writer waits: map nothing more
        n = min(SLICE, size - offset)
        if not _hash_slice(fd, offset, n, h):  # pread it: a read error comes out as OSError
            buf = buf or memoryview(bytearray(SLICE))
            n = _read_slice(fd, buf[:n], offset, h)
            if not n:
                return h.count, h.digest()  # shorter than it was (cannot happen leased)
        offset += n
    _release_lease(fd)  # the rest (after a break) and the end-of-file check are read plainly
    if not os.pread(fd, 1, offset):
        return h.count, h.digest()
    buf = buf or memoryview(bytearray(SLICE))
    while n := _read_slice(fd, buf, offset, h):
        offset += n
    return h.count, h.digest()


class ReadFile(io.FileIO):
    """An open file for reading whose read errors (EIO...) come out translated (StorageError),
    like every other call of the backend; still a real file (``fileno`` works).
    :meth:`whole_digest` hashes it from the page cache (:func:`hash_mapped`)."""

    def __init__(self, fd: int, shown: str) -> None:
        super().__init__(fd, "rb", closefd=True)
        self._shown = shown

    def whole_digest(self) -> tuple[int, str] | None:
        """(size, digest) of the whole file, hashed from the page cache where it is resident;
        None when the mapped path cannot be used (read the file instead). Read errors raise
        StorageError."""
        try:
            return hash_mapped(self.fileno())
        except OSError as exc:
            raise storage_error(exc, "reading", self._shown) from exc

    def pread(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset``, leaving the read position alone (``pread(2)``: safe
        from several threads at once); fewer only at the end of the file."""
        if self.closed:
            shown = self._shown
            raise StorageError(errno.EBADF, f"reading {shown} failed: closed", path=shown)
        try:
            data = os.pread(self.fileno(), n, offset)
            while 0 < len(data) < n:  # a short read before the end: read on
                more = os.pread(self.fileno(), n - len(data), offset + len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise storage_error(exc, "reading", self._shown) from exc
        return data

    def readinto(self, buffer: Any) -> int | None:
        try:
            return super().readinto(buffer)
        except OSError as exc:
            raise storage_error(exc, "reading", self._shown) from exc

    def readall(self) -> bytes:
        try:
            return super().readall()
        except OSError as exc:
            raise storage_error(exc, "reading", self._shown) from exc

    def read(self, size: int | None = -1) -> bytes:
        try:
            return super().read(size)
        except OSError as exc:
            raise storage_error(exc, "reading", self._shown) from exc

    def close(self) -> None:
        """Nothing of a file opened to read is unflushed: an error of close(2) (EIO from a
        network client) loses nothing, and the descriptor is released anyway, so it is not
        raised (as for every descriptor the backend opens only to read)."""
        with contextlib.suppress(OSError):
            super().close()
