"""The one error hierarchy of commitstore.

Every error names the contract that was broken, not the backend that broke it. The backend's own
exception, when there is one, is chained as ``__cause__``. Messages never contain credentials.

::

    CommitStoreError
    ├── NotFoundError            (also FileNotFoundError)   no committed artifact by that name
    ├── AlreadyExistsError       (also FileExistsError)     the name is taken and overwrite=False
    ├── IntegrityError                                      bytes do not match their record
    │   └── SourceMismatch                                  a copy's source fails its own record
    ├── CommitError                                         the commit protocol could not complete
    │   ├── MirrorStopped                                   a mirror's replication thread stopped
    │   └── TransactionError                                a commit:// transaction stopped midway
    ├── InsufficientSpaceError   (also OSError, ENOSPC)     not enough room on the target
    ├── InvalidNameError         (also ValueError)          the name is not a valid artifact name
    ├── NameConflictError                                   the call would reach into another name
    ├── ConfigurationError       (also ValueError)          a URL, option or argument is not valid
    │   └── MissingExtraError    (also ImportError)         an integration's extra is not installed
    ├── MirrorError              (also ExceptionGroup)      one or more mirrors failed
    ├── BackendUnavailableError                             the storage could not be reached
    ├── StorageError             (also OSError, errno)      the storage refused or failed a call
    │   └── StoragePathError     (ELOOP, ENOTDIR)           a symlink or file on a name's path
    └── TorchLoadError                                      torch.load refused verified bytes

Whose fault: ``InvalidNameError``, ``ConfigurationError`` and ``AlreadyExistsError`` are the
caller's; ``IntegrityError`` is the data's; ``InsufficientSpaceError`` is the target's and is
permanent until space is freed; ``BackendUnavailableError`` is transient and may be retried;
``StorageError`` (permission refused, read-only filesystem, I/O error on the store's own
folders) is the storage's and permanent.
:attr:`CommitStoreError.retryable` says which: every retry in commitstore decides by it.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Sequence

if sys.version_info >= (3, 11):  # pragma: no cover - version dependent
    from builtins import ExceptionGroup
else:  # pragma: no cover - version dependent
    from exceptiongroup import ExceptionGroup

__all__ = [
    "AlreadyExistsError",
    "BackendUnavailableError",
    "CommitError",
    "CommitStoreError",
    "ConfigurationError",
    "InsufficientSpaceError",
    "IntegrityError",
    "InvalidNameError",
    "MirrorError",
    "MirrorStopped",
    "MissingExtraError",
    "NameConflictError",
    "NotFoundError",
    "SourceMismatch",
    "StorageError",
    "StoragePathError",
    "TorchLoadError",
    "TransactionError",
]


class CommitStoreError(Exception):
    """Root of every error commitstore raises on purpose."""

    retryable: bool = False
    """True when the same call may succeed if repeated later (transient faults)."""


class NotFoundError(CommitStoreError, FileNotFoundError):
    """No committed artifact (or no record) exists under that name."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(errno.ENOENT, message)
        self.name = name

    def __str__(self) -> str:
        return str(self.strerror)


class AlreadyExistsError(CommitStoreError, FileExistsError):
    """The name is already taken and ``overwrite=False``; the existing artifact is untouched."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(errno.EEXIST, message)
        self.name = name

    def __str__(self) -> str:
        return str(self.strerror)


class IntegrityError(CommitStoreError):
    """Stored bytes do not match the size or digest recorded at commit time.

    Attributes carry what was expected (from the record) and what was found, where known.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        status: str | None = None,
        expected_size: int | None = None,
        actual_size: int | None = None,
        expected_digest: str | None = None,
        actual_digest: str | None = None,
    ) -> None:
        super().__init__(message)
        self.name = name
        self.status = status
        self.expected_size = expected_size
        self.actual_size = actual_size
        self.expected_digest = expected_digest
        self.actual_digest = actual_digest


class SourceMismatch(IntegrityError):
    """A copy between stores (replication, ``sync``, ``restore``, a scrub's repair) found the
    source's bytes do not match the source's own record: nothing was copied."""


class CommitError(CommitStoreError):
    """The commit protocol could not complete; nothing was published under the final name."""


class MirrorStopped(CommitError):
    """The mirror's replication thread is no longer running: the artifact was not copied."""


