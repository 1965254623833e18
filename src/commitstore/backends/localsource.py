"""A local folder handed to the store to take (moved in, adopted, or copied and then removed):
where it lies, judged by the identity of folders, and what it holds, listed without following
links. Used by ``FolderWrite.move_in``/``adopt`` (``_movein``) and ``hf.commit_folder``.

- :func:`check_folder`: the argument names an existing folder (typed error otherwise).
- :func:`below`: where a path lies below a folder by the identity (device, inode) of the
  folders on its way up, so symlinks, ``..`` after a symlink, bind mounts of the folder itself
  and case-folding file systems cannot hide it.
- :func:`entry_of`: the entry a rename of a path moves, its parent's symlinks resolved; and
  :func:`store_holding`: the store (a folder with ``.commitstore/records``) a path lies in.
- :func:`pin`: a folder's parent opened once, so that what is later renamed, copied or removed
  is the folder that was checked, whatever the symlinks of its path point to by then.
- :func:`scan`: the regular files of a folder; a symbolic link, FIFO, socket or device in it,
  an entry named like the store's own (``.commitstore*``, case folded), a folder that cannot be
  listed, or a mount point on the store's file system (a bind mount can show a committed folder
  under another path) is refused before anything is moved or copied.

Each only looks (``stat``, ``lstat``, listings, ``/proc/self/mountinfo``; :func:`pin` opens a
folder): nothing is changed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from commitstore.errors import ConfigurationError, NameConflictError
from commitstore.layout import META_DIR

__all__ = [
    "OURS",
    "Pinned",
    "below",
    "check_folder",
    "entry_of",
    "opened_below",
    "pin",
    "scan",
    "store_holding",
]

OURS = META_DIR.casefold()
"""Every entry of the store's own (``.commitstore``, ``.commitstore.tmp.*``, ...) starts so,
case folded."""


def check_folder(src: object) -> Path:
    """``src`` as a Path, when it names an existing folder (or a symbolic link to one, which
    the checks of where it lies then judge, and refuse).

    Raises:
        ConfigurationError: ``src`` is no path, does not exist or is no folder (before any I/O
            but its ``stat``).
    """
    if not isinstance(src, (str, os.PathLike)):
        raise ConfigurationError(f"src must be a path of a folder, not {type(src).__name__}")
    path = Path(src)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigurationError(f"{path} cannot be moved in: {exc.strerror}") from exc
    if not stat.S_ISDIR(mode):
        raise ConfigurationError(f"{path} is not a folder")
    return path


def below(root: os.stat_result, where: str) -> tuple[str, ...] | None:
    """The parts of ``where`` below the folder ``root`` (by identity), ``()`` when ``where``
    is it, None when it is not inside it."""
    parts: list[str] = []
    at = where
    while True:
        try:
            if os.path.samestat(os.stat(at), root):
                return tuple(reversed(parts))
        except OSError:
            pass
        up, last = os.path.split(at)
        if up == at:
            return None
        parts.append(last)
        at = up


def _mount_points() -> frozenset[str]:
    """Every mount point of this process's mount namespace (``/proc/self/mountinfo``: bind
    mounts included, which ``os.path.ismount`` misses on one file system); empty where the
    platform does not tell."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return frozenset()
    points = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:  # the mount point, octal escapes (\040 for a space) decoded
            raw = fields[4].encode("utf-8", "surrogateescape").decode("unicode_escape")
            points.add(raw.encode("latin-1").decode("utf-8", "surrogateescape"))
    return frozenset(points)


