"""Folder descriptors kept open for one stretch of a local store's work: while its publish lock
is held, and while the checks made before it run (``LocalBackend.folders_kept``).

One commit opens the same few folders several times (the records folder for the hierarchy
check, the record's absence, the earlier pending record, the pending record and the record; the
metadata folder for the lock itself), each time walking from the root with ``O_NOFOLLOW``
descriptors. During a hold, :class:`HeldFolders` keeps the descriptor of each such folder that a
walk opened (the walk hands it over instead of closing it), and a later walk starts from the
deepest one kept: it opens the rest below that one, or gets a ``dup`` of it when it is the folder
asked for (the caller closes what it gets, as it closes any walk's result); every kept one is
closed when the hold ends.

Only the root and folders below the metadata folder are kept: commitstore never renames those,
and removes one (an empty folder, a folder tree) only through :meth:`HeldFolders.forget`, which
its removals call first; data folders are never kept (a folder replace exchanges them under the
lock). A kept descriptor names the folder it walked to during this hold, exactly as the
descriptor a walk returns does for as long as its caller keeps it; another tool moving a folder
meanwhile is seen as before (a create in a folder that is gone fails, nothing is published).
A hold made outside the lock serves read-only checks that the commit repeats under the lock or
that its publish enforces atomically; the lock always starts a hold of its own, from the root.

Only the thread that made a hold uses it (``usable``: another thread of the process, or a child
forked meanwhile, walks as usual).
"""

from __future__ import annotations

import os
import threading

from commitstore.backends.localtree import close_quietly
from commitstore.layout import META_DIR, Parts

_PID = [os.getpid()]
"""This process's id, kept current across forks (no ``getpid`` call per walk)."""
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


class HeldFolders:
    """The folders kept open during one hold, by the thread that made it."""

    def __init__(self) -> None:
        self.owner = (_PID[0], threading.get_ident())
        self._fds: dict[Parts, int] = {}

    def usable(self) -> bool:
        """True in the thread that made the hold (not in a child forked meanwhile)."""
        return self.owner == (_PID[0], threading.get_ident())

    def deepest(self, parts: Parts) -> tuple[int, int] | None:
        """``(n, fd)``: the deepest kept folder ``parts[:n]`` and its kept descriptor, lent
        (the caller never closes it: :meth:`lend` for one to keep), None if none is kept."""
        for n in range(len(parts), -1, -1):
            fd = self._fds.get(parts[:n])
            if fd is not None:
                return n, fd
        return None

    @staticmethod
    def lend(fd: int) -> int:
        """A new descriptor of the kept folder ``fd``, which the caller closes."""
        return os.dup(fd)

    def wants(self, parts: Parts) -> bool:
        """Whether the folder ``parts`` is to be kept (the root or one below the metadata
        folder, not kept yet)."""
        return (not parts or parts[0] == META_DIR) and parts not in self._fds

    def take(self, parts: Parts, fd: int) -> None:
        """Keep ``fd``, the folder ``parts`` (:meth:`wants` said so): it is the hold's own
        from here, closed by :meth:`forget`."""
        self._fds[parts] = fd

    def forget(self) -> None:
        """Close every kept descriptor (before any folder is removed under the lock)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            close_quietly(fd)
