"""commitstore: checkpoint and artifact writes that are whole or absent, on every storage.

An artifact exists only when it is whole: bytes are staged under a private name, made durable,
published in one step, and recorded (size and xxh3_128 digest). Reads are checked against the record
and fail loud.
"""

from __future__ import annotations

from ._adopt import AdoptReport
from ._gc import GcItem, GcReport
from ._mirrors import MirrorState
from ._open import open_store
from ._prune import PruneReport, TargetPrune
from ._stage import Stage
from ._sync import MirrorSync, SyncReport
from .errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    InsufficientSpaceError,
    IntegrityError,
    InvalidNameError,
    MirrorError,
    NotFoundError,
)
from .records import FileRecord, Record, VerifyReport, VerifyResult
from .retention import Retention
from .store import CommitStore

__version__ = "0.1.0"

__all__ = [
    "AdoptReport",
    "AlreadyExistsError",
    "BackendUnavailableError",
    "CommitError",
    "CommitStore",
    "CommitStoreError",
    "FileRecord",
    "GcItem",
    "GcReport",
    "InsufficientSpaceError",
    "IntegrityError",
    "InvalidNameError",
    "MirrorError",
    "MirrorState",
    "MirrorSync",
    "NotFoundError",
    "PruneReport",
    "Record",
    "Retention",
    "Stage",
    "SyncReport",
    "TargetPrune",
    "VerifyReport",
    "VerifyResult",
    "__version__",
    "open_store",
]
