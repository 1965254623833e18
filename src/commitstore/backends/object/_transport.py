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

CONNECT_TIMEOUT = 10.0
"""Default ``connect_timeout`` (seconds) of an object store (S3, GCS, Azure): to open a
connection to the endpoint."""
READ_TIMEOUT = 60.0
"""Default ``read_timeout`` (seconds) of an object store: the longest wait for the next bytes of
an answer (a server that accepted a request and never answers fails after this long)."""
ATTEMPTS = 5
"""Default ``retries`` of an object store: attempts per request in all. S3: the SDK's own
default, in its "legacy" retry mode (transport failures, 5xx, throttling, S3's
``RequestTimeout`` and ``BadDigest`` (a body garbled in transit) are tried again, with
exponential backoff); no layer retries on top of it (s3fs's own retries are off). GCS: gcsfs's
retryable failures, with its backoff (``gcs.py``). Azure: the SDK's retry policy, given
``retries - 1`` retries (``azure.py``)."""


def check_deadlines(connect: Any, read: Any, attempts: Any) -> tuple[float, float, int]:
    """``connect_timeout``, ``read_timeout`` and ``retries`` checked (before any I/O): positive
    numbers of seconds and an integer >= 1.

    Raises:
        ConfigurationError: naming the option and the value given.
    """
    from commitstore.errors import ConfigurationError

    for name, value in (("connect_timeout", connect), ("read_timeout", read)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigurationError(f"{name} must be a positive number of seconds, not {value!r}")
        if value == float("inf"):
            raise ConfigurationError(f"{name} must be finite, not {value!r}")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(f"retries must be an integer >= 1, not {attempts!r}")
    return float(connect), float(read), attempts


def request_deadline(connect: Any, read: Any, attempts: Any) -> dict[str, Any]:
    """The botocore configuration that bounds every S3 request: at most ``attempts`` tries of at
    most ``connect`` + ``read`` seconds of silence each (a body being sent is not silence).
    Raises ConfigurationError for bad values (:func:`check_deadlines`)."""
    connect_s, read_s, tries = check_deadlines(connect, read, attempts)
    return {
        "connect_timeout": connect_s,
        "read_timeout": read_s,
        "retries": {"total_max_attempts": tries, "mode": "legacy"},
    }


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
