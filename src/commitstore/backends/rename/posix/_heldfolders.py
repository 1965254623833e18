"""Folder descriptors kept open while a local store's publish lock is held.

One commit opens the same few folders several times under the lock (the records folder for the
hierarchy check, the earlier pending record, the pending record, the record; the metadata folder
for the lock itself), each time walking from the root with ``O_NOFOLLOW`` descriptors. While the
lock is held, :class:`HeldFolders` keeps the descriptor of each folder such a walk opened, and a
later walk starts from the deepest one kept (a ``dup`` of it, which the caller closes as it
closes any walk's result); every one is closed when the lock is released.

Only the root and folders below the metadata folder are kept: commitstore never renames those,
and removes one (an empty folder, a folder tree) only through :meth:`HeldFolders.forget`, which
its removals call first; data folders are never kept (a folder replace exchanges them under the
lock). A kept descriptor names the folder it walked to under this lock hold, exactly as the
descriptor a walk returns does for as long as its caller keeps it; another tool moving a folder
meanwhile is seen as before (a create in a folder that is gone fails, nothing is published).

Only the thread that holds the lock uses them (another thread of the process walks as usual; it
cannot hold the lock meanwhile: each holder ``flock``\\ s its own open file description).
"""

from __future__ import annotations

import os
import threading

from commitstore.backends.localtree import close_quietly
from commitstore.layout import META_DIR, Parts


class HeldFolders:
    """The folders kept open during one hold of the publish lock, by the holding thread."""

    def __init__(self) -> None:
        self.owner = (os.getpid(), threading.get_ident())
        self._fds: dict[Parts, int] = {}

    def usable(self) -> bool:
        """True in the thread that holds the lock (not in a child forked meanwhile)."""
        return self.owner == (os.getpid(), threading.get_ident())

    def deepest(self, parts: Parts) -> tuple[int, int] | None:
        """``(n, fd)``: a new descriptor (a ``dup``) of the deepest kept folder ``parts[:n]``,
        None if none is kept."""
        for n in range(len(parts), -1, -1):
            fd = self._fds.get(parts[:n])
            if fd is not None:
                return n, os.dup(fd)
        return None

    def keep(self, parts: Parts, fd: int) -> None:
        """Keep a ``dup`` of ``fd``, the folder ``parts`` (the root or one below the metadata
        folder; anything else is not kept)."""
        if (parts and parts[0] != META_DIR) or parts in self._fds:
            return
        self._fds[parts] = os.dup(fd)

    def forget(self) -> None:
        """Close every kept descriptor (before any folder is removed under the lock)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            close_quietly(fd)