class TransactionError(CommitError):
    """A ``commit://`` transaction (``fs.transaction``) stopped at one file's commit after
    others were committed. Each file holds its old or its new version, and this says which:
    :attr:`committed` (new versions, published), :attr:`failed` (the file whose commit raised:
    old version, nothing published), :attr:`discarded` (never published: old versions). The
    failed commit's own error is chained as ``__cause__``."""

    def __init__(
        self,
        message: str,
        *,
        committed: Sequence[str],
        failed: str,
        discarded: Sequence[str],
    ) -> None:
        super().__init__(message)
        self.committed = tuple(committed)
        self.failed = failed
        self.discarded = tuple(discarded)


class InsufficientSpaceError(CommitStoreError, OSError):
    """The target has not enough free space (ENOSPC). Nothing was published; earlier artifacts
    are intact."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        needed: int | None = None,
        available: int | None = None,
    ) -> None:
        super().__init__(errno.ENOSPC, message)
        self.path = path
        self.needed = needed
        self.available = available

    def __str__(self) -> str:
        return str(self.strerror)


class InvalidNameError(CommitStoreError, ValueError):
    """The artifact name is not valid (see ``docs/format.md``): names only, raised before any
    I/O. A symlink or a file on a valid name's path is a storage state: :class:`StoragePathError`
    (a StorageError that is still an InvalidNameError, deprecated, for older callers)."""


class NameConflictError(CommitStoreError):
    """Names are paths, and the call would reach into another one: deleting or replacing a
    folder path that holds other committed artifacts, committing a file where committed
    artifacts sit below that path, or copying an artifact out (``get_file``) onto a local folder
    or over a file it must not replace. Raised before anything is removed or replaced; nothing
    committed (and no local folder) was touched. The caller's, and permanent."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class ConfigurationError(CommitStoreError, ValueError):
    """A URL, storage option or argument is not valid (an unknown scheme or option, a missing
    extra, a bad ``min_age``, mirror mode or verify level). Raised before any I/O."""


class MissingExtraError(ConfigurationError, ImportError):
    """An optional dependency of an integration module (``commitstore.torch``, ``.lightning``,
    ``.hf``...) is not installed: raised by ``import commitstore.<module>``, chained to the
    ``ModuleNotFoundError``. Also an ``ImportError``, so ``except ImportError`` around an
    optional import still catches it; the message names the extra and the pip command."""


def missing_extra(module: str, extra: str, exc: ModuleNotFoundError) -> MissingExtraError:
    """The error for ``import commitstore.<module>`` failing on ``exc`` (raise it ``from exc``):
    the same pip hint a backend gives for a missing extra."""
    return MissingExtraError(
        f"commitstore.{module} needs the {extra} extra ({exc.name or 'a dependency'} is not "
        f"installed): pip install 'commitstore[{extra}]'"
    )


class MirrorError(ExceptionGroup, CommitStoreError):  # type: ignore[misc]
    """One or more mirrors failed under ``mirror_policy="required"``; one sub-exception each."""

    def __new__(cls, message: str, exceptions: Sequence[Exception]) -> MirrorError:
        return super().__new__(cls, message, exceptions)


class BackendUnavailableError(CommitStoreError):
    """The storage could not be reached (connection refused or dropped, timeout, 5xx)."""

    retryable = True


class StorageError(CommitStoreError, OSError):
    """The storage refused or failed an operation outside the commit recipe (listing, stat,
    read, the publish lock, removal): permission denied, read-only filesystem, I/O error. Also
    an ``OSError`` whose ``errno`` is the storage's own (``EACCES``, ``EROFS``, ``EIO``...), so
    callers may test it.
    Permanent: repeating the call does not help until the storage is fixed. (Inside the commit
    recipe itself, while staging, writing, flushing or renaming, the same failures raise
    :class:`CommitError`, and nothing is published; no space is always
    :class:`InsufficientSpaceError`.)"""

    def __init__(self, code: int, message: str, *, path: str | None = None) -> None:
        super().__init__(code, message)
        self.path = path

    def __str__(self) -> str:
        return str(self.strerror)


class StoragePathError(StorageError, InvalidNameError):
    """A storage state, not a name: a folder on a valid name's path is a symlink (commitstore
    never follows one below the root) or a file (``errno`` ``ELOOP`` or ``ENOTDIR``). A
    :class:`StorageError`; also an :class:`InvalidNameError` only for callers written when that
    was what these raised (deprecated: catch ``StorageError``; the second base goes in v2)."""


class TorchLoadError(CommitStoreError):
    """``torch.load`` refused bytes that matched their record (not a torch file, or a pickled
    object that ``weights_only=True`` does not allow); chained to torch's exception. Raised by
    ``commitstore.torch`` (also reachable there as ``commitstore.torch.TorchLoadError``)."""
