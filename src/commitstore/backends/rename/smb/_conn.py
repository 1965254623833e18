"""SMB plumbing for the smb strategy: connection settings, the one place SMB errors are translated,
bounded retries (sharing violations, dropped connections), and the translating reader."""

from __future__ import annotations

import contextlib
import errno
import io
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    NotFoundError,
)

T = TypeVar("T")

STATUS_SHARING_VIOLATION = 0xC0000043
STATUS_DISK_FULL = 0xC000007F
STATUS_QUOTA_EXCEEDED = 0xC0000044
STATUS_ACCESS_DENIED = 0xC0000022
STATUS_DELETE_PENDING = 0xC0000056
_AUTH_STATUS = (0xC000006D, 0xC000006E, 0xC0000072, 0xC0000071, 0xC0000193, 0xC0000224)
"""Logon failure, account restriction, disabled, password expired, account expired, must change."""
_TRANSIENT_STATUS = (STATUS_SHARING_VIOLATION, STATUS_DELETE_PENDING)


@dataclass
class SmbConnection:
    """Where and as whom to connect. ``password`` never appears in repr, messages or logs."""

    host: str
    port: int
    share: str
    username: str | None
    password: str | None = field(repr=False)
    timeout: float = 30.0
    _local: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def cache(self) -> dict[str, Any]:
        """Per-store, per-thread connection cache (smbclient's global one is keyed without
        credentials). One connection per thread: SMB credits are per connection, and a
        background mirror thread must not starve the training thread's requests."""
        cache: dict[str, Any] | None = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = {}
        return cache

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for every smbclient call: port, credentials, per-store cache.

        Credentials go with every call so a dropped connection is re-established transparently.
        The thread's connection is made here, with a client GUID of its own (:meth:`_connect`).
        """
        self._connect()
        return {
            "port": self.port,
            "username": self.username,
            "password": self.password,
            "connection_cache": self.cache,
            "connection_timeout": self.timeout,
        }

    def _connect(self) -> None:
        """Make this thread's connection, if it has none that is connected, with a ClientGUID of
        its own, before smbclient would make one with the process-wide GUID (then cached the
        same way, under ``host:port``: smbclient's session setup and every call reuse it).

        Samba (4.15 and later) hands a new connection whose negotiate carries a ClientGUID it
        already serves to the smbd process serving that client. Connections opened in parallel
        by one process (one per thread here: a mirror's worker, sync's transfer threads, the
        training thread) all carry smbclient's one GUID, and that hand-off races: the passed
        connection is left with no credits (Samba logs "client used more credits than granted"
        for message id 1 or 2), and the client's session setup, which waits for its answer
        without a timeout, hung the calling thread (or the connection was closed). With its
        own GUID each connection is a client of its own, served by its own smbd process."""
        key = f"{self.host.lower()}:{self.port}"
        cache = self.cache
        found = cache.get(key)
        if found is not None and found.transport.connected:
            return
        from smbprotocol.connection import Connection
        from smbprotocol.exceptions import SMBConnectionClosed, SMBException

        made = Connection(uuid.uuid4(), self.host, self.port, require_signing=True)
        try:
            made.connect(timeout=self.timeout)
        except SMBConnectionClosed:
            raise
        except SMBException as exc:  # a server that accepts and never answers the negotiate
            if "timeout" not in str(exc).lower():
                raise
            with contextlib.suppress(Exception):
                made.disconnect(close=False)
            raise TimeoutError(
                f"SMB server {self.host}:{self.port} did not answer within {self.timeout:g}s"
            ) from exc
        cache[key] = made

    def reset(self) -> None:
        """Drop cached connections (after a connection error)."""
        import smbclient

        try:
            smbclient.reset_connection_cache(connection_cache=self.cache)
        except Exception:
            self.cache.clear()


def _ntstatus(exc: BaseException) -> int | None:
    status = getattr(exc, "ntstatus", None)
    if status is None:
        status = getattr(exc, "status", None)
    return int(status) if isinstance(status, int) else None


def is_connection_error(exc: BaseException) -> bool:
    """A dropped or refused connection (retry after reconnecting), not an answer from the server."""
    from smbprotocol.exceptions import SMBConnectionClosed

    if isinstance(exc, (SMBConnectionClosed, ConnectionError, TimeoutError, EOFError)):
        return True
    if isinstance(exc, ValueError) and "Failed to connect" in str(exc):
        return True
    return isinstance(exc, OSError) and exc.errno in (
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
    )


def translate(exc: BaseException, what: str, shown: str) -> CommitStoreError:
    """Map an smbclient/smbprotocol exception to the error tree (the only place that does)."""
    from smbprotocol.exceptions import SMBAuthenticationError

    if isinstance(exc, CommitStoreError):
        return exc
    if isinstance(exc, SMBAuthenticationError) or _ntstatus(exc) in _AUTH_STATUS:
        denied = BackendUnavailableError(f"{what} {shown}: SMB authentication failed")
        denied.retryable = False
        return denied
    if is_connection_error(exc):
        said = f": {exc}" if isinstance(exc, TimeoutError) and str(exc) else ""
        return BackendUnavailableError(
            f"{what} {shown}: SMB server unreachable ({type(exc).__name__}{said})"
        )
    status = _ntstatus(exc)
    if status in (STATUS_DISK_FULL, STATUS_QUOTA_EXCEEDED):
        return InsufficientSpaceError(
            f"no space left on the share while {what} {shown}", path=shown
        )
    code = getattr(exc, "errno", None)
    if code == errno.ENOENT:
        return NotFoundError(f"{shown} does not exist")
    if code == errno.EEXIST:
        return AlreadyExistsError(f"{shown} already exists")
    detail = (
        f"NtStatus 0x{status:08x}"
        if status is not None
        else f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    )
    return CommitError(f"{what} {shown} failed ({detail})")


def call(
    conn: SmbConnection,
    what: str,
    shown: str,
    fn: Callable[[], T],
    *,
    attempts: int = 4,
    reconnect: bool = True,
) -> T:
    """Run ``fn`` with bounded retries: sharing violations (another handle is closing) and, when
    ``reconnect``, dropped connections. Everything else is translated and raised at once."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            last = attempt + 1 >= attempts
            if _ntstatus(exc) in _TRANSIENT_STATUS and not last:
                time.sleep(0.05 * 2**attempt)
                continue
            if reconnect and is_connection_error(exc) and not last:
                conn.reset()
                time.sleep(0.1 * 2**attempt)
                continue
            raise translate(exc, what, shown) from exc
    raise AssertionError("unreachable")  # pragma: no cover


class SmbReader(io.RawIOBase):
    """Raw reader that translates SMB errors into the error tree."""

    def __init__(self, raw: Any, conn: SmbConnection, shown: str) -> None:
        super().__init__()
        self._raw = raw
        self._conn = conn
        self._shown = shown

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            n: int = self._raw.readinto(b)
            return n
        except Exception as exc:
            raise translate(exc, "reading", self._shown) from exc

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        pos: int = self._raw.seek(offset, whence)
        return pos

    def tell(self) -> int:
        pos: int = self._raw.tell()
        return pos

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._raw.close()
        super().close()