def scan(src: Path, name: str, device: int | None) -> list[str]:
    """The regular files below the folder ``src`` (paths relative to it, ``/``-separated),
    listed without following symbolic links.

    Raises:
        ConfigurationError: a symbolic link, FIFO, socket or device lies in ``src``, or a
            folder in it cannot be listed.
        NameConflictError: an entry in ``src`` is named like the store's own (``.commitstore``
            and its staging entries, case folded), or ``src`` is or holds a mount point on the
            file system ``device`` (the store's).
    """
    top = os.path.realpath(src)
    mounts = _mount_points() if device is not None else frozenset()
    files: list[str] = []

    def refuse(why: str) -> NameConflictError:
        return NameConflictError(
            f"{src} {why}: moving or copying it into {name} could take committed artifacts or "
            "the store's own entries, so it is refused and nothing was moved",
            name=name,
        )

    def unlistable(exc: OSError) -> None:
        raise ConfigurationError(f"{src}: {exc.filename} cannot be listed: {exc.strerror}")

    for dirpath, dirs, names in os.walk(top, onerror=unlistable):
        if dirpath in mounts and os.lstat(dirpath).st_dev == device:
            raise refuse(f"is or holds a mount point of the store's file system ({dirpath})")
        for entry in (*dirs, *names):
            if entry.casefold().startswith(OURS):
                raise refuse("holds the store's own entries (another writer's staging or pending)")
        for entry in (*dirs, *names):
            mode = os.lstat(os.path.join(dirpath, entry)).st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "a special file"
                raise ConfigurationError(
                    f"{src} holds {kind} ({os.path.join(dirpath, entry)}): only folders and "
                    "regular files are stored; nothing was moved"
                )
        rel = os.path.relpath(dirpath, top)
        files += [n if rel == "." else f"{rel}/{n}".replace(os.sep, "/") for n in names]
    return files


def entry_of(src: Path) -> tuple[str, str]:
    """The entry a rename of ``src`` moves (its parent resolved by the kernel's rules: symlinks
    first, then ``..``) and what ``src`` itself resolves to."""
    path = os.path.join(os.getcwd(), os.fspath(src))  # absolute; ``..`` left for realpath
    head, last = os.path.split(path.rstrip("/") or "/")
    if last in ("", ".", ".."):
        last = os.path.basename(os.path.realpath(path))
        head = os.path.dirname(os.path.realpath(path))
    return os.path.join(os.path.realpath(head), last), os.path.realpath(path)


def store_holding(where: str) -> str | None:
    """The folder above ``where`` (or ``where`` itself) that holds a store's metadata folder
    with its records, or None."""
    at = where
    while True:
        if os.path.isdir(os.path.join(at, META_DIR, "records")):
            return at
        up = os.path.dirname(at)
        if up == at:
            return None
        at = up


_LOOKUP = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
"""Open a folder only to look up and ``stat`` names in it (``O_PATH``: no read permission
needed, only search)."""
_DIR_NOFOLLOW = _LOOKUP | getattr(os, "O_NOFOLLOW", 0)


@contextlib.contextmanager
def opened_below(top: int, parts: Sequence[str]) -> Iterator[int]:
    """The folder ``parts`` below the open folder ``top``, each step opened without following
    a link (``OSError`` where one is a link or missing); closed on exit."""
    fd = os.dup(top)
    try:
        for part in parts:
            step = os.open(part, _DIR_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = step
        yield fd
    finally:
        os.close(fd)


def _above(fd: int, found: Callable[[os.stat_result, int], bool]) -> bool:
    """Whether ``found`` holds for a folder above the open folder ``fd`` (its parent, its
    parent's parent, ... up to the root), reached through ``..``.

    Raises:
        ConfigurationError: a folder on the way up cannot be opened (where it lies is unknown,
            so nothing may be moved).
    """
    try:
        return _walk_up(fd, found)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot tell where a folder lies ({exc.strerror} walking up from it): nothing "
            "was moved"
        ) from exc


def _walk_up(fd: int, found: Callable[[os.stat_result, int], bool]) -> bool:
    here = os.dup(fd)
    try:
        while True:
            up = os.open("..", _LOOKUP, dir_fd=here)
            st, before = os.fstat(up), os.fstat(here)
            os.close(here)
            here = up
            if os.path.samestat(st, before):  # the root: its ``..`` is itself
                return False
            if found(st, here):
                return True
    finally:
        os.close(here)


