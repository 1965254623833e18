"""S3 plumbing: the one place S3 errors are translated, and the conditional-write probe."""

from __future__ import annotations

import errno
import uuid
from typing import Any

from commitstore.backends.object._transport import is_unavailable, says_status, short
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    NotFoundError,
)


def _sdk_transport() -> tuple[type[BaseException], ...]:
    """botocore's own transport failures (imported here only: this module is S3's)."""
    from botocore.exceptions import (
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    return (EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError, ReadTimeoutError)


def _no_such_bucket(exc: BaseException) -> bool:
    """The error (or one it was raised from) is S3's ``NoSuchBucket``."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        text = f"{type(seen).__name__} {seen}"
        if "NoSuchBucket" in text or "bucket does not exist" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def translate(exc: BaseException, what: str, shown: str) -> CommitStoreError:
    """Map an s3fs/botocore/aiohttp exception into the error tree."""
    if isinstance(exc, CommitStoreError):
        return exc
    if isinstance(exc, FileNotFoundError):
        if _no_such_bucket(exc):
            return NotFoundError(
                f"{what} {shown}: its bucket does not exist (commitstore creates no buckets: "
                "create it, or check the URL)"
            )
        return NotFoundError(f"{shown} does not exist")
    if type(exc).__name__ == "FileExpired":  # s3fs: the ETag changed between two ranges
        return NotFoundError(f"{shown} was replaced while it was read")
    if isinstance(exc, FileExistsError):
        return AlreadyExistsError(f"{shown} already exists")
    if "BadDigest" in str(exc) or "XAmzContentSHA256Mismatch" in str(exc):
        return CommitError(  # not retryable: checked before the 5xx words of is_unavailable
            f"{what} {shown}: the server received bytes that do not match their checksum "
            "(corrupted in transit, retries included); it stored nothing"
        )
    if isinstance(exc, PermissionError):
        return CommitError(f"{what} {shown}: access denied")
    if is_unavailable(exc, _sdk_transport()):
        return BackendUnavailableError(
            f"{what} {shown}: S3 endpoint unavailable ({type(exc).__name__})"
        )
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientSpaceError(f"no space while {what} {shown}", path=shown)
    return CommitError(f"{what} {shown} failed ({type(exc).__name__}: {short(exc)})")


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
        honoured = says_status(exc, 412) or "Precondition" in str(exc)
    finally:
        fs.call_s3("delete_object", Bucket=bucket, Key=key)
    return honoured
