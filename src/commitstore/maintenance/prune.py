"""Pruning: gather each target's committed artifacts (one listing each), hash the newest until one
verifies, plan with the pure policy of ``retention.py`` over every target at once, delete
record-first after re-checking each artifact under the publish lock."""

from __future__ import annotations

import functools
import logging
import operator
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from commitstore import _check
from commitstore._commit import Committer
from commitstore._order import arrange, sort_key
from commitstore._scan import read_record, scan_entries
from commitstore.backends import FileInfo
from commitstore.errors import NotFoundError
from commitstore.layout import META_DIR, RECORDS_DIR, Parts, record_parts
from commitstore.maintenance.retention import (
    Candidate,
    Retention,
    TargetPlan,
    keep_set,
    plan_target,
)
from commitstore.records import Record, RecordFormatError

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


@dataclass(frozen=True, slots=True)
class Listed:
    """One committed artifact of one target, as listed: the policy's view and its record."""

    candidate: Candidate
    record: Record


def candidates(store: Committer, pending: set[str]) -> list[Listed]:
    """Every committed artifact of ``store`` with its mtime and size-level wholeness, from one
    listing of the whole store (records included; on object stores, records come from the record
    cache where their tags match, so no request per artifact)."""
    walked = store.backend.walk(())
    listing = dict(walked)
    records_dir = (META_DIR, RECORDS_DIR)
    found, _bad = scan_entries(
        store.backend, [(rel[2:], info) for rel, info in walked if rel[:2] == records_dir]
    )
    out = []
    for entry in found:
        rec = entry.record
        if rec.kind == "file":
            info = listing.get(tuple(rec.name.split("/")))
            whole = info is not None and info.size == rec.size
            mtime = _newest((info, entry.info))
        else:
            parts = tuple(rec.name.split("/"))
            infos = [listing.get(p) for p in _data_paths(rec, parts)]
            whole = all(
                i is not None and i.size == f.size for i, f in zip(infos, rec.files, strict=True)
            )
            mtime = _newest((*infos, entry.info))
        cand = Candidate(
            rec.name, rec.step, sort_key(rec), mtime, whole, rec.name in pending, alias=rec.alias
        )
        out.append(Listed(cand, rec))
    return out


def _newest(infos: Iterable[FileInfo | None]) -> float | None:
    """The newest mtime among data files and record; None if any is missing, unknown or 0."""
    newest = 0.0
    for info in infos:
        mtime = None if info is None else info.mtime
        if mtime is None or mtime <= 0:
            return None
        newest = max(newest, mtime)
    return newest


def _data_paths(rec: Record, parts: Parts) -> list[Parts]:
    if rec.kind == "file":
        return [parts]
    return [(*parts, *f.path.split("/")) for f in rec.files]


_order_of = operator.attrgetter("candidate.order")


def verify_newest(store: Committer, listed: list[Listed]) -> list[Listed]:
    """The newest-good guard's evidence: hash artifacts fully, newest first, until one verifies
    (sizes alone miss bit rot, and on object stores a same-size replacement). Those that fail are
    marked not whole; older ones keep their size-level answer. Costs reading the few newest."""
    out = {item.candidate.name: item for item in listed}
    for item in reversed(arrange(listed, _order_of)):
        if not item.candidate.whole or item.candidate.alias:
            continue  # fails already by size; an alias is never pruned and guards nothing
        result = _check.check(store.backend, item.record, "full")
        if result.status == "ok":
            break
        log.warning(
            "prune: %s on %s fails its check (%s: %s); kept, and not counted as whole",
            item.record.name,
            store.url,
            result.status,
            result.detail,
        )
        out[item.record.name] = Listed(replace(item.candidate, whole=False), item.record)
    return list(out.values())


def still_planned(store: Committer, planned: Record, *, min_age: float) -> str | None:
    """Re-check, just before a delete (under the publish lock), that the record is still the one
    planned and the artifact still old enough (fresh stats of data and record). None: go ahead;
    otherwise why not. ``"gone"``: neither record nor data is there (another prune was first)."""
    parts = tuple(planned.name.split("/"))
    backend = store.backend
    try:
        found = read_record(backend, parts)
    except RecordFormatError:
        return "record changed since the plan (now unreadable)"
    if found is None:
        if backend.stat(parts) is None:
            return "gone"
        return "record gone since the plan (data left alone)"
    if found.record != planned:
        return "record changed since the plan (overwritten)"
    if planned.kind == "file":
        infos = [backend.stat(parts)]
    else:
        fresh = {"/".join(rel): info for rel, info in backend.walk(parts)}
        infos = [fresh.get(f.path) for f in planned.files]
    mtime = _newest((*infos, backend.stat(record_parts(parts))))
    if mtime is None:
        return "unknown mtime"
    if time.time() - mtime < min_age:
        return "modified since the plan (younger than min_age)"
    return None


def _changed(verified: list[Listed], listed: list[Listed]) -> bool:
    """Whether :func:`verify_newest` marked anything of ``listed`` (it keeps the rest as is)."""
    return len(verified) != len(listed) or any(
        a is not b for a, b in zip(verified, listed, strict=True)
    )


def _plans(per_target: list[list[Listed]], policy: Retention, now: float) -> list[TargetPlan]:
    """The size-level plan of every target (one keep-set over all of them)."""
    keep = keep_set([item.candidate for listed in per_target for item in listed], policy)
    return [
        plan_target([i.candidate for i in listed], keep, min_age=policy.min_age, now=now)
        for listed in per_target
    ]


def prune(
    targets: list[Committer],
    policy: Retention,
    *,
    pending: dict[str, set[str]],
    dry_run: bool,
    now: float | None = None,
) -> PruneReport:
    """One keep-set over the whole artifacts of every target (the union of names, so a fresh or
    damaged primary never shrinks a mirror's history); each target then keeps its own newest
    fully verifying artifact and what is newer. Every delete re-checks its record and age under
    the publish lock. ``pending``: per target URL, artifacts whose replication there is queued
    (never deleted)."""
    now = time.time() if now is None else now
    per_target = [candidates(t, pending.get(t.url, set())) for t in targets]
    plans = _plans(per_target, policy, now)
    if any(plan.delete for plan in plans):
        # Hashing can only protect more than the size-level plan (a name that fails is either
        # whole elsewhere or newer than the newest that verifies), so it is needed only when
        # something would be deleted; the plan changes only if some candidate fails.
        verified = [verify_newest(t, ls) for t, ls in zip(targets, per_target, strict=True)]
        if any(_changed(v, ls) for v, ls in zip(verified, per_target, strict=True)):
            per_target, plans = verified, _plans(verified, policy, now)
    out = []
    for store, listed, plan in zip(targets, per_target, plans, strict=True):
        records = {item.record.name: item.record for item in listed}
        deleted, skipped = [], dict(plan.skipped)
        for name in plan.delete:
            if dry_run:
                deleted.append(name)
                continue
            recheck = functools.partial(still_planned, store, records[name], min_age=policy.min_age)
            try:
                reason = store.delete_if(name, recheck)
            except NotFoundError:  # another prune got there first
                reason = None
            if reason is None or reason == "gone":
                deleted.append(name)
                log.info("prune: deleted %s on %s", name, store.url)
            else:
                skipped[name] = reason
                log.info("prune: kept %s on %s: %s", name, store.url, reason)
        out.append(TargetPrune(store.url, tuple(deleted), plan.keep, skipped))
    return PruneReport(tuple(out), dry_run)
