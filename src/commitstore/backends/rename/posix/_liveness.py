"""A writer's proof of life on a local filesystem: a ``flock`` held on its staging entry.

A writer (a staging file's sink, a ``stage_dir`` staging folder) takes a shared ``flock`` on an
fd of the entry itself and keeps it for its life; the kernel drops it when the process dies
(SIGKILL included). gc tries an exclusive, non-blocking ``flock`` on the same entry before it
removes it: refused means a live writer holds it, and it is kept whatever its age. The fd also
pins the entry's identity (device and inode): a staging folder removed and made again under a
writer (by another tool, or a ``copytree(..., dirs_exist_ok=True)`` refilling it) is not the
one it locked, so its commit fails instead of publishing what is there.

No entry is ever created already locked, so between a writer's create and its lock gc could
find it free. gc therefore removes an entry only while it holds an exclusive lock on it
(:func:`claimed`), and a writer takes its lock without waiting and then checks that its name
still names the entry it locked (:func:`hold`): refused (gc holds it) or gone, the writer gives
that entry up (:class:`~commitstore.backends.base.StagingTaken`) and makes a new one. Once a
writer holds its lock on the entry at its name, no gc can take it: gc's lock is refused.
A ``begin_folder`` staging folder keeps its name (the write's, which its writers share): made
and held the same way (:func:`hold_shared_folder`), it is made again under that name when gc
took it, and held by its coordinator from ``begin_folder`` on, so that gc never takes the files
a writer that exited left there while the coordinator lives.

Where ``flock`` is not supported (some network filesystems) nothing is held: the entry is aged
by its modification times as before.

Every descriptor that holds one of these locks is tracked (``_forkheld``) from its open to its
close, and a folder's descriptor while it is locked, so a child forked meanwhile never keeps a
lock: a writer's staging is free for gc once the writer is dead, whatever it forked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from commitstore.backends.base import StagingTaken
from commitstore.backends.rename.posix import _forkheld

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Held:
    """An open, locked fd of a staging entry, and the entry's identity."""

    fd: int
    dev: int
    ino: int


def hold(folder: int, name: str) -> Held | None:
    """A shared lock on entry ``name`` of the open folder ``folder``, which its name still
    names once locked; None where ``flock`` is not supported here (the entry is then aged).

    Raises:
        StagingTaken: the entry is gone, or gc holds it (it is removing it): the writer's
            entry is not its own any more and the caller makes a new one.
    """
    try:
        fd = _open_tracked(folder, name)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise StagingTaken(name) from exc
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        st = os.fstat(fd)
    except BlockingIOError as exc:  # gc's exclusive lock: it is removing this entry
        _forkheld.close(fd)
        raise StagingTaken(name) from exc
    except OSError:
        _forkheld.close(fd)
        return None
    token = Held(fd, st.st_dev, st.st_ino)
    try:
        here = same_entry(folder, name, token)
    except OSError:  # the storage's error on the check: nothing held (aged, as without flock)
        _forkheld.close(fd)
        return None
    except BaseException:
        _forkheld.close(fd)
        raise
    if not here:  # removed (by gc) between the open and the lock
        _forkheld.close(fd)
        raise StagingTaken(name)
    return token


def _open_tracked(folder: int, name: str) -> int:
    """Entry ``name`` of ``folder`` opened (``_FLAGS``) and tracked with no fork in between
    (``_forkheld``), before anything locks it; close it with ``_forkheld.close``."""
    with _forkheld.no_fork():
        return _forkheld.track(os.open(name, _FLAGS, dir_fd=folder))


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
            _forkheld.close(token.fd)


@contextlib.contextmanager
def creating(folder: int) -> Iterator[None]:
    """A writer making a staging entry in ``folder`` and locking it (:func:`hold`): a shared
    ``flock`` on the folder itself for that short while, so gc (which needs an exclusive one on
    the folder to claim an entry in it, :func:`claimed`) never finds the new entry between its
    create and its lock. Never waits: refused (gc is claiming another entry there right now)
    or unsupported, the writer goes on without it and :func:`hold` tells it if gc took the
    entry."""
    locked = _lock_shared(folder)
    try:
        yield
    finally:
        if locked:
            _unlock_shared(folder)


