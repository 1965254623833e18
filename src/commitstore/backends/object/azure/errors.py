"""Azure Blob error translation, in one place (no other SDK imported: an Azure-only install
works)."""

from __future__ import annotations

from commitstore.backends.object._transport import is_unavailable
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    NotFoundError,
)


def translate(exc: BaseException, what: str, shown: str) -> CommitStoreError:
    """Map an azure-core / azure-storage-blob exception into the error tree."""
    from azure.core.exceptions import (
        HttpResponseError,
        ResourceExistsError,
        ResourceModifiedError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, CommitStoreError):
        return exc
    if isinstance(exc, ResourceNotFoundError):
        return NotFoundError(f"{shown} does not exist")
    if isinstance(exc, (ResourceExistsError, ResourceModifiedError)):
        return AlreadyExistsError(f"{shown} already exists")
    if is_unavailable(exc, (ServiceRequestError, ServiceResponseError)):
        return BackendUnavailableError(f"{what} {shown}: Azure endpoint unavailable")
    status = getattr(exc, "status_code", None)
    if isinstance(exc, HttpResponseError) and status == 412:
        return AlreadyExistsError(f"{shown} already exists")
    if isinstance(status, int) and status >= 500:
        return BackendUnavailableError(f"{what} {shown}: Azure endpoint unavailable ({status})")
    code = getattr(exc, "error_code", None) or type(exc).__name__
    return CommitError(f"{what} {shown} failed ({code})")
