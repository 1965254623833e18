"""Scrub: a rolling, budgeted full verification of every copy (primary and mirrors), with repair.

Guarantees:

- **Oldest verification first.** Each target keeps, on itself, when each artifact version was
  last verified in full (``scrubstate``). A scrub lists every target, orders all copies by that
  time (never verified, or a version other than the one checked, first; among equals, a name's
  copies together, the primary's first) and fully verifies them in that order until the budget
  is spent, so successive runs from any machine cover every copy:
  with a byte budget ``B`` and ``T`` bytes of copies in all, every copy is verified at least once
  every ``ceil(T / B)`` runs (plus one for repairs, which also count against the budget).
- **The budget is honoured within one artifact**: a copy is started only while the bytes read
  are below ``budget_bytes`` and the seconds spent below ``budget_seconds``; the run stops before
  the next copy once either is reached (so it passes a budget by at most the one copy, with its
  repair, in progress). The first copy always runs, so every run makes progress.
- **Repair only from a copy that verifies, never over one that does, never by deleting.** A
  mirror's bad or missing copy is copied from the primary through the mirror copy path (the
  primary's bytes are checked against its record on the way; nothing is published on a
  mismatch). A primary copy that fails its record is restored from a mirror copy whose record is
  byte-identical and that verifies, as a normal commit on the primary. Right before either
  publishes (under the target's publish lock, where it has one), the damaged copy is checked
  again: if its record changed (a writer committed a new version meanwhile) or it now verifies,
  nothing is published. A primary name whose copies disagree on the record is reported, not
  repaired; so is an unreadable primary record (no record to compare copies with).
- Nothing is deleted. A target that cannot be listed is reported (``error``) and the others are
  still scrubbed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from commitstore._commit import Committer
from commitstore._scan import StoredRecord, read_record, scan_records
from commitstore._verify import resolve
from commitstore.errors import (
    BackendUnavailableError,
    CommitStoreError,
    ConfigurationError,
    InvalidNameError,
    SourceMismatch,
    StorageError,
)
from commitstore.layout import validate_name
from commitstore.maintenance import scrubstate
from commitstore.mirrors.copy import copy_with_retries
from commitstore.records import Record, RecordFormatError

log = logging.getLogger("commitstore")

COVERAGE_DAYS = (1, 7, 30)
"""The windows of :attr:`TargetScrub.coverage`, in days."""
SAVE_EVERY = 32
"""Full checks between two writes of a target's scrub state (and one at the end of the run)."""


@dataclass(frozen=True, slots=True)
class TargetScrub:
    """What one scrub did on one target (the primary, or a mirror)."""

    url: str
    copies: int
    """Artifact copies the target holds or should hold: its records (readable or not), and on
    a mirror each name the primary holds that it lacks."""
    verified: tuple[str, ...]
    """Copies verified in full by this run (those found whole included)."""
    bytes_verified: int
    found: dict[str, str]
    """Damage found: name -> ``"<status>: <detail>"``, status one of ``missing``,
    ``size_mismatch``, ``hash_mismatch``, ``bad_record``."""
    repaired: dict[str, str]
    """Damaged copies made whole: name -> the URL copied from."""
    unrepaired: dict[str, str]
    """Damaged copies left as they are: name -> why."""
    superseded: dict[str, str]
    """Damaged copies not repaired because, at the last check before the repair published, a
    writer had committed another version under the name (or the copy verified): name -> what
    was seen. Nothing of the writer's is replaced; not a failure."""
    coverage: dict[int, float]
    """Days -> the share of :attr:`copies` verified in full within that many days (this run's
    checks and earlier ones recorded on the target); 1.0 for a target with no copies."""
    error: str = ""
    """Why the target could not be scrubbed at all (it could not be listed); else empty."""


@dataclass(frozen=True, slots=True)
class ScrubReport:
    """Result of :meth:`CommitStore.scrub`: one :class:`TargetScrub` per target, primary first."""

    targets: tuple[TargetScrub, ...]
    bytes_verified: int
    """Bytes read by full checks, all targets together (repairs not included)."""
    seconds: float
    complete: bool
    """True when the run reached every copy (the budget was not spent first)."""

    @property
    def ok(self) -> bool:
        """True when nothing found remains unrepaired and every target could be scrubbed."""
        return all(not t.unrepaired and not t.error for t in self.targets)


