"""Pruning: gather each target's committed artifacts (one listing each), plan with the pure policy
of ``retention.py``, delete record-first."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

from commitstore._check import scan_records, sort_key
from commitstore._commit import Committer
from commitstore.errors import NotFoundError
from commitstore.layout import META_DIR, RECORDS_DIR, record_parts
from commitstore.maintenance.retention import (
    Candidate,
    Retention,
    TargetPlan,
    keep_set,
    plan_target,
)
from commitstore.records import Record

log = logging.getLogger("commitstore")


@dataclass(frozen=True, slots=True)
class TargetPrune:
    """What prune did (or, in a dry run, would do) on one target."""

    url: str
    deleted: tuple[str, ...]
    kept: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    """Protected artifacts outside the keep-set, with the reason; records-less files too."""


@dataclass(frozen=True, slots=True)
class PruneReport:
    """Result of :meth:`CommitStore.prune`: one entry per target, the primary first."""

    targets: tuple[TargetPrune, ...]
    dry_run: bool

    @property
    def deleted(self) -> tuple[str, ...]:
        """Deleted on the primary (would be, in a dry run)."""
        return self.targets[0].deleted

    @property
    def kept(self) -> tuple[str, ...]:
        return self.targets[0].kept

    @property
    def skipped(self) -> dict[str, str]:
        return self.targets[0].skipped


def candidates(store: Committer, pending: set[str]) -> list[Candidate]:
    """Every committed artifact of ``store`` with its mtime and size-level wholeness, from one
    listing of the whole store (records included; on object stores, records come from the record
    cache where their tags match, so no request per artifact)."""
    walked = store.backend.walk(())
    listing = {"/".join(rel): info for rel, info in walked}
    records_dir = (META_DIR, RECORDS_DIR)
    records, _bad = scan_records(
        store.backend, [(rel[2:], info) for rel, info in walked if rel[:2] == records_dir]
    )
    out = []
    for rec in records:
        paths = _data_paths(rec)
        infos = [listing.get(p) for p in paths]
        rec_info = listing.get("/".join(record_parts(tuple(rec.name.split("/")))))
        times = [i.mtime if i is not None else None for i in (*infos, rec_info)]
        mtime = None if any(t is None or t <= 0 for t in times) else max(t for t in times if t)
        if rec.kind == "file":
            whole = infos[0] is not None and infos[0].size == rec.size
        else:
            whole = all(
                i is not None and i.size == f.size for i, f in zip(infos, rec.files, strict=True)
            )
        out.append(Candidate(rec.name, rec.step, sort_key(rec), mtime, whole, rec.name in pending))
    return out


def _data_paths(rec: Record) -> list[str]:
    if rec.kind == "file":
        return [rec.name]
    return [f"{rec.name}/{f.path}" for f in rec.files]


def prune(
    targets: list[Committer],
    policy: Retention,
    *,
    pending: dict[str, set[str]],
    dry_run: bool,
    now: float | None = None,
) -> PruneReport:
    """Plan once from the first target's (the primary's) committed steps; apply to every target.
    ``pending``: per target URL, artifacts whose replication there is queued (never deleted)."""
    now = time.time() if now is None else now
    per_target = [candidates(t, pending.get(t.url, set())) for t in targets]
    keep = keep_set(per_target[0], policy)
    out = []
    for store, cands in zip(targets, per_target, strict=True):
        plan: TargetPlan = plan_target(cands, keep, min_age=policy.min_age, now=now)
        deleted = []
        for name in plan.delete:
            if dry_run:
                deleted.append(name)
                continue
            with contextlib.suppress(NotFoundError):  # another prune got there first
                store.delete(name)
            deleted.append(name)
            log.info("prune: deleted %s on %s", name, store.url)
        out.append(TargetPrune(store.url, tuple(deleted), plan.keep, dict(plan.skipped)))
    return PruneReport(tuple(out), dry_run)
