"""The ``fsspec-checked`` strategy: any fsspec filesystem with a move (SFTP through sshfs,
WebDAV through webdav4, HDFS, FTP, ...), as a rename-family backend.

The recipe is ``sink.py``'s: a staging file ``.commitstore.tmp.<random>.<name>`` in the
destination's own folder, every byte through the hasher, the file flushed and closed (SFTP
``fsync@openssh.com`` where offered; WebDAV's PUT of the staged body), a fresh ``info`` whose
size must equal the bytes written, optionally a read-back digest (``readback=True``), then one
move into place, and the size checked again under the final name. What the move guarantees
depends on the filesystem and is declared in :attr:`capabilities` and ``describe()``
(``_moves.py``):

- SFTP: ``posix-rename@openssh.com`` (probed at open) is an atomic replace; plain SFTP RENAME
  refuses an existing destination (create-only, checked by the server).
- WebDAV: ``MOVE`` with ``Overwrite: F`` / ``T``; a server may serve ``T`` as delete-then-move,
  so replace is not declared atomic.
- Any other fsspec filesystem: ``fs.mv``, existence checked before a create-only move; a
  filesystem whose ``mv`` is fsspec's copy-then-delete is refused unless ``allow_copy_move``.

Where replace is not one step (folders everywhere, files without posix-rename or a one-request
replace) it is the move-aside protocol of ``aside.py``: the old entry moves to its deterministic
aside name ``.commitstore.old.<name>``, the new one moves in, the aside is removed. A crash
between the first two moves leaves the name missing and the old version aside, which readers
serve and gc moves back. Folders are filled locally and uploaded file by file into a staging
folder, each file size-checked, before the one move.
"""

from __future__ import annotations

import contextlib
import io
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from commitstore.backends.base import Capabilities, CommitInfo, FileInfo, PutMode
from commitstore.backends.rename import aside
from commitstore.backends.rename.fsspec._moves import Mover, storage_error, translate
from commitstore.backends.rename.ops import CommitPolicy
from commitstore.backends.rename.sink import RenameBackend
from commitstore.digest import READ_CHUNK, hash_stream
from commitstore.errors import CommitStoreError, IntegrityError, NotFoundError
from commitstore.layout import Parts


