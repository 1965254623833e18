"""SMB strategy over smbprotocol's ``smbclient`` (``smb://[user@]host[:port]/share/path``).

Commit: staging file in the destination's own folder on the same share, every byte through the
hasher, SMB2 FLUSH before close (a server-side fsync under Samba's default ``strict sync``), a fresh
stat whose size must equal the bytes written (the post-copy check), optionally a read-back digest,
then ``smbclient.rename`` (``overwrite=False``: fails if the name exists) or ``smbclient.replace``.
SMB has no directory fsync. A per-store lock file opened with exclusive share access serialises
"data then record" across clients.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import stat as statmod
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

import smbclient

from commitstore.backends.base import (
    Backend,
    Capabilities,
    CommitInfo,
    FileInfo,
    PutMode,
    take_options,
)
from commitstore.backends.rename import aside
from commitstore.backends.rename.ops import CommitPolicy, write_all
from commitstore.backends.rename.sink import RenameBackend
from commitstore.backends.rename.smb._conn import SmbConnection, SmbReader, call, translate
from commitstore.digest import READ_CHUNK, hash_stream, read_chunks
from commitstore.errors import CommitError, ConfigurationError, NotFoundError
from commitstore.layout import META_DIR, Parts

LOCK_WAIT = 120.0
"""Seconds to wait for another client's publish lock before giving up."""


_SHARING_VIOLATION = "0xc0000043"
"""STATUS_SHARING_VIOLATION: the file is open in a way that excludes this open."""


