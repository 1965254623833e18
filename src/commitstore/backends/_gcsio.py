"""GCS error translation, in one place."""

from __future__ import annotations

from ..errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    NotFoundError,
)
from ._s3io import is_unavailable


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
