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
import io
import os
import stat as statmod
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

import smbclient

from commitstore.backends.base import (
    Backend,
    Capabilities,
    DirSink,
    FileInfo,
    FileSink,
    PutMode,
    take_options,
)
from commitstore.backends.rename._smbconn import SmbConnection, call
from commitstore.backends.rename._smbsink import SmbDirSink, SmbFileSink, SmbReader
from commitstore.digest import READ_CHUNK, Hasher
from commitstore.errors import AlreadyExistsError, CommitError, ConfigurationError, NotFoundError
from commitstore.layout import META_DIR, Parts

LOCK_WAIT = 120.0
"""Seconds to wait for another client's publish lock before giving up."""


class SmbBackend(Backend):
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
        self.reason = reason
        base = rf"\\{conn.host}\{conn.share}"
        self.root_unc = base + ("\\" + self.prefix.replace("/", "\\") if self.prefix else "")
        call(conn, "creating", self.shown(()), lambda: self._makedirs(self.root_unc))

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

    # -- Backend API ----------------------------------------------------------------------
    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        overwrite = mode is PutMode.REPLACE
        self.ensure_dir(parts[:-1])
        return SmbFileSink(self, parts, overwrite=overwrite)

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        overwrite = mode is PutMode.REPLACE
        self.ensure_dir(parts[:-1])
        return SmbDirSink(self, parts, overwrite=overwrite)

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

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        out: list[tuple[Parts, FileInfo]] = []

        def visit(rel: Parts) -> None:
            entries = call(
                self.conn,
                "listing",
                self.shown((*parts, *rel)),
                lambda: list(smbclient.scandir(self.unc((*parts, *rel)), **self.kw())),
            )
            for entry in entries:
                info = entry.smb_info
                if entry.is_dir():
                    visit((*rel, entry.name))
                    continue
                ts = info.last_write_time.timestamp() if info.last_write_time else 0.0
                out.append(((*rel, entry.name), FileInfo(info.end_of_file, ts if ts > 0 else None)))

        try:
            visit(())
        except NotFoundError:
            return []
        return out

    def remove(self, parts: Parts) -> bool:
        info = self.stat(parts)
        if info is None:
            return False
        shown = self.shown(parts)
        if info.is_dir:
            for rel, _ in self.walk(parts):
                self._rm(smbclient.remove, (*parts, *rel), shown)
            for rel in self._subdirs(parts):
                self._rm(smbclient.rmdir, (*parts, *rel), shown)
            call(
                self.conn, "removing", shown, lambda: smbclient.rmdir(self.unc(parts), **self.kw())
            )
        else:
            call(
                self.conn, "removing", shown, lambda: smbclient.remove(self.unc(parts), **self.kw())
            )
        return True

    def _rm(self, fn: Callable[..., None], parts: Parts, shown: str) -> None:
        unc = self.unc(parts)
        call(self.conn, "removing", shown, lambda: fn(unc, **self.kw()))

    def _subdirs(self, parts: Parts) -> list[Parts]:
        """Every folder below ``parts``, deepest first."""
        found: list[Parts] = []

        def visit(rel: Parts) -> None:
            for entry in smbclient.scandir(self.unc((*parts, *rel)), **self.kw()):
                if entry.is_dir():
                    visit((*rel, entry.name))
                    found.append((*rel, entry.name))

        call(self.conn, "listing", self.shown(parts), lambda: visit(()))
        return found

    def free_space(self, parts: Parts) -> int | None:
        vol = call(
            self.conn,
            "querying free space of",
            self.shown(()),
            lambda: smbclient.stat_volume(self.root_unc, **self.kw()),
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

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "reason": self.reason,
            "location": self.shown(()),
            "user": self.conn.username,
            "capabilities": {
                k: getattr(self.capabilities, k) for k in self.capabilities.__dataclass_fields__
            },
            "checks": {"flush_before_close": True, "fresh_stat": True, "readback": self.readback},
        }

    # -- shared by the sinks ----------------------------------------------------------------
    def check_size(self, parts: Parts, expected: int, when: str) -> None:
        st = call(
            self.conn,
            "stat",
            self.shown(parts),
            lambda: smbclient.stat(self.unc(parts), **self.kw()),
        )
        if st.st_size != expected:
            raise CommitError(
                f"{self.shown(parts)}: post-copy size check failed {when}: "
                f"{st.st_size} bytes stored, {expected} written"
            )

    def check_digest(self, parts: Parts, expected: str) -> None:
        with self.open_read(parts) as f:
            h = Hasher()
            while chunk := f.read(READ_CHUNK):
                h.update(chunk)
        if h.digest() != expected:
            raise CommitError(f"{self.shown(parts)}: read-back digest {h.digest()} != {expected}")

    def move(self, src: Parts, dst: Parts, *, overwrite: bool) -> None:
        """``rename`` (fails if ``dst`` exists) or ``replace``; retried on sharing violations."""
        fn = smbclient.replace if overwrite else smbclient.rename
        try:
            call(
                self.conn,
                "renaming into place",
                self.shown(dst),
                lambda: fn(self.unc(src), self.unc(dst), **self.kw()),
            )
        except AlreadyExistsError as exc:
            raise AlreadyExistsError(f"{self.shown(dst)} already exists") from exc

    def upload(self, parts: Parts, local: Path) -> None:
        """Copy a local file to ``parts`` (no staging: the caller stages the whole folder)."""

        def run() -> None:
            with (
                smbclient.open_file(self.unc(parts), mode="xb", buffering=0, **self.kw()) as f,
                open(local, "rb") as src,
            ):
                while chunk := src.read(READ_CHUNK):
                    view = memoryview(chunk)
                    while view.nbytes:
                        view = view[f.write(view) :]
                f.flush()

        call(self.conn, "uploading", self.shown(parts), run, attempts=1)


def factory(url: str, options: dict[str, Any]) -> Backend:
    opts = take_options(
        options,
        {"username": None, "password": None, "port": None, "readback": False, "timeout": 30.0},
    )
    parsed = urlsplit(url)
    host = parsed.hostname
    path = [p for p in unquote(parsed.path).split("/") if p]
    if not host or not path:
        raise ConfigurationError("SMB URLs look like smb://[user@]host[:port]/share[/path]")
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
    port = int(opts["port"] or parsed.port or 445)
    conn = SmbConnection(host, port, path[0], username, password, float(opts["timeout"]))
    return SmbBackend(
        conn,
        "/".join(path[1:]),
        readback=bool(opts["readback"]),
        reason="smb:// URL (smbprotocol; flush, fresh-stat size check, rename/replace)",
    )