class SmbBackend(RenameBackend[Parts, Any]):
    """A folder on an SMB share."""

    strategy = "smb-checked"
    capabilities = Capabilities(
        atomic_replace=True,
        exclusive_create=True,
        dir_fsync=False,
        atomic_dir_publish=True,
        free_space=True,
    )

    def __init__(self, conn: SmbConnection, prefix: str, *, readback: bool, reason: str) -> None:
        self.conn = conn
        self.prefix = prefix.strip("/")
        self.readback = readback
        self.policy = CommitPolicy(
            rename_attempts=4,  # call()'s retries: sharing violations, dropped connections
            fresh_stat=True,
            readback=readback,
            check_after_rename=True,
            dir_fsync_tolerated=(),
        )
        self.reason = reason
        self.share_unc = rf"\\{conn.host}\{conn.share}"
        base = self.share_unc
        self.root_unc = base + ("\\" + self.prefix.replace("/", "\\") if self.prefix else "")
        # Connect (and authenticate) now, creating nothing: the share's own folder is looked
        # at; the store's root is made by the first write (open_folder's makedirs).
        call(conn, "connecting to", self.shown(()), lambda: smbclient.stat(base, **self.kw()))

    def __repr__(self) -> str:
        return f"SmbBackend({self.shown(())!r})"

    def shown(self, parts: Parts) -> str:
        """A credential-free URL for messages."""
        path = "/".join(p for p in (self.conn.share, self.prefix, *parts) if p)
        return f"smb://{self.conn.host}:{self.conn.port}/{path}"

    def unc(self, parts: Parts) -> str:
        return "\\".join((self.root_unc, *parts)) if parts else self.root_unc

    def kw(self) -> dict[str, Any]:
        return self.conn.kwargs()

    def _makedirs(self, unc: str) -> None:
        smbclient.makedirs(unc, exist_ok=True, **self.kw())

    def ensure_dir(self, parts: Parts) -> None:
        call(
            self.conn,
            "creating the folder",
            self.shown(parts),
            lambda: self._makedirs(self.unc(parts)),
        )

    def _at(self, folder: Parts, name: str) -> Parts:
        return (*folder, *name.split("/"))

    # -- rename primitives (see sink.RenameOps) ---------------------------------------------
    def open_folder(self, parts: Parts) -> Parts:
        self.ensure_dir(parts)
        return parts

    def create_staging(self, folder: Parts, name: str) -> Any:
        unc = self.unc(self._at(folder, name))
        return call(
            self.conn,
            "creating the staging file",
            self.shown(self._at(folder, name)),
            lambda: smbclient.open_file(unc, mode="xb", buffering=0, **self.kw()),
            attempts=1,
        )

    def write(self, handle: Any, data: memoryview) -> int:
        n: int = handle.write(data)
        return n

    def finish(self, handle: Any) -> None:
        try:
            handle.flush()  # unbuffered: an SMB2 FLUSH, which the server turns into an fsync
        except BaseException:
            self.discard(handle)
            raise
        handle.close()

    def discard(self, handle: Any) -> None:
        with contextlib.suppress(Exception):
            handle.close()

    def size_of(self, folder: Parts, name: str) -> int | None:
        info = self.stat(self._at(folder, name))
        return None if info is None else info.size

    def digest_of(self, folder: Parts, name: str) -> tuple[int, str]:
        with self.open_read(self._at(folder, name)) as f:
            return hash_stream(f)

    def rename(
        self, folder: Parts, src: str, dst: str, *, mode: PutMode, is_dir: bool, info: CommitInfo
    ) -> None:
        """Files: ``rename`` (fails if ``dst`` exists) or ``replace`` (one step). A folder
        replaces a folder by the move-aside protocol (``aside.py``): the old one moves to its
        aside name, the new one moves in, the aside is removed; a stale aside is settled first."""
        if is_dir and mode is PutMode.REPLACE:
            aside.replace(_SmbMoves(self, folder), src, dst, info.notes)
        else:
            self._move(folder, src, dst, replace=mode is PutMode.REPLACE)

    def _move(self, folder: Parts, src: str, dst: str, *, replace: bool) -> None:
        fn = smbclient.replace if replace else smbclient.rename
        s, d = self.unc((*folder, src)), self.unc((*folder, dst))
        call(
            self.conn,
            "renaming into place",
            self.shown((*folder, dst)),
            lambda: fn(s, d, **self.kw()),
            attempts=self.policy.rename_attempts,
        )

    def sync_folder(self, folder: Parts, info: CommitInfo) -> None:
        info.notes.append("SMB has no directory fsync")

    def remove_at(self, folder: Parts, name: str) -> None:
        self.remove(self._at(folder, name))

    def staging_folder(self, folder: Parts, parts: Parts) -> None:
        return None  # the caller fills a local folder; publish uploads it

    def upload(self, folder: Parts, name: str, local: Path | None) -> None:
        parts = self._at(folder, name)
        if local is None:
            self.ensure_dir(parts)
            return
        self.ensure_dir(parts[:-1])

        def run() -> None:
            with (
                smbclient.open_file(self.unc(parts), mode="xb", buffering=0, **self.kw()) as f,
                open(local, "rb") as src,
            ):
                for chunk in read_chunks(src):
                    write_all(f.write, chunk)
                f.flush()

        call(self.conn, "uploading", self.shown(parts), run, attempts=1)

    def error(self, exc: Exception, what: str, shown: str) -> Exception:
        return translate(exc, what, shown)

    # -- Backend API ----------------------------------------------------------------------
    def open_read(self, parts: Parts) -> BinaryIO:
        shown = self.shown(parts)
        raw = call(
            self.conn,
            "opening",
            shown,
            lambda: smbclient.open_file(
                self.unc(parts), mode="rb", buffering=0, share_access="rwd", **self.kw()
            ),
        )
        return io.BufferedReader(SmbReader(raw, self.conn, shown), READ_CHUNK)

    def stat(self, parts: Parts) -> FileInfo | None:
        try:
            st = call(
                self.conn,
                "stat",
                self.shown(parts),
                lambda: smbclient.stat(self.unc(parts), **self.kw()),
            )
        except NotFoundError:
            return None
        mtime = st.st_mtime if st.st_mtime > 0 else None
        return FileInfo(size=st.st_size, mtime=mtime, is_dir=statmod.S_ISDIR(st.st_mode))

    def _tree(self, parts: Parts) -> tuple[list[tuple[Parts, FileInfo]], list[Parts]]:
        """Every file below ``parts`` and every folder below it (deepest first), one listing
        per folder."""
        files: list[tuple[Parts, FileInfo]] = []
        dirs: list[Parts] = []

        def visit(rel: Parts) -> None:
            entries = call(
                self.conn,
                "listing",
                self.shown((*parts, *rel)),
                lambda: list(smbclient.scandir(self.unc((*parts, *rel)), **self.kw())),
            )
            for entry in entries:
                if entry.is_dir():
                    visit((*rel, entry.name))
                    dirs.append((*rel, entry.name))
                    continue
                info = entry.smb_info
                ts = info.last_write_time.timestamp() if info.last_write_time else 0.0
                fi = FileInfo(info.end_of_file, ts if ts > 0 else None)
                files.append(((*rel, entry.name), fi))

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

    def remove(self, parts: Parts) -> bool:
        info = self.stat(parts)
        if info is None:
            return False
        shown = self.shown(parts)
        targets = [(smbclient.remove, parts)]
        if info.is_dir:
            files, dirs = self._tree(parts)
            targets = [
                *((smbclient.remove, (*parts, *rel)) for rel, _ in files),
                *((smbclient.rmdir, (*parts, *rel)) for rel in dirs),
                (smbclient.rmdir, parts),
            ]
        for fn, target in targets:
            call(self.conn, "removing", shown, functools.partial(fn, self.unc(target), **self.kw()))
        return True

    def held(self, parts: Parts) -> bool:
        """True if a file of the staging entry ``parts`` is open in a writer (its handle
        shares no delete access: the server refuses another open for delete with a sharing
        violation, and would refuse gc's removal the same way). A live writer's staging file,
        or a multi-writer folder with a file being written, is kept whatever its age; a dead
        writer's handles are closed by the server when its connection drops."""
        info = self.stat(parts)
        if info is None:
            return False
        files = [(*parts, *rel) for rel, _ in self._tree(parts)[0]] if info.is_dir else [parts]
        for target in files:
            try:
                with smbclient.open_file(
                    self.unc(target), mode="rb", share_access="rw", **self.kw()
                ):
                    pass
            except OSError as exc:
                if _SHARING_VIOLATION in str(exc):
                    return True
        return False

    def root_exists(self) -> bool:
        """Whether the store's folder exists on the share."""
        info = self.stat(())
        return info is not None and info.is_dir

    def free_space(self, parts: Parts) -> int | None:
        """The share's free space (asked of the root folder, or of the share's own folder
        before the first write made the root)."""
        try:
            vol = call(
                self.conn,
                "querying free space of",
                self.shown(()),
                lambda: smbclient.stat_volume(self.root_unc, **self.kw()),
            )
        except NotFoundError:
            vol = call(
                self.conn,
                "querying free space of",
                self.shown(()),
                lambda: smbclient.stat_volume(self.share_unc, **self.kw()),
            )
        return int(vol.caller_available_size)

    @contextlib.contextmanager
    def publish_lock(self) -> Iterator[None]:
        """An exclusive-share open of ``.commitstore/lock``: other clients wait (up to LOCK_WAIT s);
        the server drops it if the holder's connection dies."""
        self.ensure_dir((META_DIR,))
        unc = self.unc((META_DIR, "lock"))
        deadline = time.monotonic() + LOCK_WAIT
        delay = 0.01
        while True:
            try:
                handle = call(
                    self.conn,
                    "locking",
                    self.shown((META_DIR, "lock")),
                    lambda: smbclient.open_file(
                        unc, mode="ab", buffering=0, share_access=None, **self.kw()
                    ),
                    attempts=1,
                )
                break
            except CommitError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                handle.close()

    def describe_more(self) -> dict[str, Any]:
        return {
            "user": self.conn.username,
            "checks": {
                "flush_before_close": True,
                "fresh_stat": self.policy.fresh_stat,
                "readback": self.policy.readback,
            },
        }


