"""Pruning: gather each target's committed artifacts (one listing each: of the whole store, or
on object stores of the records only, their data then checked where the plan depends on it), hash
the newest until one verifies, plan with the pure policy of ``retention.py`` over every target at
once, delete record-first after re-checking each artifact under the publish lock."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import operator
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from commitstore import _verify
from commitstore._commit import Committer
from commitstore._newest import pending_marked
from commitstore._order import OrderKey, arrange, sort_key
from commitstore._scan import read_record, scan_entries
from commitstore.backends import Backend, FileInfo
from commitstore.errors import CommitStoreError, NameConflictError, NotFoundError
from commitstore.layout import (
    META_DIR,
    RECORDS_DIR,
    Parts,
    record_parts,
)
from commitstore.maintenance.retention import (
    Candidate,
    Retention,
    TargetPlan,
    guard_window,
    plan_target,
    selection,
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
    error: str | None = None
    """A mirror that could not be reached (or failed while deletions ran there): why. Nothing
    was planned on it (``deleted`` empty), or only what ``deleted`` lists was removed before the
    failure; the other targets were pruned all the same. None: pruned in full."""


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

    @property
    def errors(self) -> dict[str, str]:
        """The mirrors not pruned (in full), by URL, with why (:attr:`TargetPrune.error`)."""
        return {t.url: t.error for t in self.targets if t.error is not None}


@dataclass(frozen=True, slots=True)
class Listed:
    """One committed artifact of one target, as listed: the policy's view and its record."""

    candidate: Candidate
    record: Record
    checked: bool = True
    """Whether the candidate's wholeness and mtime come from its data (listed or stat'ed);
    False: from its record alone (whole assumed, the record's mtime), until the plan depends on
    them (:func:`settle`)."""


def candidates(store: Committer, pending: set[str]) -> list[Listed]:
    """Every committed artifact of ``store`` with its mtime and size-level wholeness. Where the
    backend :attr:`~commitstore.backends.Capabilities.plans_from_records`, from one listing of the
    records (data checked later, where the plan needs it); elsewhere from one listing of the
    whole store, records included. On object stores, records come from the record cache where
    their tags match, so no request per artifact."""
    if store.backend.capabilities.plans_from_records:
        return _from_records(store, pending)
    walked = store.backend.walk(())
    listing = dict(walked)
    records_dir = (META_DIR, RECORDS_DIR)
    records_listing = [(rel[2:], info) for rel, info in walked if rel[:2] == records_dir]
    found, _bad = scan_entries(store.backend, records_listing)
    marked = pending_marked(store.backend, records_listing)
    out = []
    for entry in found:
        rec = entry.record
        infos = [listing.get(p) for p in _data_paths(rec, tuple(rec.name.split("/")))]
        mtime = _newest((*infos, entry.info))
        cand = Candidate(
            rec.name,
            rec.step,
            sort_key(rec),
            mtime,
            _whole(rec, infos),
            rec.name in pending,
            alias=rec.alias,
        )
        item = Listed(cand, rec)
        if marked and record_parts(tuple(rec.name.split("/")))[2:] in marked:
            item = _as_version(store, item)
        out.append(item)
    return out


def _from_records(store: Committer, pending: set[str]) -> list[Listed]:
    """The candidates from the records' listing alone: each whole as far as known, its mtime
    its record's. A name whose pending record is listed too (a commit of it in flight, or one
    that stopped) has its data checked at once."""
    walked = store.backend.walk((META_DIR, RECORDS_DIR))
    found, _bad = scan_entries(store.backend, walked)
    in_flight = pending_marked(store.backend, walked)
    out = []
    for entry in found:
        rec = entry.record
        cand = Candidate(
            rec.name,
            rec.step,
            sort_key(rec),
            _newest((entry.info,)),
            True,
            rec.name in pending,
            alias=rec.alias,
        )
        item = Listed(cand, rec, checked=False)
        if in_flight and record_parts(tuple(rec.name.split("/")))[2:] in in_flight:
            item = _as_version(store, item)
        out.append(item)
    return out