def _lock_shared(folder: int) -> bool | None:
    """:func:`creating`'s lock: True taken, False refused (gc claims an entry there right
    now), None where ``flock`` is not supported. ``folder`` is tracked while it is locked
    (``_forkheld``: a child forked meanwhile does not keep the lock); :func:`_unlock_shared`
    ends both."""
    _forkheld.track(folder)
    try:
        fcntl.flock(folder, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        _forkheld.untrack(folder)
        return False
    except OSError:
        _forkheld.untrack(folder)
        return None
    except BaseException:
        _forkheld.untrack(folder)
        raise
    return True


def _unlock_shared(folder: int) -> None:
    """Drop :func:`_lock_shared`'s lock and stop tracking ``folder`` (its caller closes it)."""
    with contextlib.suppress(OSError):
        fcntl.flock(folder, fcntl.LOCK_UN)
    _forkheld.untrack(folder)


def hold_shared_folder(
    folder: int, name: str, *, move_from: str | None = None, own: object | None = None
) -> Held | None:
    """The staging folder ``name`` of ``folder`` that several writers share (a
    ``begin_folder`` staging area: its name is the write's, never a new one), made if missing
    (or, with ``move_from``, that local folder renamed onto it: ``name`` must then be an empty
    folder no other writer holds, :func:`_move_onto`), then held (:func:`hold`), all under
    :func:`creating`'s lock on ``folder``: gc never finds the folder made (or moved in) and
    not yet locked. A folder that already exists (another writer of the same write made it)
    is held as it is. None where ``flock`` is not supported here.

    Raises:
        StagingTaken: gc holds the folder (it is removing it: no writer held it) or removed it
            before the lock (only without the folder's lock); the caller makes it again.
        OSError: the folder cannot be made or opened; with ``move_from``, also when the
            folder's lock is refused (nothing is moved: gc could take the moved folder before
            its lock), ``name`` holds files, or another writer holds ``name``
            (:class:`HeldByOther`; nothing is moved).
    """
    locked = _lock_shared(folder)
    try:
        if move_from is None:
            with contextlib.suppress(FileExistsError):  # another writer of this write made it
                os.mkdir(name, 0o777, dir_fd=folder)
        elif locked is False:
            raise BlockingIOError(f"{name}: gc is claiming an entry beside it; nothing moved")
        else:
            _move_onto(folder, name, move_from, own)
        return hold(folder, name)
    finally:
        if locked:
            _unlock_shared(folder)


class HeldByOther(BlockingIOError):
    """Another writer holds the shared staging folder a ``move_in`` would replace: nothing was
    moved (that writer's lock would stay on the replaced folder, and gc could take the moved
    one from under it once the mover is gone)."""


def _move_onto(folder: int, name: str, src: str, own: object | None) -> None:
    """Rename the local folder ``src`` onto the staging folder ``name`` of ``folder`` (empty:
    the rename refuses one with files) only if no writer but the caller holds it. Called under
    :func:`creating`'s shared lock on ``folder``, which the caller keeps until the moved
    folder is held: gc, which needs that folder's exclusive lock to claim an entry, claims
    nothing there meanwhile.

    ``own`` is the caller's shared lock on ``name`` (:func:`hold`). It is converted to an
    exclusive, non-blocking one: refused means another writer holds ``name`` too
    (:class:`HeldByOther`, nothing moved). ``flock`` converts a lock by dropping it and then
    taking the new one, so a refused conversion may leave the caller without its lock: it is
    taken back, shared, before this returns (gc cannot claim the folder in between: the
    folder's lock is held). Granted, no other writer can lock the folder until it has been
    replaced (their lock is refused, and a lock taken on the replaced folder after that fails
    :func:`hold`'s identity check): the rename follows. The caller keeps ``own`` exclusive on
    the replaced folder until it releases it. Without ``own`` (nothing held: ``flock`` not
    supported here) the folder is renamed onto as it is (no writer holds anything to orphan).
    """
    if isinstance(own, Held):
        try:
            fcntl.flock(own.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            fcntl.flock(own.fd, fcntl.LOCK_SH)  # taken back (only brief holders can delay it)
            raise HeldByOther(f"{name}: another writer holds it; nothing moved") from exc
    try:
        os.rename(src, name, dst_dir_fd=folder)
    except BaseException:
        if isinstance(own, Held):
            with contextlib.suppress(OSError):
                fcntl.flock(own.fd, fcntl.LOCK_SH)  # nothing moved: shared again
        raise


HELD = "held by a live writer"
"""gc's reason for keeping an entry a live writer holds (:func:`claimed`)."""
CREATING = "a writer is creating an entry in this folder"
"""gc's reason for keeping an entry whose folder a writer holds between an entry's create and
its lock (:func:`creating`): that writer's entry may be any of the folder's, so none is taken
now; the next gc judges it again."""


@contextlib.contextmanager
def claimed(open_folder: Callable[[], int], name: str) -> Iterator[str | None]:
    """gc's hold on entry ``name`` of the folder ``open_folder`` opens: None (an exclusive lock
    taken and kept until the block ends, so no writer can take the entry meanwhile; or nothing
    to lock: the entry gone, or no ``flock`` here), else why it is kept: :data:`HELD` (a live
    writer holds it) or :data:`CREATING` (a writer is making an entry in that folder right now,
    :func:`creating`). Remove the entry only inside the block."""
    try:
        with _forkheld.no_fork():
            folder = _forkheld.track(open_folder())
    except OSError:
        yield None
        return
    try:
        fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # a writer between its create and its lock, here
        _forkheld.close(folder)
        yield CREATING
        return
    except OSError:
        pass  # no flock here: aged by its times
    try:
        fd = _open_tracked(folder, name)
    except OSError:
        _unlock_close(folder)
        yield None
        return
    try:
        kept: str | None = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            kept = HELD
        except OSError:
            pass  # no flock here: aged by its times
        _unlock_close(folder)  # writers make entries there again
        folder = -1
        yield kept
    finally:
        _forkheld.close(fd)  # closing drops gc's lock
        if folder >= 0:
            _unlock_close(folder)


def _unlock_close(folder: int) -> None:
    """Drop a folder's lock (explicitly: a descriptor may share its open file with a kept one)
    and close it."""
    with contextlib.suppress(OSError):
        fcntl.flock(folder, fcntl.LOCK_UN)
    _forkheld.close(folder)


def is_held(folder: int, name: str) -> bool:
    """True if a live writer holds entry ``name`` of ``folder`` (an exclusive, non-blocking
    ``flock`` is refused). False if it is free, gone, or cannot be locked here."""
    try:
        fd = _open_tracked(folder, name)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        _forkheld.close(fd)  # closing drops the lock gc may have taken
    return False
