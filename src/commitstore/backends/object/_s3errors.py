"""S3 plumbing: the one place S3 errors are translated, and the conditional-write probe."""

from __future__ import annotations

import asyncio
import errno
import uuid
from typing import Any

from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    NotFoundError,
)

_UNAVAILABLE_WORDS = ("InternalError", "ServiceUnavailable", "SlowDown", "503", "500", "502")


def is_unavailable(exc: BaseException) -> bool:
    """A transport failure or a 5xx: the server could not be reached or could not answer."""
    try:
        from aiohttp import ClientError as AiohttpError
    except ImportError:  # pragma: no cover - aiohttp comes with s3fs
        AiohttpError = ConnectionError  # type: ignore[misc,assignment]
    from botocore.exceptions import (
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    transport = (
        AiohttpError,
        ConnectionError,
        TimeoutError,
        asyncio.TimeoutError,
        EndpointConnectionError,
        ConnectionClosedError,
        ConnectTimeoutError,
        ReadTimeoutError,
    )
    if isinstance(exc, transport):
        return True
    return isinstance(exc, OSError) and any(w in str(exc) for w in _UNAVAILABLE_WORDS)


def translate(exc: BaseException, what: str, shown: str) -> CommitStoreError:
    """Map an s3fs/botocore/aiohttp exception into the error tree."""
    if isinstance(exc, CommitStoreError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(f"{shown} does not exist")
    if isinstance(exc, FileExistsError):
        return AlreadyExistsError(f"{shown} already exists")
    if is_unavailable(exc):
        return BackendUnavailableError(
            f"{what} {shown}: S3 endpoint unavailable ({type(exc).__name__})"
        )
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientSpaceError(f"no space while {what} {shown}", path=shown)
    if isinstance(exc, PermissionError):
        return CommitError(f"{what} {shown}: access denied")
    if "BadDigest" in str(exc) or "XAmzContentSHA256Mismatch" in str(exc):
        return CommitError(
            f"{what} {shown}: the server received bytes that do not match their checksum "
            "(corrupted in transit, retries included); it stored nothing"
        )
    return CommitError(f"{what} {shown} failed ({type(exc).__name__}: {_short(exc)})")


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:200]


def probe_conditional_create(fs: Any, bucket: str, prefix: str) -> bool:
    """Does the endpoint honour ``IfNoneMatch="*"`` on PutObject? Two create-only puts of one
    probe key: the second must fail with 412. The probe key is removed afterwards."""
    key = "/".join(p for p in (prefix, ".commitstore", f"probe-{uuid.uuid4().hex}") if p)
    fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")
    try:
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"2", IfNoneMatch="*")
        honoured = False
    except FileExistsError:
        honoured = True
    except OSError as exc:
        honoured = "412" in str(exc) or "Precondition" in str(exc)
    finally:
        fs.call_s3("delete_object", Bucket=bucket, Key=key)
    return honoured