def check_budget(value: object, what: str) -> float | None:
    """A budget argument: None, or a positive finite number (ConfigurationError otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what} must be a positive number or None, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{what} must be a positive number or None, not {value!r}")
    return float(value)


class _Kept(Exception):
    """Raised by a repair's last check: the damaged copy changed or verifies; nothing published."""


@dataclass(slots=True)
class _Target:
    store: Committer
    records: dict[str, Record]
    bad: dict[str, str]
    state: scrubstate.State
    checks: scrubstate.State = field(default_factory=dict)
    verified: list[str] = field(default_factory=list)
    bytes: int = 0
    found: dict[str, str] = field(default_factory=dict)
    repaired: dict[str, str] = field(default_factory=dict)
    unrepaired: dict[str, str] = field(default_factory=dict)
    superseded: dict[str, str] = field(default_factory=dict)
    unsaved: int = 0
    seen: set[str] = field(default_factory=set)
    """Names whose copy this run has verified or found damaged already."""

    def last(self, name: str) -> float:
        """When this target's copy of ``name`` was last verified in full (-inf: never, or
        another version)."""
        rec = self.records.get(name)
        seen = self.state.get(name)
        if rec is None or seen is None or (seen.size, seen.digest) != (rec.size, rec.digest):
            return -math.inf
        return seen.at

    def note_ok(self, rec: Record) -> None:
        self.seen.add(rec.name)
        self.checks[rec.name] = scrubstate.Checked(rec.size, rec.digest, time.time())
        self.unsaved += 1
        if self.unsaved >= SAVE_EVERY:
            self.save()

    def save(self) -> None:
        if self.unsaved or self.checks:
            scrubstate.write(self.store.backend, self.store.url, self.checks)
            self.state = scrubstate.merge(self.checks, self.state)
            self.checks = {}
            self.unsaved = 0


def _list(store: Committer) -> _Target:
    records, bad = scan_records(store.backend)
    return _Target(
        store,
        {r.name: r for r in records},
        {b.name: b.detail for b in bad},
        scrubstate.read(store.backend, store.url),
    )


def scrub(
    primary: Committer,
    mirrors: list[Committer],
    *,
    budget_bytes: float | None,
    budget_seconds: float | None,
    repair: bool,
    progress: Callable[[int, int], None] | None = None,
) -> ScrubReport:
    """Scrub ``primary`` and ``mirrors`` (see the module's guarantees). ``progress(done,
    total)``: bytes read so far and the most this run will read (the budget, or every copy)."""
    started = time.monotonic()
    targets: list[_Target | None] = []
    errors: dict[int, str] = {}
    for i, store in enumerate([primary, *mirrors]):
        try:
            targets.append(_list(store))
        except (BackendUnavailableError, StorageError) as exc:
            log.warning("scrub: %s cannot be listed; not scrubbed: %s", store.url, exc)
            errors[i] = str(exc) or type(exc).__name__
            targets.append(None)
    main = targets[0]
    queue: list[tuple[float, str, int]] = []
    for i, t in enumerate(targets):
        if t is None:
            continue
        names = set(t.records) | set(t.bad)
        if i and main is not None:
            names |= set(main.records)
        queue += [(t.last(n), n, i) for n in names]
    queue.sort()  # oldest check first; a name's copies together, the primary's first
    total = sum(
        t.records[n].size for _, n, i in queue if (t := targets[i]) is not None and n in t.records
    )
    if budget_bytes is not None:
        total = min(total, int(budget_bytes))
    spent = 0
    complete = True
    for n, (_last, name, i) in enumerate(queue):
        if n and (
            (budget_bytes is not None and spent >= budget_bytes)
            or (budget_seconds is not None and time.monotonic() - started >= budget_seconds)
        ):
            complete = False
            break
        t = targets[i]
        assert t is not None
        spent += _one(t, i, name, targets, repair)
        if progress is not None:
            progress(min(spent, total), total)
    out = []
    for i, store in enumerate([primary, *mirrors]):
        t = targets[i]
        if t is None:
            out.append(TargetScrub(store.url, 0, (), 0, {}, {}, {}, {}, {}, errors[i]))
            continue
        t.save()
        out.append(_summary(t, i, main))
    return ScrubReport(
        tuple(out), sum(t.bytes_verified for t in out), time.monotonic() - started, complete
    )