class _SmbMoves:
    """:class:`aside.AsideMoves` on the entries of the share folder ``folder``."""

    def __init__(self, backend: SmbBackend, folder: Parts) -> None:
        self.backend, self.folder = backend, folder

    def exists(self, name: str) -> bool:
        return self.backend.stat((*self.folder, name)) is not None

    def move(self, src: str, dst: str) -> None:
        self.backend._move(self.folder, src, dst, replace=False)

    def remove(self, name: str) -> None:
        self.backend.remove((*self.folder, name))


def factory(url: str, options: dict[str, Any]) -> Backend:
    opts = take_options(
        options,
        {"username": None, "password": None, "port": None, "readback": False, "timeout": 30.0},
        kinds={"port": (int, None)},
    )
    shape = "SMB URLs look like smb://[user@]host[:port]/share[/path]"
    try:
        parsed = urlsplit(url)
        host, url_port = parsed.hostname, parsed.port
    except ValueError as exc:  # a bracketed host that is not IPv6, a port not a number, ...
        raise ConfigurationError(f"{shape} ({exc})") from exc
    path = [p for p in unquote(parsed.path).split("/") if p]
    if not host or not path:
        raise ConfigurationError(shape)
    username = (
        opts["username"]
        or (unquote(parsed.username) if parsed.username else None)
        or os.environ.get("COMMITSTORE_SMB_USERNAME")
    )
    password = (
        opts["password"]
        or (unquote(parsed.password) if parsed.password else None)
        or os.environ.get("COMMITSTORE_SMB_PASSWORD")
    )
    try:
        port = int(opts["port"] or url_port or 445)
        timeout = float(opts["timeout"])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"the port and timeout options must be numbers ({exc})") from exc
    conn = SmbConnection(host, port, path[0], username, password, timeout)
    return SmbBackend(
        conn,
        "/".join(path[1:]),
        readback=bool(opts["readback"]),
        reason="smb:// URL (smbprotocol; flush, fresh-stat size check, rename/replace)",
    )
