"""commitstore: checkpoint and artifact writes that are whole or absent, on every storage.

An artifact exists only when it is whole: bytes are staged under a private name, made durable,
published in one step, and recorded (size and xxh3_128 digest). Reads are checked against the record
and fail loud.
"""

from __future__ import annotations

from commitstore._folderwrite import FolderWrite
from commitstore._open import open_store
from commitstore._stagefile import Stage
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    ConfigurationError,
    InsufficientSpaceError,
    IntegrityError,
    InvalidNameError,
    MirrorError,
    NameConflictError,
    NotFoundError,
    StorageError,
    StoragePathError,
)
from commitstore.maintenance.adopt import AdoptReport
from commitstore.maintenance.gc import GcItem, GcReport
from commitstore.maintenance.prune import PruneReport, TargetPrune
from commitstore.maintenance.retention import Retention
from commitstore.maintenance.scrub import ScrubReport, TargetScrub
from commitstore.mirrors.replicator import MirrorState
from commitstore.mirrors.sync import MirrorSync, SyncReport
from commitstore.records import CommitOutcome, FileRecord, Record, VerifyReport, VerifyResult
from commitstore.store import CommitStore

__version__ = "0.1.0"

__all__ = [
    "AdoptReport",
    "AlreadyExistsError",
    "BackendUnavailableError",
    "CommitError",
    "CommitOutcome",
    "CommitStore",
    "CommitStoreError",
    "ConfigurationError",
    "FileRecord",
    "FolderWrite",
    "GcItem",
    "GcReport",
    "InsufficientSpaceError",
    "IntegrityError",
    "InvalidNameError",
    "MirrorError",
    "MirrorState",
    "MirrorSync",
    "NameConflictError",
    "NotFoundError",
    "PruneReport",
    "Record",
    "Retention",
    "ScrubReport",
    "Stage",
    "StorageError",
    "StoragePathError",
    "SyncReport",
    "TargetPrune",
    "TargetScrub",
    "VerifyReport",
    "VerifyResult",
    "__version__",
    "open_store",
]