def _summary(t: _Target, i: int, main: _Target | None) -> TargetScrub:
    names = set(t.records) | set(t.bad)
    if i and main is not None:
        names |= set(main.records)
    now = time.time()
    coverage = {
        days: (sum(1 for n in names if now - t.last(n) <= days * 86400) / len(names))
        if names
        else 1.0
        for days in COVERAGE_DAYS
    }
    log.info(
        "scrub %s: %d of %d copies verified (%d bytes), %d damaged found, %d repaired, "
        "%d unrepaired",
        t.store.url,
        len(t.verified),
        len(names),
        t.bytes,
        len(t.found),
        len(t.repaired),
        len(t.unrepaired),
    )
    return TargetScrub(
        t.store.url,
        len(names),
        tuple(t.verified),
        t.bytes,
        dict(sorted(t.found.items())),
        dict(sorted(t.repaired.items())),
        dict(sorted(t.unrepaired.items())),
        dict(sorted(t.superseded.items())),
        coverage,
    )


def _one(t: _Target, i: int, name: str, targets: list[_Target | None], repair: bool) -> int:
    """Verify (and, with ``repair``, repair) target ``i``'s copy of ``name``; the bytes read."""
    rec = t.records.get(name)
    if name in t.seen:
        return 0  # seen already by this run (as a repair's source, or while repairing)
    if rec is None:
        why = f"bad_record: {t.bad[name]}" if name in t.bad else "missing: not on this mirror"
        spent = 0
    else:
        try:
            result, _version = resolve(t.store.backend, rec, "full")
        except CommitStoreError as exc:
            t.unrepaired[name] = f"could not be verified: {exc}"
            log.warning("scrub: %s on %s could not be verified: %s", name, t.store.url, exc)
            return 0
        t.verified.append(name)
        t.bytes += rec.size
        spent = rec.size
        if result.status == "ok":
            t.note_ok(rec)
            return spent
        why = f"{result.status}: {result.detail}"
    t.found[name] = why
    t.seen.add(name)
    log.warning("scrub: %s on %s: %s", name, t.store.url, why)
    if not repair:
        t.unrepaired[name] = "not repaired (repair=False)"
        return spent
    if i == 0:
        return spent + _repair_primary(t, name, [m for m in targets[1:] if m is not None])
    main = targets[0]
    if main is None or name not in main.records:
        t.unrepaired[name] = "the primary holds no copy of it to repair from"
        log.warning("scrub: %s on %s not repaired: the primary holds no copy", name, t.store.url)
        return spent
    others = [m for m in targets[1:] if m is not None and m is not t]
    return spent + _repair_mirror(main, t, name, others)


def _current(store: Committer, name: str) -> tuple[bytes | None, Record | None]:
    """The record bytes of ``name`` on ``store`` now (None: no record) and the record (None
    also when it cannot be decoded; its bytes are then returned as read, so a change of it is
    still seen)."""
    parts = validate_name(name)
    try:
        found = read_record(store.backend, parts)
    except RecordFormatError as exc:
        return f"unreadable: {exc}".encode(), None
    return (None, None) if found is None else (found.raw, found.record)


def _still_bad(store: Committer, name: str, seen: bytes | None) -> Callable[[], None]:
    """The last check before a repair publishes on ``store``: the record is still ``seen`` and
    the copy still fails it (else _Kept: nothing is published)."""

    def guard() -> None:
        now, record = _current(store, name)
        if now != seen:
            raise _Kept(f"{name}: a new version was committed on {store.url} meanwhile; kept")
        if record is not None and resolve(store.backend, record, "full")[0].status == "ok":
            raise _Kept(f"{name}: the copy on {store.url} verifies now; kept")

    return guard


