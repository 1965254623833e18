"""Garbage collection of what dead writers left: staging files and folders, unfinished uploads."""

from __future__ import annotations

import time
from dataclasses import dataclass

from commitstore.backends import Backend, PendingUpload
from commitstore.layout import Parts, is_staging_part


@dataclass(frozen=True, slots=True)
class GcItem:
    """One leftover of an interrupted write."""

    path: str
    """Relative to the store root (for uploads: the object key the upload would have created)."""
    kind: str
    """``"staging"`` (a staging file or folder) or ``"upload"`` (an unfinished multipart upload)."""
    age: float | None
    """Seconds since it was last modified (started, for uploads); None when unknown."""
    reason: str = ""
    """Why it was kept (``"younger than min_age"``, ``"unknown mtime"``), or empty if removed."""


@dataclass(frozen=True, slots=True)
class GcReport:
    """What :meth:`CommitStore.gc` removed (or, in a dry run, would remove) and what it kept."""

    removed: tuple[GcItem, ...]
    kept: tuple[GcItem, ...]
    dry_run: bool


def _staging_roots(backend: Backend) -> dict[Parts, float | None]:
    """Each staging file or folder under the root, with the newest mtime of what it holds
    (None if any mtime is unknown)."""
    roots: dict[Parts, float | None] = {}
    unknown: set[Parts] = set()
    for rel, info in backend.walk(()):
        for i, part in enumerate(rel):
            if is_staging_part(part):
                root = rel[: i + 1]
                if info.mtime is None:
                    unknown.add(root)
                roots[root] = max(roots.get(root) or 0.0, info.mtime or 0.0)
                break
    return {root: (None if root in unknown else mtime) for root, mtime in roots.items()}


def collect(backend: Backend, *, min_age: float, dry_run: bool) -> GcReport:
    """Remove staging leftovers and unfinished uploads older than ``min_age`` seconds.

    Guarantees: only names with the reserved staging prefix, and only uploads under this store's
    root, are candidates; committed artifacts and records can never match. Anything younger than
    ``min_age`` (a live writer may own it) or of unknown age is kept.
    """
    now = time.time()
    removed: list[GcItem] = []
    kept: list[GcItem] = []

    def judge(path: str, kind: str, mtime: float | None) -> bool:
        age = None if mtime is None else max(0.0, now - mtime)
        if age is None:
            kept.append(GcItem(path, kind, None, "unknown mtime"))
            return False
        if age < min_age:
            kept.append(GcItem(path, kind, age, "younger than min_age"))
            return False
        removed.append(GcItem(path, kind, age))
        return True

    for root, mtime in sorted(_staging_roots(backend).items()):
        if judge("/".join(root), "staging", mtime) and not dry_run:
            backend.remove(root)
    uploads: list[PendingUpload] = backend.pending_uploads()
    for up in uploads:
        if judge(up.key, "upload", up.started) and not dry_run:
            backend.abort_upload(up)
    return GcReport(tuple(removed), tuple(kept), dry_run)
