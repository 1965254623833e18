"""GCS error translation, in one place."""

from __future__ import annotations

import io
from typing import Any

from commitstore.backends.object._s3errors import is_unavailable
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    NotFoundError,
)


def translate(exc: BaseException, what: str, shown: str) -> CommitStoreError:
    """Map a gcsfs/aiohttp exception into the error tree."""
    if isinstance(exc, CommitStoreError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(f"{shown} does not exist")
    if isinstance(exc, FileExistsError):
        return AlreadyExistsError(f"{shown} already exists")
    code = getattr(exc, "code", None)
    if code == 412 or "412" in str(exc)[:200] or "conditionNotMet" in str(exc):
        return AlreadyExistsError(f"{shown} already exists")
    if code == 404:
        return NotFoundError(f"{shown} does not exist")
    if is_unavailable(exc) or (isinstance(code, int) and code >= 500):
        return BackendUnavailableError(
            f"{what} {shown}: GCS endpoint unavailable ({type(exc).__name__})"
        )
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return CommitError(f"{what} {shown} failed ({type(exc).__name__}: {text})")


class ViewReader(io.RawIOBase):
    """A seekable, read-only file over a buffer the caller keeps unchanged until the request
    returns, used as a request body.

    aiohttp joins a ``bytes`` body with the request headers (one copy) and asyncio's transport
    keeps what the socket did not take yet (a second copy), so a 64 MiB chunk sent as ``bytes``
    costs three times its size. A file body is streamed in 64 KiB reads instead, and being
    seekable it can be sent again (gcsfs retries; aiohttp re-sends on a redirect status, and GCS
    answers every non-final chunk with 308).
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = self._view.nbytes if size is None or size < 0 else self._pos + size
        data = bytes(self._view[self._pos : end])
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
