"""The fsspec strategy's per-filesystem parts: which request moves a staged file into place
(:class:`Mover`), how bytes are flushed, what space is free, and the one place fsspec-side
exceptions become the error tree (:func:`translate`).

``fs.mv`` is never trusted blindly: fsspec's default ``mv`` is a copy then a delete, sshfs falls
back to one when the server lacks ``posix-rename@openssh.com``, and webdav4's ``mv`` of a file
is fsspec's copy. Each mover names the request it sends, probed where the protocol lets a client
find out, and declares what that request guarantees.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from typing import Any

from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    NotFoundError,
    StorageError,
)

_NOT_FOUND = {"ResourceNotFound", "SFTPNoSuchFile", "SFTPNoSuchPath"}
_EXISTS = {"ResourceAlreadyExists", "SFTPFileAlreadyExists"}
_NO_SPACE = {"InsufficientStorage", "SFTPNoSpaceOnFilesystem", "SFTPQuotaExceeded"}
_GONE = {
    "ConnectionLost", "DisconnectError", "ChannelOpenError", "SFTPConnectionLost",
    "SFTPNoConnection", "FSTimeoutError", "BadGatewayError", "TransportError", "ConnectError",
    "ReadError", "WriteError", "RemoteProtocolError", "ReadTimeout", "WriteTimeout",
    "ConnectTimeout", "PoolTimeout", "NetworkError", "ProtocolError", "CloseError",
}  # fmt: skip
"""Exception class names (asyncssh, fsspec, httpx, webdav4) that mean "the server is gone"."""


def _names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a webdav4/httpx error, if it carries one."""
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def is_unreachable(exc: BaseException) -> bool:
    """A dropped or refused connection (or a 5xx), not an answer about the file."""
    if isinstance(exc, (ConnectionError, TimeoutError, EOFError)) or _names(exc) & _GONE:
        return True
    status = http_status(exc)
    return status is not None and status >= 500 and status != 507


def translate(exc: BaseException, what: str, shown: str) -> CommitStoreError:
    """Map an fsspec / sshfs / asyncssh / webdav4 / httpx exception to the error tree."""
    if isinstance(exc, CommitStoreError):
        return exc
    names, status, code = _names(exc), http_status(exc), getattr(exc, "errno", None)
    if code == errno.ENOSPC or status == 507 or names & _NO_SPACE:
        return InsufficientSpaceError(f"no space left while {what} {shown}", path=shown)
    if isinstance(exc, FileNotFoundError) or names & _NOT_FOUND or status == 404:
        return NotFoundError(f"{shown} does not exist")
    exists_text = "SFTPFailure" in names and "already exists" in str(exc).lower()  # SFTP v3
    if isinstance(exc, FileExistsError) or names & _EXISTS or status == 412 or exists_text:
        return AlreadyExistsError(f"{shown} already exists")
    if is_unreachable(exc):
        return BackendUnavailableError(f"{what} {shown}: server unreachable ({type(exc).__name__})")
    if status in (401, 403) or names & {"PermissionDenied"}:
        denied = BackendUnavailableError(f"{what} {shown}: access denied ({type(exc).__name__})")
        denied.retryable = False
        return denied
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return CommitError(f"{what} {shown} failed ({type(exc).__name__}: {text})")


def storage_error(exc: BaseException, what: str, shown: str) -> CommitStoreError:
    """Like :func:`translate`, for calls outside the commit recipe (stat, listing, reads,
    removal): a refusal or failure there is StorageError (errno EACCES for a refused call,
    else the exception's own errno, else EIO), not CommitError."""
    err = translate(exc, what, shown)
    if type(err) is not CommitError:
        return err
    code = getattr(exc, "errno", None)
    if not isinstance(code, int):
        refused = isinstance(exc, PermissionError) or http_status(exc) in (401, 403)
        code = errno.EACCES if refused else errno.EIO
    return StorageError(code, str(err), path=shown)


class Mover:
    """Generic: ``fs.mv`` for the move (a native rename when the filesystem class defines its
    own ``mv``), existence checked first for a no-replace move, never trusted to replace."""

    kind = "fsspec mv"
    atomic_replace = False
    """A replacing move is one atomic step on the server."""
    replace_in_one_request = False
    """A replacing move is one request (not atomic on the server, but no client crash can land
    between removing the old file and moving the new one in)."""
    exclusive_create = False
    """A no-replace move fails atomically when the destination exists."""
    staging_mode = "wb"
    """The mode staging files are opened with (``"xb"`` where the protocol has exclusive
    create)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.notes: list[str] = []
        """What this filesystem does not guarantee, for ``describe()``."""

    def move(self, src: str, dst: str, *, replace: bool) -> None:
        """Move ``src`` onto ``dst``; without ``replace`` fail if ``dst`` exists."""
        if not replace and self.fs.exists(dst):
            raise FileExistsError(errno.EEXIST, "exists", dst)
        self.fs.mv(src, dst, recursive=True)
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache()

    def flush(self, handle: Any) -> bool:
        """Push ``handle``'s bytes to the server's stable storage and close it; False when the
        protocol cannot confirm durability. Generic: ``flush``, an ``fsync`` where the file has
        a descriptor (local files), then ``close``."""
        synced = False
        try:
            handle.flush()
            with contextlib.suppress(Exception):
                os.fsync(handle.fileno())
                synced = True
        finally:
            handle.close()
        return synced

    def free_space(self, path: str) -> int | None:
        """Bytes free for new data near ``path``, or None where the protocol cannot say."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"move": self.kind, "not_guaranteed": list(self.notes)}


