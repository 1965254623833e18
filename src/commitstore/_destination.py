"""Where ``get_file`` puts a copy on the local disk: checks of the destination made before the
copy, so a bad one is refused with nothing changed (never inside the store, never over a local
folder, a FIFO, a socket or a device)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from commitstore.backends import Backend
from commitstore.errors import ConfigurationError, NameConflictError, StorageError


def store_holding(backend: Backend, path: Path) -> str | None:
    """The store's local root when the local ``path`` is that root or lies inside it (both with
    symlinks resolved; ``path`` need not exist), else None. A copy out of the store written
    there would land among the store's own names (another artifact's data, its records). Only
    resolves paths: nothing is created or written."""
    root = backend.local_root()
    if root is None:
        return None
    where = os.path.realpath(os.fspath(path))
    return root if os.path.commonpath((root, where)) == root else None


def check_destination(backend: Backend, dest: Path, name: str) -> None:
    """Raise NameConflictError when ``dest`` lies inside the store's own folder (before any
    I/O): ``get_file`` there would replace another artifact's data or the store's records."""
    root = store_holding(backend, dest)
    if root is not None:
        raise NameConflictError(
            f"{dest} is inside the store's own folder ({root}): a copy of {name} there could "
            "replace another artifact's data or the store's records, so it is refused and "
            "nothing was changed; choose a path outside the store",
            name=name,
        )


def local_path_argument(local_path: object) -> Path:
    """``local_path`` (a ``get_file`` destination) as a Path, before any I/O.

    Raises:
        ConfigurationError: not a str or ``os.PathLike`` of str, empty (``Path("")`` would be
            the current directory, which would then receive the copy unasked), or holding a NUL
            (no local path can).
    """
    path = os.fspath(local_path) if isinstance(local_path, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise ConfigurationError(
            f"local_path must be a local path (str or os.PathLike), not {local_path!r}"
        )
    if not path:
        raise ConfigurationError(
            "local_path is empty: name the file or folder to copy to (use '.' for the current "
            "directory); nothing was changed"
        )
    if "\0" in path:
        raise ConfigurationError(
            f"local_path {path!r} contains a NUL character, which no local path can; nothing "
            "was changed"
        )
    return Path(path)


def local_destination(dest: Path, name: str, kind: str) -> Path:
    """Where ``get_file`` publishes artifact ``name`` (``kind``: ``"file"`` or ``"dir"``) for
    the local path ``dest`` (:func:`placed`, without whether something is there)."""
    return placed(dest, name, kind)[0]


def placed(dest: Path, name: str, kind: str) -> tuple[Path, bool]:
    """Where ``get_file`` publishes artifact ``name`` (``kind``: ``"file"`` or ``"dir"``) for
    the local path ``dest``, as ``cp`` does, and whether an entry is there now (from one
    ``lstat``, the only I/O besides ``dest``'s ``stat``): an existing folder ``dest`` receives
    it inside, under its base name. A local folder is never replaced (nothing in it is
    removed), nor a local file by a folder; a local file by a file is, in one step (``cp`` over
    a file), and so is a symlink (the link itself: its target is never written). A FIFO, a
    socket or a device is never replaced, nor written into (``cp`` would write into it): the
    node stays as it was.

    Raises:
        NameConflictError: the place is a local folder, a FIFO, socket or device, or a file
            and the artifact a folder.
    """
    if dest.is_dir():
        dest = dest / name.rsplit("/", 1)[-1]
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return dest, False
    except OSError as exc:
        raise StorageError(
            exc.errno or 0, f"{dest}: cannot stat: {exc.strerror}", path=str(dest)
        ) from exc
    if stat.S_ISDIR(st.st_mode):
        raise NameConflictError(
            f"{dest} is an existing local folder: get_file never replaces a folder (nothing "
            f"was changed); choose a new path for {name}",
            name=name,
        )
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise NameConflictError(
            f"{dest} is an existing {_node_kind(st.st_mode)}: get_file neither replaces it nor "
            f"writes into it (nothing was changed); choose a new path for {name}",
            name=name,
        )
    if kind == "dir":
        raise NameConflictError(
            f"{dest} is an existing local file: the folder artifact {name} does not replace a "
            "file (nothing was changed); choose a new path",
            name=name,
        )
    return dest, True


def _node_kind(mode: int) -> str:
    """What a local entry that is not a file, folder or symlink is, for messages."""
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    return "special file"