def _as_version(store: Committer, item: Listed) -> Listed:
    """``item``, a name with a pending record (a commit of it in flight, or one that stopped
    after its data step), as the version the name verifies as at size level (``_verify.resolve``,
    fresh stats; in full where a pending version has the record's sizes, which sizes cannot
    tell apart): ranked by that version's step and order, whole if its data matches it, its
    mtime the newest of that data and the record. A name whose data is the pending version is
    then the newest checkpoint it is, never pruned as the older step its record still names;
    ``item.record`` stays the stored record (what each delete re-checks)."""
    result, version = _verify.resolve(store.backend, item.record, "size")  # settled
    data = _newest(_fresh_infos(store.backend, version))
    listed = item.candidate.mtime
    mtime = None if data is None or listed is None else max(data, listed)
    cand = replace(
        item.candidate,
        step=version.step,
        order=sort_key(version),
        alias=version.alias,
        whole=result.status == "ok",
        mtime=mtime,
    )
    return Listed(cand, item.record)


def _check_data(store: Committer, item: Listed) -> Listed:
    """``item`` with its wholeness (sizes) and mtime from fresh stats of its data."""
    infos = _fresh_infos(store.backend, item.record)
    data = _newest(infos)
    listed = item.candidate.mtime
    mtime = None if data is None or listed is None else max(data, listed)
    return Listed(
        replace(item.candidate, whole=_whole(item.record, infos), mtime=mtime), item.record
    )


def _fresh_infos(backend: Backend, rec: Record) -> list[FileInfo | None]:
    """Fresh stats of ``rec``'s data files (a file: one stat; a folder: one walk of it), in the
    order of :func:`_data_paths`; None for a missing one."""
    parts = tuple(rec.name.split("/"))
    if rec.kind == "file":
        return [backend.stat(parts)]
    fresh = {"/".join(rel): info for rel, info in backend.walk(parts)}
    return [fresh.get(f.path) for f in rec.files]


def _whole(rec: Record, infos: list[FileInfo | None]) -> bool:
    """Whether the data files ``infos`` (:func:`_data_paths` order) have the recorded sizes."""
    sizes = [rec.size] if rec.kind == "file" else [f.size for f in rec.files]
    return all(
        i is not None and not i.is_dir and i.size == size
        for i, size in zip(infos, sizes, strict=True)
    )


def settle(
    targets: list[Committer], per_target: list[list[Listed]], policy: Retention, now: float
) -> tuple[list[list[Listed]], list[TargetPlan]]:
    """The plans, once every candidate whose wholeness they depend on has its data checked:
    plan with what is known (a candidate not checked yet counted whole), check the data of the
    unchecked ones the plan depends on (those the keep-set chose for being whole, and each
    target's guard window, ``retention.guard_window``), and plan again until none is left.
    Every candidate outside those is either deleted or kept whatever its wholeness, so the
    plans are the ones checking every artifact's data would give; only the mtimes of the
    unchecked ones are their records' (each delete re-checks with fresh stats). Checks run
    ``capabilities.read_concurrency`` at a time per target.

    A name whose records differ between targets (a mirror that lags an overwrite) is ordered by
    the record of the first target where it is whole, so its data is checked on every target:
    which copy is whole decides where the keep-set places it."""
    first: dict[str, OrderKey] = {}
    mixed: set[str] = set()
    for listed in per_target:
        for item in listed:
            if first.setdefault(item.candidate.name, item.candidate.order) != item.candidate.order:
                mixed.add(item.candidate.name)
    while True:
        everything = [item.candidate for listed in per_target for item in listed]
        keep, chosen = selection(everything, policy)
        need: list[list[Listed]] = []
        for listed in per_target:
            window = {c.name for c in guard_window([i.candidate for i in listed])}
            depends = chosen | window | mixed
            need.append([i for i in listed if not i.checked and i.candidate.name in depends])
        if not any(need):
            plans = [
                plan_target([i.candidate for i in ls], keep, min_age=policy.min_age, now=now)
                for ls in per_target
            ]
            return per_target, plans
        per_target = [
            _check_all(store, listed, todo) if todo else listed
            for store, listed, todo in zip(targets, per_target, need, strict=True)
        ]