def _mtime(info: dict[str, Any]) -> float | None:
    """Seconds since the epoch from an fsspec ``info`` dict (keys differ by filesystem)."""
    for key in ("mtime", "modified", "last_modified", "LastModified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            value = value.timestamp()
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def _info(raw: dict[str, Any]) -> FileInfo:
    kind = raw.get("type")
    size = raw.get("size")
    return FileInfo(
        size=int(size) if isinstance(size, int) and size >= 0 else 0,
        mtime=_mtime(raw),
        is_dir=kind == "directory",
        regular=kind in ("file", "directory"),
    )


class FsspecReader(io.RawIOBase):
    """Raw reader over an fsspec file that translates its errors into the error tree.

    Each read asks for at most one byte more than the size ``info`` gave at open (so a
    pipelining client such as asyncssh does not send dozens of requests past the end of a
    small file); the extra byte still shows a file that grew."""

    def __init__(self, raw: Any, shown: str, size: int) -> None:
        super().__init__()
        self._raw = raw
        self._shown = shown
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        want = min(len(b), max(self._size - self._pos, 0) + 1)
        try:
            data = self._raw.read(want)
        except Exception as exc:
            raise storage_error(exc, "reading", self._shown) from exc
        n = len(data)
        b[:n] = data
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        try:
            pos: int = self._raw.seek(offset, whence)
        except Exception as exc:
            raise storage_error(exc, "seeking in", self._shown) from exc
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._raw.close()
        super().close()


class FsspecBackend(RenameBackend[str, Any]):
    """A folder on an fsspec filesystem. Folder handles are remote paths."""

    strategy = "fsspec-checked"
    extra: dict[str, Any]
    """Protocol details for ``describe()`` (user, host-key checking, DAV classes)."""

    def __init__(
        self, fs: Any, root: str, mover: Mover, *, shown: str, readback: bool, reason: str
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self.mover = mover
        self.reason = reason
        self._shown = shown.rstrip("/")
        self.extra = {}
        self._folders: set[str] = set()
        self._unconfirmed = False
        self.policy = CommitPolicy(
            rename_attempts=1,
            fresh_stat=True,
            readback=readback,
            check_after_rename=True,
            dir_fsync_tolerated=(),
        )
        self.capabilities = Capabilities(
            atomic_replace=mover.atomic_replace,
            exclusive_create=mover.exclusive_create,
            dir_fsync=False,
            atomic_dir_publish=True,
            free_space=mover.free_space(self._nearest_folder(self.root)) is not None,
            mtime_resolution=1.0,  # SFTP attributes and WebDAV dates: whole seconds
        )

    def __repr__(self) -> str:
        return f"FsspecBackend({self._shown!r})"

    def path(self, parts: Parts) -> str:
        return "/".join((self.root.rstrip("/"), *parts)) if parts else self.root

    def shown(self, parts: Parts) -> str:
        return "/".join((self._shown, *parts))

    def _call(self, what: str, parts: Parts, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CommitStoreError:
            raise
        except Exception as exc:
            raise storage_error(exc, what, self.shown(parts)) from exc

    def _raw_info(self, path: str) -> dict[str, Any] | None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)
        try:
            info: dict[str, Any] = self.fs.info(path)
        except FileNotFoundError:
            return None
        return info

    # -- rename primitives (see sink.RenameOps) ---------------------------------------------
    def _at(self, folder: str, name: str) -> str:
        return f"{folder.rstrip('/')}/{name}"

    def open_folder(self, parts: Parts) -> str:
        """The folder's path, created if this backend has not seen it yet (each ``makedirs``
        costs a request per level; a folder removed since is created again by
        :meth:`create_staging`)."""
        path = self.path(parts)
        if path not in self._folders:
            self._makedirs(path)
            self._folders.add(path)
        return path

    def _makedirs(self, path: str) -> None:
        """``makedirs`` that tolerates a racing writer creating the same folders (some
        servers answer the loser's MKCOL with an error, wsgidav with 500)."""
        for attempt in range(3):
            try:
                self.fs.makedirs(path, exist_ok=True)
                return
            except Exception:
                raw = self._raw_info(path)
                if raw is not None and raw.get("type") == "directory":
                    return
                if attempt == 2:
                    raise

    def create_staging(self, folder: str, name: str) -> Any:
        try:
            return self.fs.open(self._at(folder, name), self.mover.staging_mode)
        except FileNotFoundError:  # the folder was removed since open_folder saw it
            self._makedirs(folder)
            return self.fs.open(self._at(folder, name), self.mover.staging_mode)

    def write(self, handle: Any, data: memoryview) -> int:
        n = handle.write(data)
        return n if isinstance(n, int) else len(data)

    def finish(self, handle: Any) -> None:
        try:
            if not self.mover.flush(handle):
                self._unconfirmed = True
        except BaseException:
            self.discard(handle)
            raise

    def discard(self, handle: Any) -> None:
        with contextlib.suppress(Exception):
            drop = getattr(handle, "discard", None)
            if drop is not None:
                drop()  # buffered uploads: never send what was staged
                if not getattr(handle, "closed", True):
                    handle.closed = True  # fsspec files upload on close()/__del__
            else:
                handle.close()

    def size_of(self, folder: str, name: str) -> int | None:
        raw = self._raw_info(self._at(folder, name))
        return None if raw is None else _info(raw).size

    def digest_of(self, folder: str, name: str) -> tuple[int, str]:
        rel = tuple(self._at(folder, name)[len(self.root) :].strip("/").split("/"))
        with self.open_read(rel) as f:
            return hash_stream(f)

    def rename(
        self, folder: str, src: str, dst: str, *, mode: PutMode, is_dir: bool, info: CommitInfo
    ) -> None:
        """CREATE: the no-replace move. REPLACE of a file: posix-rename (atomic) or one
        replacing request where the filesystem has one; otherwise (and for folders) the
        move-aside protocol (``aside.py``): the old entry moves to its aside name, the new one
        moves in, the aside is removed; if the new one cannot move in, the old one moves back."""
        mover, s, d = self.mover, self._at(folder, src), self._at(folder, dst)
        if mode is PutMode.CREATE:
            mover.move(s, d, replace=False)
            return
        if not is_dir and (mover.atomic_replace or mover.replace_in_one_request):
            if not mover.atomic_replace:
                info.notes.append(f"replaced with one non-atomic request ({mover.kind})")
            mover.move(s, d, replace=True)
            return
        aside.replace(_FsspecMoves(self, folder), src, dst, info.notes)

    def sync_folder(self, folder: str, info: CommitInfo) -> None:
        info.notes.append(f"{self.mover.kind}: no directory sync")
        if self._unconfirmed:
            info.notes.append("the server cannot flush files: durability is the server's")

    def remove_at(self, folder: str, name: str) -> None:
        self._remove_path(self._at(folder, name))

    def staging_folder(self, folder: str, parts: Parts) -> None:
        return None  # the caller fills a local folder; publish uploads it

    def upload(self, folder: str, name: str, local: Path | None) -> None:
        path = self._at(folder, name)
        if local is None:
            self._makedirs(path)
            return
        self._makedirs(path.rsplit("/", 1)[0])
        self.fs.put_file(str(local), path)

    def error(self, exc: Exception, what: str, shown: str) -> Exception:
        return translate(exc, what, shown)

    # -- Backend API ----------------------------------------------------------------------
    def open_read(self, parts: Parts) -> BinaryIO:
        shown = self.shown(parts)
        raw = self._call("stat", parts, self._raw_info, self.path(parts))
        if raw is None:
            raise NotFoundError(f"{shown} does not exist")
        if raw.get("type") != "file":
            raise IntegrityError(
                f"{shown}: not a regular file ({raw.get('type')})", status="size_mismatch"
            )
        f = self._call("opening", parts, self.fs.open, self.path(parts), "rb")
        return io.BufferedReader(FsspecReader(f, shown, _info(raw).size), READ_CHUNK)

    def stat(self, parts: Parts) -> FileInfo | None:
        raw = self._call("stat", parts, self._raw_info, self.path(parts))
        return None if raw is None else _info(raw)

    def _tree(self, parts: Parts) -> tuple[list[tuple[Parts, FileInfo]], list[Parts]]:
        """Every file below ``parts`` and every folder below it (deepest first), one listing
        per folder. Entry names come from the server: only plain single parts are kept."""
        files: list[tuple[Parts, FileInfo]] = []
        dirs: list[Parts] = []

        def visit(rel: Parts) -> None:
            here = (*parts, *rel)
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(self.path(here))
            entries = self._call("listing", here, self.fs.ls, self.path(here), detail=True)
            for entry in entries:
                name = str(entry.get("name", "")).rstrip("/").rsplit("/", 1)[-1]
                if name in ("", ".", "..") or "\\" in name:
                    continue
                fi = _info(entry)
                if fi.is_dir:
                    visit((*rel, name))
                    dirs.append((*rel, name))
                else:
                    files.append(((*rel, name), fi))

        visit(())
        return files, dirs

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        try:
            return self._tree(parts)[0]
        except NotFoundError:
            return []

    def walk_folders(self, parts: Parts) -> list[Parts]:
        try:
            return self._tree(parts)[1]
        except NotFoundError:
            return []

    def _remove_path(self, path: str) -> bool:
        raw = self._raw_info(path)
        if raw is None:
            return False
        if raw.get("type") == "directory":
            self._folders = {f for f in self._folders if f != path and not f.startswith(path + "/")}
            self.fs.rm(path, recursive=True)
        else:
            self.fs.rm_file(path)
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)
        return True

    def remove(self, parts: Parts) -> bool:
        removed: bool = self._call("removing", parts, self._remove_path, self.path(parts))
        return removed

    def _nearest_folder(self, path: str) -> str:
        """``path`` or, before the first write made it, its nearest parent that exists (the
        filesystem's top, ``""`` or ``"/"``, if none does)."""
        top = "/" if path.startswith("/") else ""
        parts = [p for p in path.split("/") if p]
        while parts:
            candidate = top + "/".join(parts)
            raw = self._raw_info(candidate)
            if raw is not None and raw.get("type") == "directory":
                return candidate
            parts.pop()
        return top

    def root_exists(self) -> bool:
        """Whether the store's folder exists (opening never makes it; the first write does)."""
        raw = self._call("stat", (), self._raw_info, self.root)
        return raw is not None and raw.get("type") == "directory"

    def free_space(self, parts: Parts) -> int | None:
        free: int | None = self._call(
            "querying free space of",
            (),
            lambda: self.mover.free_space(self._nearest_folder(self.root)),
        )
        return free

    def describe_more(self) -> dict[str, Any]:
        return {
            **self.extra,
            "filesystem": f"{type(self.fs).__module__}.{type(self.fs).__name__}",
            **self.mover.describe(),
            "checks": {
                "fresh_stat": self.policy.fresh_stat,
                "readback": self.policy.readback,
                "size_after_move": self.policy.check_after_rename,
            },
        }


class _FsspecMoves:
    """:class:`aside.AsideMoves` on the entries of the remote folder ``folder``."""

    def __init__(self, backend: FsspecBackend, folder: str) -> None:
        self.backend, self.folder = backend, folder

    def exists(self, name: str) -> bool:
        return self.backend._raw_info(self.backend._at(self.folder, name)) is not None

    def move(self, src: str, dst: str) -> None:
        at = self.backend._at
        self.backend.mover.move(at(self.folder, src), at(self.folder, dst), replace=False)

    def remove(self, name: str) -> None:
        self.backend._remove_path(self.backend._at(self.folder, name))
