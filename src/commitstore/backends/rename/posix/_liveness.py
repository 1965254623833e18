"""A writer's proof of life on a local filesystem: a ``flock`` held on its staging entry.

A writer (a staging file's sink, a ``stage_dir`` staging folder) takes a shared ``flock`` on an
fd of the entry itself and keeps it for its life; the kernel drops it when the process dies
(SIGKILL included). gc tries an exclusive, non-blocking ``flock`` on the same entry before it
removes it: refused means a live writer holds it, and it is kept whatever its age. The fd also
pins the entry's identity (device and inode): a staging folder removed and made again under a
writer (by another tool, or a ``copytree(..., dirs_exist_ok=True)`` refilling it) is not the
one it locked, so its commit fails instead of publishing what is there.

Where ``flock`` is not supported (some network filesystems) nothing is held: the entry is aged
by its modification times as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Held:
    """An open, locked fd of a staging entry, and the entry's identity."""

    fd: int
    dev: int
    ino: int


def hold(folder: int, name: str) -> Held | None:
    """A shared lock on entry ``name`` of the open folder ``folder``; None if it cannot be
    taken (no such entry, or no ``flock`` here)."""
    try:
        fd = os.open(name, _FLAGS, dir_fd=folder)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    return Held(fd, st.st_dev, st.st_ino)


def same_entry(folder: int, name: str, token: object) -> bool:
    """True if ``name`` in ``folder`` is still the entry ``token`` locked. A stat that fails
    otherwise than by the entry being gone raises (the storage's error, e.g. ENOSPC or EIO, is
    the caller's to report as such, not as a staging entry made again)."""
    if not isinstance(token, Held):
        return True
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return (st.st_dev, st.st_ino) == (token.dev, token.ino)


def release(token: object) -> None:
    """Close the fd of ``token`` (which drops its lock)."""
    if isinstance(token, Held):
        with contextlib.suppress(OSError):
            os.close(token.fd)


def is_held(folder: int, name: str) -> bool:
    """True if a live writer holds entry ``name`` of ``folder`` (an exclusive, non-blocking
    ``flock`` is refused). False if it is free, gone, or cannot be locked here."""
    try:
        fd = os.open(name, _FLAGS, dir_fd=folder)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the lock gc may have taken
    return False
