"""Transport failures, the same for every object store: the server could not be reached or could
not answer. Imports nothing optional at module level (a GCS-only or Azure-only install has no
botocore); a backend adds its own SDK's classes through ``extra``."""

from __future__ import annotations

import asyncio

UNAVAILABLE_WORDS = (
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "503",
    "500",
    "502",
)
"""Words in an ``OSError``'s text that mean a 5xx answer (s3fs folds those into OSError)."""


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
    return isinstance(exc, OSError) and any(w in str(exc) for w in UNAVAILABLE_WORDS)


def short(exc: BaseException) -> str:
    """The first line of an exception's text, at most 200 characters, for messages."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:200]