def _check_all(store: Committer, listed: list[Listed], todo: list[Listed]) -> list[Listed]:
    """``listed`` with the data of ``todo`` checked (:func:`_check_data`), concurrently."""
    workers = max(1, min(store.backend.capabilities.read_concurrency, len(todo)))
    if workers == 1:
        done = [_check_data(store, item) for item in todo]
    else:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            done = list(pool.map(functools.partial(_check_data, store), todo))
    fresh = {item.record.name: item for item in done}
    return [fresh.get(item.record.name, item) for item in listed]


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
        result = _verify.check(store.backend, item.record, "full")
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
    mtime = _newest((*_fresh_infos(backend, planned), backend.stat(record_parts(parts))))
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
    (never deleted).

    A mirror that cannot be listed (down, refusing) is left out and reported
    (:attr:`TargetPrune.error`, a warning in the log): the keep-set is then computed over the
    other targets (which only keeps more: a name chosen over every target is chosen over fewer),
    and the primary and the reachable mirrors are pruned all the same. A mirror failing during
    its deletions stops there, reported the same way. A primary that fails raises, as before.
    """
    now = time.time() if now is None else now
    down: dict[str, str] = {}
    reached: list[Committer] = []
    per_target: list[list[Listed]] = []
    for i, target in enumerate(targets):
        try:
            per_target.append(candidates(target, pending.get(target.url, set())))
        except CommitStoreError as exc:
            if i == 0:
                raise  # the primary: nothing to plan from
            down[target.url] = _unreachable(target, exc)
            continue
        reached.append(target)
    pruned = _prune_reached(reached, per_target, policy, dry_run=dry_run, now=now)
    out = []
    for target in targets:
        if target.url in down:
            out.append(TargetPrune(target.url, (), (), {}, error=down[target.url]))
        else:
            out.append(pruned.pop(0))
    return PruneReport(tuple(out), dry_run)


def _unreachable(target: Committer, exc: BaseException) -> str:
    """Why a mirror is left out of this prune (logged as a warning)."""
    why = f"not pruned: {type(exc).__name__}: {exc}"
    log.warning("prune: %s %s (pruning goes on on the other targets)", target.url, why)
    return why


def _prune_reached(
    targets: list[Committer],
    per_target: list[list[Listed]],
    policy: Retention,
    *,
    dry_run: bool,
    now: float,
) -> list[TargetPrune]:
    """:func:`prune` over the targets whose artifacts could be listed: a mirror whose deletions
    fail with a storage error stops there (its entry says why); the others go on."""
    per_target, plans = settle(targets, per_target, policy, now)
    if any(plan.delete for plan in plans):
        # Hashing can only protect more than the size-level plan (a name that fails is either
        # whole elsewhere or newer than the newest that verifies), so it is needed only when
        # something would be deleted; the plan changes only if some candidate fails.
        verified = [verify_newest(t, ls) for t, ls in zip(targets, per_target, strict=True)]
        if any(_changed(v, ls) for v, ls in zip(verified, per_target, strict=True)):
            per_target, plans = settle(targets, verified, policy, now)
    out = []
    for i, (store, listed, plan) in enumerate(zip(targets, per_target, plans, strict=True)):
        records = {item.record.name: item.record for item in listed}
        deleted: list[str] = []
        skipped, error = dict(plan.skipped), None
        # deepest names first: a folder artifact whose path holds another artifact planned for
        # deletion is deleted after it, not refused for it
        for name in sorted(plan.delete, key=lambda n: -n.count("/")):
            if dry_run:
                deleted.append(name)
                continue
            recheck = functools.partial(still_planned, store, records[name], min_age=policy.min_age)
            try:
                reason = store.delete_if(name, recheck)
            except NotFoundError:  # another prune got there first
                reason = None
            except NameConflictError as exc:  # a name path that holds kept artifacts: refused
                reason = f"refused: {exc}"
            except CommitStoreError as exc:
                if i == 0:
                    raise
                error = _unreachable(store, exc)
                break
            if reason is None or reason == "gone":
                deleted.append(name)
                log.info("prune: deleted %s on %s", name, store.url)
            else:
                skipped[name] = reason
                log.info("prune: kept %s on %s: %s", name, store.url, reason)
        if deleted and not dry_run:  # deletions are seen at the default level
            log.warning(
                "pruned %d artifact%s from %s: %s",
                len(deleted),
                "" if len(deleted) == 1 else "s",
                store.url,
                ", ".join(deleted),
            )
        out.append(TargetPrune(store.url, tuple(deleted), plan.keep, skipped, error))
    return out