def _repair_mirror(
    main: _Target, t: _Target, name: str, mirrors: list[_Target], *, retry: bool = True
) -> int:
    """Copy the primary's ``name`` over the mirror's damaged (or missing) copy; bytes read.
    When the primary's own copy turns out damaged (the copy checks it), it is repaired first
    from another mirror (``_repair_primary``), then the copy is made once more."""
    rec = main.records[name]
    try:
        seen = _current(t.store, name)[0]
    except (InvalidNameError, CommitStoreError) as exc:
        t.unrepaired[name] = f"not repaired: {exc}"
        return 0
    try:
        copy_with_retries(main.store, t.store, name, guard=_still_bad(t.store, name, seen))
    except _Kept as exc:
        t.superseded[name] = str(exc)
        log.info("scrub: %s", exc)
        return rec.size
    except SourceMismatch as exc:
        spent = rec.size
        if retry and name not in main.seen:  # the primary's copy is damaged: repair it first
            main.found[name] = f"{exc.status}: found while copying to {t.store.url}"
            main.seen.add(name)
            log.warning("scrub: %s on %s: %s", name, main.store.url, exc)
            spent += _repair_primary(main, name, mirrors)
            if name in main.repaired:
                return spent + _repair_mirror(main, t, name, mirrors, retry=False)
        t.unrepaired[name] = f"the primary's copy is bad too: {exc}"
        log.warning("scrub: %s on %s not repaired: %s", name, t.store.url, exc)
        return spent
    except Exception as exc:  # this copy's failure: reported, the scrub goes on
        t.unrepaired[name] = f"copy from {main.store.url} failed: {exc}"
        log.warning("scrub: %s on %s not repaired: %s", name, t.store.url, exc)
        return rec.size
    t.repaired[name] = main.store.url
    log.warning("scrub: %s on %s repaired from %s", name, t.store.url, main.store.url)
    return rec.size


def _repair_primary(t: _Target, name: str, mirrors: list[_Target]) -> int:
    """Restore the primary's damaged ``name`` from a mirror copy with a byte-identical record
    that verifies; bytes read (the mirrors' checks and the copy)."""
    rec = t.records.get(name)
    if rec is None:
        t.unrepaired[name] = "the primary's record is unreadable: no record to compare copies with"
        log.warning("scrub: %s on %s not repaired: its record is unreadable", name, t.store.url)
        return 0
    try:
        mine = _current(t.store, name)[0]
    except CommitStoreError as exc:
        t.unrepaired[name] = f"not repaired: {exc}"
        return 0
    spent = 0
    others: list[str] = []
    for m in mirrors:
        try:
            theirs: StoredRecord | None = read_record(m.store.backend, validate_name(name))
        except (RecordFormatError, CommitStoreError):
            continue
        if theirs is None:
            continue
        if theirs.raw != mine:
            others.append(m.store.url)
            continue
        try:
            result, version = resolve(m.store.backend, theirs.record, "full")
        except CommitStoreError:
            continue
        spent += theirs.record.size
        if result.status != "ok" or version != theirs.record:
            continue  # that copy's own turn reports it
        m.bytes += theirs.record.size
        m.verified.append(name)
        m.note_ok(theirs.record)
        source = m

        def guard(src: Committer = source.store) -> None:
            _still_bad(t.store, name, mine)()
            if _current(src, name)[0] != mine:
                raise _Kept(f"{name}: the copy on {src.url} changed meanwhile; not copied")

        try:
            copy_with_retries(source.store, t.store, name, guard=guard)
        except _Kept as exc:
            t.superseded[name] = str(exc)
            log.info("scrub: %s", exc)
            return spent + rec.size
        except Exception as exc:  # this copy's failure: try the next mirror
            log.warning("scrub: %s not restored from %s: %s", name, source.store.url, exc)
            spent += rec.size
            continue
        t.repaired[name] = source.store.url
        log.warning("scrub: %s on %s repaired from %s", name, t.store.url, source.store.url)
        return spent + rec.size
    if others:
        why = f"the copies disagree on the record ({', '.join(others)} hold another version)"
    else:
        why = "no mirror holds a whole copy under an identical record"
    t.unrepaired[name] = why
    log.warning("scrub: %s on %s not repaired: %s", name, t.store.url, why)
    return spent
