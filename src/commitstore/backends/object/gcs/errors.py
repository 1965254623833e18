"""GCS error translation, in one place (no other SDK imported: a GCS-only install works)."""

from __future__ import annotations

from commitstore.backends.object._transport import is_unavailable, says_status, short
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
    if code == 412 or says_status(exc, 412) or "conditionNotMet" in str(exc):
        return AlreadyExistsError(f"{shown} already exists")
    if code == 404:
        return NotFoundError(f"{shown} does not exist")
    if is_unavailable(exc):  # transport failures and 5xx (gcsfs's HttpError has a code)
        return BackendUnavailableError(
            f"{what} {shown}: GCS endpoint unavailable ({type(exc).__name__})"
        )
    return CommitError(f"{what} {shown} failed ({type(exc).__name__}: {short(exc)})")