@dataclass
class Pinned:
    """``src``'s parent folder, open, and the identity of the folder ``src`` named in it when it
    was opened: a rename of :attr:`via` moves that entry of that folder, wherever the symlinks
    of ``src``'s path point by then (Linux: through ``/proc/self/fd``; elsewhere the path
    itself, checked again after the move)."""

    src: Path
    fd: int
    last: str
    ident: tuple[int, int]
    via: str

    def close(self) -> None:
        """Close the parent folder."""
        os.close(self.fd)

    def changed(self, why: str) -> NameConflictError:
        """The refusal for a ``src`` whose path stopped naming the pinned folder."""
        return NameConflictError(
            f"{self.src} {why} while it was checked or moved (a symbolic link in its path "
            "was pointed elsewhere?): the folder checked is the only one that may be moved, "
            "so it is refused and nothing stays moved",
            name=str(self.src),
        )

    @contextlib.contextmanager
    def opened(self) -> Iterator[int]:
        """The pinned folder itself, open (``OSError`` when its name holds a link or another
        folder now); closed on exit."""
        with opened_below(self.fd, [self.last]) as fd:
            here = os.fstat(fd)
            if (here.st_dev, here.st_ino) != self.ident:
                raise FileNotFoundError(f"{self.src}: another folder has its name now")
            yield fd

    def lies_in(self, root: os.stat_result) -> bool:
        """Whether the pinned folder is ``root`` or lies below it, judged by walking up from
        the open parent through ``..`` (never by a name another user can point elsewhere)."""
        here = os.fstat(self.fd)
        if (here.st_dev, here.st_ino) == (root.st_dev, root.st_ino) or self.ident == (
            root.st_dev,
            root.st_ino,
        ):
            return True
        return _above(self.fd, lambda st, _fd: os.path.samestat(st, root))

    def holds(self, root: str) -> bool:
        """Whether the folder ``root`` lies below the pinned folder (walking up from ``root``)."""
        fd = os.open(root, _LOOKUP)
        try:
            return _above(fd, lambda st, _fd: (st.st_dev, st.st_ino) == self.ident)
        finally:
            os.close(fd)

    def in_a_store(self) -> bool:
        """Whether the pinned folder, or a folder above it, holds a store's records folder."""

        def store(_st: os.stat_result, fd: int) -> bool:
            try:
                return stat.S_ISDIR(os.stat(f"{META_DIR}/records", dir_fd=fd).st_mode)
            except OSError:
                return False

        try:
            with self.opened() as folder:
                return store(os.fstat(folder), folder) or _above(folder, store)
        except OSError:
            return False

    def check_unchanged(self) -> None:
        """Raise :meth:`changed` unless ``src``'s path still names the pinned folder."""
        try:
            now = os.stat(self.src)
        except OSError as exc:
            raise self.changed("is gone") from exc
        if (now.st_dev, now.st_ino) != self.ident:
            raise self.changed("names another folder")


def pin(src: Path) -> Pinned:
    """Open ``src``'s parent (its symlinks resolved now, once) and note the entry ``src``
    names in it, not following it (:class:`Pinned`; the caller closes it). Judging the entry
    (a symbolic link, where it lies) is left to the caller's checks, which run after this.

    Raises:
        ConfigurationError: ``src``'s parent cannot be opened or ``src`` is gone.
    """
    entry, _ = entry_of(src)
    head, last = os.path.split(entry)
    try:
        fd = os.open(head or "/", _LOOKUP)
    except OSError as exc:
        raise ConfigurationError(f"{src} cannot be moved in: {exc.strerror}") from exc
    try:
        try:
            st = os.stat(last, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            raise ConfigurationError(f"{src} cannot be moved in: {exc.strerror}") from exc
        via = f"/proc/self/fd/{fd}/{last}"
        try:
            through = os.stat(via, follow_symlinks=False)
        except OSError:
            through = None
        if through is None or not os.path.samestat(through, st):
            via = entry  # no /proc here: the path, with the identity checked after the move
        return Pinned(src, fd, last, (st.st_dev, st.st_ino), via)
    except BaseException:
        os.close(fd)
        raise
