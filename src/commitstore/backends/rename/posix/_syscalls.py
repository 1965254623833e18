"""Thin wrappers over POSIX calls Python's ``os`` does not expose: renameat2 and sync_file_range."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
SYNC_FILE_RANGE_WRITE = 2

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
except OSError:  # pragma: no cover - non-glibc platforms
    _libc = None

_renameat2 = getattr(_libc, "renameat2", None) if _libc is not None else None
if _renameat2 is not None:
    _renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    _renameat2.restype = ctypes.c_int

_sync_file_range = getattr(_libc, "sync_file_range", None) if _libc is not None else None
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int


def renameat2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    """``renameat2(2)``. Raises OSError; ENOSYS/EINVAL when the kernel or filesystem lacks it."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    rc = _renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing back a finished range (does not wait). Best effort."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)
