"""The primitives a rename-family backend implements (:class:`RenameOps`) and the policy that
tells the shared recipe in ``sink.py`` how suspicious to be of the storage (:class:`CommitPolicy`).
"""

from __future__ import annotations

import abc
import contextlib
import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from commitstore.backends.base import CommitInfo, PutMode
from commitstore.layout import Parts

D = TypeVar("D")
"""An open destination folder: a directory fd (POSIX), the folder's parts (SMB)."""
H = TypeVar("H")
"""An open staging file."""


@dataclass(frozen=True, slots=True)
class CommitPolicy:
    """How suspicious a strategy is of its storage (one per strategy): drives the recipe."""

    rename_attempts: int = 1
    """Tries of the rename; bridges retry EACCES/EPERM/EBUSY with backoff, never a copy."""
    fresh_stat: bool = False
    """After close: stat the staging file by name and compare its size with the bytes written."""
    readback: bool = False
    """After close: re-read the staging file past the caches and compare the digest."""
    check_after_rename: bool = False
    """Stat the final name after the rename and compare its size again."""
    dir_fsync_tolerated: tuple[int, ...] = (errno.EINVAL, errno.ENOTSUP)
    """Errors of a directory fsync that mean "durability unconfirmed" rather than failure."""


def write_all(write: Callable[[memoryview], int], data: memoryview) -> int:
    """Write all of ``data`` with ``write`` (which may write less than asked); bytes written."""
    view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    total = view.nbytes
    while view.nbytes:
        view = view[write(view) :]
    return total


class RenameOps(abc.ABC, Generic[D, H]):
    """The filesystem primitives a rename-family backend implements; the sinks do the rest.

    Names are entries of an open folder; for uploaded folder trees (:meth:`upload`) a name may
    be a ``/``-separated path below it. Primitives may raise their storage's own exceptions:
    the sinks pass them through :meth:`error` (CommitStoreErrors pass unchanged).
    """

    policy: CommitPolicy

    @abc.abstractmethod
    def shown(self, parts: Parts) -> str:
        """``parts`` for messages (no credentials)."""

    @abc.abstractmethod
    def open_folder(self, parts: Parts) -> D:
        """Open the folder ``parts``, creating missing folders (never through a symlink)."""

    def close_folder(self, folder: D) -> None:
        """Release an open folder."""

    @abc.abstractmethod
    def create_staging(self, folder: D, name: str) -> H:
        """Create and open ``name`` for writing; fail if it exists (exclusive, no symlink)."""

    @abc.abstractmethod
    def write(self, handle: H, data: memoryview) -> int:
        """One write; returns the bytes the storage accepted (may be fewer than asked)."""

    def prepare(self, handle: H) -> None:
        """Start flushing ``handle`` in the background (``FileSink.prepare``); :meth:`finish`
        waits for it. Default: nothing (finish flushes)."""
        return None

    @abc.abstractmethod
    def finish(self, handle: H) -> int | None:
        """Flush to stable storage and close (closed even on failure); the size stored at close,
        or None where the storage cannot say before a stat."""

    @abc.abstractmethod
    def discard(self, handle: H) -> None:
        """Close without flushing (abort). Idempotent."""

    @abc.abstractmethod
    def size_of(self, folder: D, name: str) -> int | None:
        """Fresh (uncached) size of ``name``; None if it does not exist."""

    @abc.abstractmethod
    def digest_of(self, folder: D, name: str) -> tuple[int, str]:
        """(size, digest) of ``name`` re-read past every cache."""

    @abc.abstractmethod
    def rename(
        self, folder: D, src: str, dst: str, *, mode: PutMode, is_dir: bool, info: CommitInfo
    ) -> None:
        """Move the file (or folder, ``is_dir``) ``src`` onto ``dst`` in one step per ``mode``,
        retrying per policy, never copying; notes go to ``info``. AlreadyExistsError when
        ``mode`` is CREATE and ``dst`` exists."""

    @abc.abstractmethod
    def sync_folder(self, folder: D, info: CommitInfo) -> None:
        """Make the folder's entries durable, or record in ``info`` why that is unconfirmed."""

    @abc.abstractmethod
    def remove_at(self, folder: D, name: str) -> None:
        """Remove the file or folder tree ``name`` if it exists."""

    @abc.abstractmethod
    def staging_folder(self, folder: D, parts: Parts) -> Path | None:
        """Create the staging folder ``parts`` (whose last part is a name in ``folder``) where the
        caller can fill it in place and return its local path; None when the storage needs a
        local folder uploaded at publish (:meth:`upload`), nothing created yet."""

    def hold(self, folder: D, name: str) -> object | None:
        """Take the writer's liveness lock on the staging entry ``name`` (held until
        :meth:`release`): while it is held, gc never removes the entry, whatever its age. Also
        the entry's identity, checked by :meth:`still_held` before the publish. None where the
        storage has no such lock (default)."""
        return None

    def creating(self, folder: D) -> contextlib.AbstractContextManager[None]:
        """Held while a writer makes a staging entry in ``folder`` and takes its :meth:`hold`,
        so gc never finds the entry between the two. Default: nothing."""
        return contextlib.nullcontext()

    def still_held(self, folder: D, name: str, token: object) -> bool:
        """True if ``name`` is still the very entry :meth:`hold` locked (not one removed and made
        again since). Default: True (no lock, nothing to compare)."""
        return True

    def release(self, token: object) -> None:
        """Drop a lock :meth:`hold` took. Default: nothing."""

    def folder_in_place(self, folder: D, parts: Parts) -> bool:
        """True if ``folder`` (opened by :meth:`open_folder` for ``parts``) is still the folder
        at that path: not moved away or replaced by another tool since. Default: True (storage
        whose folder handles are paths, where a rename always goes to the path)."""
        return True

    def sync_tree(self, folder: D, name: str, info: CommitInfo) -> None:
        """Make the folder tree ``name`` (filled by other sinks, each file already flushed)
        durable: every folder in it, bottom-up. Default: nothing to do (storage whose folder
        entries are durable once created, or that cannot sync them)."""

    def upload(self, folder: D, name: str, local: Path | None) -> None:
        """Create folder ``name`` (``local`` None) or copy the local file ``local`` to the new
        file ``name`` (exclusive), creating missing folders. Only where staging_folder is None."""
        raise NotImplementedError(f"{type(self).__name__} stages folders in place")

    @abc.abstractmethod
    def error(self, exc: Exception, what: str, shown: str) -> Exception:
        """The error-tree exception for a storage exception raised while ``what`` ``shown``."""