class SftpMover(Mover):
    """sshfs: SFTP ``RENAME`` (the server refuses an existing destination) and, where the
    server offers it (probed), ``posix-rename@openssh.com`` (``rename(2)``: atomic replace).
    ``fsync@openssh.com`` before close and ``statvfs@openssh.com`` for free space, where
    offered. Staging files are opened with ``FXF_EXCL``."""

    kind = "SFTP rename / posix-rename"
    staging_mode = "xb"

    def __init__(self, fs: Any, root: str) -> None:
        super().__init__(fs)
        from fsspec.asyn import sync

        self._sync = sync
        self.sftp = sync(fs.loop, fs.client.start_sftp_client)
        self.atomic_replace = self._probe_posix_rename(root)
        self.fsync = True
        self.statvfs = self.free_space(root) is not None
        self.notes.append(
            "create-only: SFTP RENAME onto an existing name is refused by the server, which "
            "OpenSSH checks atomically (link, then unlink) but other servers may check, then "
            "rename; declared not atomic"
        )
        if not self.atomic_replace:
            self.notes.append(
                "replace: the server has no posix-rename; the old file is moved aside "
                "(.commitstore.old.<name>), then the new one moved in: between the two another "
                "host may find nothing under the name (a crash there leaves the old version "
                "aside; readers serve it, gc moves it back)"
            )

    def _run(self, fn: Any, *args: Any) -> Any:
        return self._sync(self.fs.loop, fn, *args)

    def _probe_posix_rename(self, root: str) -> bool:
        """Move a probe file onto another one with posix-rename; True if the server did."""
        from asyncssh.sftp import SFTPOpUnsupported

        a = f"{root}/.commitstore.tmp.{secrets.token_hex(8)}.probe"
        b = f"{a}2"
        try:
            for p in (a, b):
                self.fs.pipe_file(p, b"probe")
            self._run(self.sftp.posix_rename, a, b)
            return True
        except SFTPOpUnsupported:
            return False
        finally:
            for p in (a, b):
                with contextlib.suppress(Exception):
                    self.fs.rm_file(p)

    def move(self, src: str, dst: str, *, replace: bool) -> None:
        if replace and self.atomic_replace:
            self._run(self.sftp.posix_rename, src, dst)
        else:
            self._run(self.sftp.rename, src, dst)

    def flush(self, handle: Any) -> bool:
        from asyncssh.sftp import SFTPOpUnsupported

        try:
            try:
                handle.fsync()
            except SFTPOpUnsupported:
                self.fsync = False
        finally:
            handle.close()
        return self.fsync

    def free_space(self, path: str) -> int | None:
        from asyncssh.sftp import SFTPOpUnsupported

        try:
            vfs = self._run(self.sftp.statvfs, path)
        except SFTPOpUnsupported:
            return None
        return int(vfs.bavail * vfs.frsize)


class WebdavMover(Mover):
    """webdav4: ``MOVE`` with ``Overwrite: F`` (412 when the destination exists) or
    ``Overwrite: T``. RFC 4918 lets a server serve ``Overwrite: T`` as a DELETE of the
    destination followed by the move (wsgidav does), so replace is declared not atomic; it is
    still one request, so a client crash never lands between the two."""

    kind = "WebDAV MOVE (Overwrite: F / T)"
    replace_in_one_request = True

    def __init__(self, fs: Any) -> None:
        super().__init__(fs)
        self.notes += [
            "replace: MOVE with Overwrite: T may delete the old file before moving the new one "
            "in (RFC 4918 9.9.3): a reader can find nothing under the name for the length of "
            "that request, and a server crash inside it leaves the new version only under its "
            "staging name",
            "create-only: the server checks the destination, then moves; declared not atomic",
            "durability: WebDAV has no flush; the server answered the PUT",
        ]

    def move(self, src: str, dst: str, *, replace: bool) -> None:
        self.fs.client.move(src, dst, overwrite=replace)

    def flush(self, handle: Any) -> bool:
        handle.close()  # the PUT of the whole staged body
        return False
