"""Transport failures, the same for every object store: the server could not be reached or could
not answer (and a reader that translates a read failing half-way). Imports nothing optional at
module level (a GCS-only or Azure-only install has no botocore); a backend adds its own SDK's
classes through ``extra``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections.abc import Callable
from typing import Any

UNAVAILABLE_WORDS = (
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "503",
    "500",
    "502",
)
"""Words in an ``OSError``'s text that mean a 5xx answer (s3fs folds those into OSError)."""


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")


def is_unavailable(exc: BaseException, extra: tuple[type[BaseException], ...] = ()) -> bool:
    """A transport failure (connection refused, dropped, timed out) or a 5xx answer."""
    transport: tuple[type[BaseException], ...] = (
        ConnectionError,
        TimeoutError,
        asyncio.TimeoutError,
        *extra,
    )
    try:
        from aiohttp import ClientError
    except ImportError:  # pragma: no cover - aiohttp comes with s3fs and gcsfs
        pass
    else:
        transport = (*transport, ClientError)
    if isinstance(exc, transport):
        return True
    code = getattr(exc, "code", None)
    if isinstance(code, int) and 500 <= code < 600:
        return True
    if not isinstance(exc, OSError):
        return False
    # Whole words only, and never inside a URL: a random key or upload id ("...c5932503634...")
    # once made a 403 look like a 503.
    text = _URL.sub(" ", str(exc))
    return any(re.search(rf"(?<![0-9A-Za-z]){w}(?![0-9A-Za-z])", text) for w in UNAVAILABLE_WORDS)


def says_status(exc: BaseException, status: int) -> bool:
    """Whether ``exc``'s text names HTTP ``status`` (its ``code`` aside): as a whole number, never
    inside a URL (a port ``:41251`` or an upload id once made a dropped connection look like
    ``412 Precondition Failed``)."""
    text = _URL.sub(" ", str(exc))
    return re.search(rf"(?<![0-9A-Za-z.:]){status}(?![0-9A-Za-z])", text) is not None


def short(exc: BaseException) -> str:
    """The first line of an exception's text, at most 200 characters, for messages."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:200]


class TranslatedReader(io.RawIOBase):
    """A store's file object for reading (s3fs, gcsfs) whose errors are translated into the
    error tree (``translate``), so nothing raw escapes a read that fails half-way (an object
    replaced while it is read: s3fs ``FileExpired``)."""

    def __init__(self, f: Any, translate: Callable[[BaseException], Exception]) -> None:
        super().__init__()
        self._f, self._translate = f, translate

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            data = self._f.read(len(b))
        except Exception as exc:
            raise self._translate(exc) from exc
        n = len(data)
        b[:n] = data
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        try:
            return int(self._f.seek(offset, whence))
        except Exception as exc:
            raise self._translate(exc) from exc

    def tell(self) -> int:
        return int(self._f.tell())

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a reader loses nothing
            self._f.close()
        super().close()
