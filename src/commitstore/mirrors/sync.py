"""One-shot repair of mirrors (``sync``), restore to the primary, and ``latest`` across stores."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass

from commitstore import _newest
from commitstore._commit import Committer
from commitstore._scan import StoredRecord, list_records, read_record, scan_records
from commitstore._verify import pending_versions, resolve, stored_version, verify
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitStoreError,
    IntegrityError,
    NotFoundError,
    SourceMismatch,
    StorageError,
)
from commitstore.layout import (
    META_DIR,
    RECORDS_DIR,
    Parts,
    is_staging_part,
    record_parts,
    validate_name,
)
from commitstore.mirrors.copy import copy_with_retries, held_in_memory
from commitstore.records import Record, RecordFormatError, VerifyResult

log = logging.getLogger("commitstore")


@dataclass(frozen=True, slots=True)
class MirrorSync:
    """What ``sync`` did on one mirror. Nothing is ever deleted on a mirror."""

    url: str
    copied: tuple[str, ...]
    """Artifacts the mirror lacked, now copied."""
    repaired: tuple[str, ...]
    """Mirror copies that failed verification (or differed from the primary's record), replaced."""
    ok: tuple[str, ...]
    """Already whole and identical."""
    foreign: tuple[str, ...]
    """On the mirror but not committed on the primary (other tools' files, old checkpoints):
    reported, never touched."""
    failed: dict[str, str]
    """Copies that could not be made, with the error."""


@dataclass(frozen=True, slots=True)
class SyncReport:
    """Result of :meth:`Committer.sync`."""

    mirrors: tuple[MirrorSync, ...]
    primary_bad: dict[str, str]
    """Primary artifacts that fail their own check: never copied anywhere."""

    @property
    def ok(self) -> bool:
        """True when every mirror holds every whole primary artifact."""
        return not self.primary_bad and all(not m.failed for m in self.mirrors)


class _PrimaryChecks:
    """Full checks of primary artifacts, each done at most once across mirrors: the version
    each one verifies as (its record, or a pending version: ``_verify.resolve``)."""

    def __init__(self, primary: Committer) -> None:
        self.primary = primary
        self.bad: dict[str, str] = {}
        self._done: dict[str, Record | None] = {}
        self._lock = threading.Lock()

    def whole(self, rec: Record) -> bool:
        """Whether ``rec``'s artifact verifies on the primary (as some version of it)."""
        return self.version(rec) is not None

    def version(self, rec: Record) -> Record | None:
        """The version ``rec``'s artifact verifies as on the primary; None (and reported bad)
        if it verifies as none."""
        with self._lock:
            if rec.name in self._done:
                return self._done[rec.name]
        result, version = resolve(self.primary.backend, rec, "full")
        if result.status != "ok":
            self.note(rec.name, None, f"{result.status}: {result.detail}")
            return None
        self.note(rec.name, version)
        return version

    def note(self, name: str, version: Record | None, why: str = "") -> None:
        """What a check or a copy found: the version the primary's copy is, or None (bad,
        ``why``)."""
        with self._lock:
            self._done[name] = version
            if version is None:
                self.bad[name] = why


TRANSFERS = 2
"""Artifacts published at once per mirror by ``sync`` (mirrors themselves run side by side).
One more is read and staged meanwhile, so the mirror never waits for the primary to be read."""

STAGING_MEMORY = 128 * 1024 * 1024
"""Bytes that the copies of one ``sync`` may hold in memory at once, all mirrors together. An
object store's sink holds a file artifact up to the store's ``whole_max`` (64 MiB on S3) until it
sends it whole, so each such copy reserves that much (its size, if smaller) before it reads a
byte, and waits while the reservations of the copies already running leave no room. A copy never
reserves more than the budget, so one always runs. Copies that hold nothing reserve nothing
(``copy.held_in_memory``): to mirrors that stage on disk (local folders, SMB, bridges), of folder
artifacts (staged in a local folder), and from a local primary to a store whose sink sends the
bodies from the primary's file (S3)."""


class _Budget:
    """A counting semaphore over bytes: :meth:`hold` waits until ``n`` more fit in ``total``."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._used = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, n: int) -> Iterator[None]:
        n = min(n, self.total)
        with self._cond:
            self._cond.wait_for(lambda: self._used + n <= self.total)
            self._used += n
        try:
            yield
        finally:
            with self._cond:
                self._used -= n
                self._cond.notify_all()


def sync_mirrors(
    primary: Committer,
    mirrors: list[Committer],
    *,
    repair: bool,
    transfers: int = TRANSFERS,
    staging_memory: int = STAGING_MEMORY,
    progress: Callable[[int], None] | None = None,
) -> SyncReport:
    """Copy what each mirror lacks (or, with ``repair``, holds broken), ``transfers`` artifacts at
    a time per mirror, the next one staged meanwhile, holding at most ``staging_memory`` bytes
    of staged copies in memory across all mirrors (see :data:`STAGING_MEMORY`). The mirror's
    records are listed once (an artifact it lacks costs no lookup). The primary is read once per
    copy: the copy itself checks the bytes against the primary's record (``copy_artifact``) and
    publishes nothing on a mismatch. Artifacts a mirror already holds are checked on both sides,
    so primary corruption is reported even when nothing needs copying; where either side
    verifies as a pending version, the versions (not the record files) are compared.
    ``progress``: called with the bytes copied so far (every mirror), after each copy, one
    call at a time."""
    records = list_records(primary.backend)
    copied = _Copied(progress)
    names = {r.name for r in records}
    checks = _PrimaryChecks(primary)
    memory = _Budget(max(1, staging_memory))  # shared: the bound is the process's

    def one(mirror: Committer) -> MirrorSync:
        ctx = _MirrorCtx(
            mirror, _record_paths(mirror), threading.Semaphore(max(1, transfers)), memory, copied
        )
        with concurrent.futures.ThreadPoolExecutor(max(1, transfers) + 1) as pool:
            outcomes = list(pool.map(lambda r: _sync_one(primary, ctx, r, checks, repair), records))
        done: dict[str, list[str]] = {"copied": [], "repaired": [], "ok": []}
        failed: dict[str, str] = {}
        for rec, (outcome, detail) in zip(records, outcomes, strict=True):
            if outcome == "failed":
                failed[rec.name] = detail
            elif outcome in done:
                done[outcome].append(rec.name)
        report = verify(mirror.backend, None, "size")
        foreign = sorted({r.name for r in report.results if r.name not in names})
        for name in foreign:
            log.info("sync: %s on %s is not on the primary; left alone", name, mirror.url)
        return MirrorSync(
            mirror.url,
            tuple(done["copied"]),
            tuple(done["repaired"]),
            tuple(done["ok"]),
            tuple(foreign),
            failed,
        )

    # Mirrors are independent: repair them side by side.
    with concurrent.futures.ThreadPoolExecutor(max(1, len(mirrors))) as pool:
        out = list(pool.map(one, mirrors))
    return SyncReport(tuple(out), dict(sorted(checks.bad.items())))


class _Copied:
    """The bytes every mirror's copies published so far, reported to a progress callback one
    call at a time."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        self._progress = progress
        self._done = 0
        self._lock = threading.Lock()

    def add(self, size: int) -> None:
        if self._progress is None:
            return
        with self._lock:
            self._done += size
            self._progress(self._done)


@dataclass(frozen=True, slots=True)
class _MirrorCtx:
    store: Committer
    records: set[Parts]
    """Where the mirror had record files when sync started."""
    publish_slots: threading.Semaphore
    memory: _Budget
    """Reservations of the copies' in-memory staging (one budget for every mirror)."""
    copied: _Copied


def _record_paths(store: Committer) -> set[Parts]:
    """The record files ``store`` holds, from one listing."""
    listing = store.backend.walk((META_DIR, RECORDS_DIR))
    return {(META_DIR, RECORDS_DIR, *rel) for rel, _ in listing if not is_staging_part(rel[-1])}


def _sync_one(
    primary: Committer, ctx: _MirrorCtx, rec: Record, checks: _PrimaryChecks, repair: bool
) -> tuple[str, str]:
    """Bring one artifact to the mirror: ("ok" | "copied" | "repaired" | "failed" | "skipped",
    detail). "skipped": the primary's own copy is bad (reported in ``checks.bad``)."""
    mirror = ctx.store
    theirs = None
    if record_parts(validate_name(rec.name)) not in ctx.records:
        state = "missing"
    else:
        try:
            theirs = _stored(mirror, rec.name)
        except IntegrityError:
            state = "bad"
        else:
            state = "missing" if theirs is None else "present"
    if state == "present":
        assert theirs is not None
        same = _same_version(primary, mirror, rec, theirs, checks)
        if same is None:
            return "skipped", ""
        if same:
            return "ok", ""
        state = "bad"
    if rec.name in checks.bad:
        return "skipped", ""
    if state == "bad" and not repair:
        if checks.whole(rec):
            return "failed", "mirror copy fails verification (repair=False)"
        return "skipped", ""
    try:
        with ctx.memory.hold(held_in_memory(primary, mirror, rec)):
            copied = copy_with_retries(
                primary, mirror, rec.name, publish_slots=ctx.publish_slots, keep_unrecorded=True
            )
    except SourceMismatch as exc:
        checks.note(rec.name, None, f"{exc.status}: {exc}")
        return "skipped", ""
    except Exception as exc:  # any failure is this artifact's, reported like replication's
        log.warning("sync: %s not copied to %s: %s", rec.name, mirror.url, exc)
        try:
            whole = checks.whole(rec)
        except Exception:  # the primary cannot even be checked: still this artifact's failure
            whole = True
        if whole:  # else the primary's copy is gone or bad: reported there
            return "failed", str(exc) or repr(exc)
        return "skipped", ""
    checks.note(rec.name, copied)
    ctx.copied.add(copied.size)
    return ("copied" if state == "missing" else "repaired"), ""


def _same_version(
    primary: Committer, mirror: Committer, rec: Record, theirs: StoredRecord, checks: _PrimaryChecks
) -> bool | None:
    """Whether the mirror (record ``theirs``) holds, whole, the version the primary's artifact
    (record ``rec``) verifies as, with a byte-identical record; None if the primary's copy is
    bad. Either side may verify as a pending version (a commit stopped after its data step):
    its record bytes are then the pending record's. Records that differ, with no pending
    version on either side, need no check of the data (one small read per side)."""
    mine = _stored(primary, rec.name)
    if mine is None or mine.record != rec:
        return False  # the primary moved on since it was listed: copy what it holds now
    if theirs.raw != mine.raw and not (
        pending_versions(primary.backend, rec) or pending_versions(mirror.backend, theirs.record)
    ):
        return False
    result, seen = resolve(mirror.backend, theirs.record, "full")
    if result.status != "ok":
        return False
    ours = checks.version(rec)
    if ours is None:
        return None
    if ours != seen:
        return False
    return (
        stored_version(primary.backend, mine, ours).raw
        == stored_version(mirror.backend, theirs, seen).raw
    )


def latest_any(stores: Sequence[Committer], level: str) -> Record | None:
    """The newest artifact that is whole on at least one of ``stores`` (primary first), as the
    record of the version it verifies as there (a pending version, with its step and metadata,
    where a commit stopped after its data step; it ranks by that version, ``_newest``).

    A store that cannot be reached (down, refusing, past its deadlines) is skipped with a
    warning, from the first failed request on, so a mirror that is down never stops a resume
    from a primary that holds a whole artifact, nor a primary that is down from a mirror that
    does.

    Raises:
        BackendUnavailableError, StorageError: no store could be listed (the primary's error).
    """
    by_name: dict[str, Record] = {}
    pending: list[_newest.Candidate] = []
    alive: list[Committer] = []
    failures: list[CommitStoreError] = []
    for i, store in enumerate(stores):
        try:
            listing = store.backend.walk((META_DIR, RECORDS_DIR))
            records, _bad = scan_records(store.backend, listing)
        except (BackendUnavailableError, StorageError) as exc:
            log.warning("latest: skipping %s, it cannot be listed: %s", store.url, exc)
            failures.append(exc)
            continue
        alive.append(store)
        for rec in records:
            by_name.setdefault(rec.name, rec)
        found = _newest.candidates(store.backend, records, listing, where=i)
        pending.extend(c for c in found if c.origin is not None)
    if not alive and failures:
        raise failures[0]

    sharp = _newest.ambiguous(pending)

    def check_at(store: Committer, name: str) -> tuple[VerifyResult, Record] | None:
        try:
            found = _stored(store, name)
            if found is None:
                return None
            at = _newest.level_for(name, level, sharp)
            return resolve(store.backend, found.record, at, settle=False)
        except IntegrityError:
            return None
        except (BackendUnavailableError, StorageError) as exc:
            log.warning("latest: skipping %s from now on: %s", store.url, exc)
            alive.remove(store)
            return None

    def check(rec: Record, where: Hashable) -> tuple[VerifyResult, Record] | None:
        if isinstance(where, int):  # a pending version seen on that store: checked there
            store = stores[where]
            return check_at(store, rec.name) if store in alive else None
        for store in list(alive):
            got = check_at(store, rec.name)
            if got is None:
                continue
            if got[0].status == "ok":
                return got
            log.warning("latest: skipping %s on %s: %s", rec.name, store.url, got[0].status)
        return None

    cands = [_newest.Candidate(rec, None, None) for rec in by_name.values()] + pending
    for result, version in _newest.walk(cands, check):
        if result.status == "ok":
            return version
    return None


def _stored(store: Committer, name: str) -> StoredRecord | None:
    """The record of ``name`` on ``store``, None if it has none.

    Raises:
        IntegrityError: the record is unreadable (``bad_record``).
    """
    try:
        return read_record(store.backend, validate_name(name))
    except RecordFormatError as exc:
        raise IntegrityError(f"{name}: bad record: {exc}", name=name, status="bad_record") from exc


def _primary_state(primary: Committer, name: str) -> tuple[bytes | None, StoredRecord | None, str]:
    """What the primary holds under ``name``: (record bytes or None, the version it verifies
    as in full, as stored (the record, or a pending version), else None, and why not)."""
    try:
        mine = _stored(primary, name)
    except IntegrityError as exc:
        return b"unreadable", None, str(exc)
    if mine is None:
        return None, None, "missing"
    result, version = resolve(primary.backend, mine.record, "full")
    if result.status != "ok":
        return mine.raw, None, result.status
    return mine.raw, stored_version(primary.backend, mine, version), "ok"


def _refusal(name: str, primary: Committer, mine: Record, theirs: Record, src: str) -> str:
    if mine.created > theirs.created:
        which = "the primary's is newer"
    elif mine.created < theirs.created:
        which = f"the copy on {src} is newer"
    else:
        which = "both were created at the same time"
    return (
        f"{name}: {primary.url} holds a different version that verifies (created "
        f"{mine.created.isoformat()}) than {src} (created {theirs.created.isoformat()}): {which}; "
        "not restored (pass overwrite=True to replace the primary's)"
    )


def restore(
    primary: Committer, sources: Sequence[Committer], name: str, *, overwrite: bool = False
) -> Record:
    """Copy a verified copy of ``name`` from the first of ``sources`` holding a whole one back to
    the primary (the version it verifies as there: a pending version with its pending record),
    only where that loses nothing: the primary's copy is missing, fails its full check, or
    verifies as a version with a byte-identical record. A different primary version that
    verifies is kept (AlreadyExistsError) unless ``overwrite``. The decision is re-checked
    under the primary's publish lock: a version committed meanwhile is never replaced (unless
    ``overwrite``).

    Raises:
        NotFoundError: no source holds a whole copy.
        AlreadyExistsError: the primary holds a different whole version (``overwrite=False``),
            or a new version was committed on the primary while restoring.
    """
    errors = []
    for mirror in sources:
        try:
            found = _stored(mirror, name)
        except IntegrityError as exc:
            errors.append(f"{mirror.url}: {exc}")
            continue
        if found is None:
            continue
        result, version = resolve(mirror.backend, found.record, "full")
        if result.status != "ok":
            errors.append(f"{mirror.url}: {result.status}")
            continue
        theirs = stored_version(mirror.backend, found, version)
        seen, mine, why = _primary_state(primary, name)
        if mine is not None and mine.raw != theirs.raw and not overwrite:
            raise AlreadyExistsError(
                _refusal(name, primary, mine.record, theirs.record, mirror.url), name=name
            )
        if mine is None:
            log.info("restore: %s on %s is %s; copying from %s", name, primary.url, why, mirror.url)

        def unchanged(seen: bytes | None = seen) -> None:
            if overwrite:
                return
            try:
                now = _stored(primary, name)
            except IntegrityError:
                now_raw: bytes | None = b"unreadable"
            else:
                now_raw = None if now is None else now.raw
            if now_raw != seen:
                raise AlreadyExistsError(
                    f"{name}: a new version was committed on {primary.url} while it was being "
                    "restored; kept (pass overwrite=True to replace it)",
                    name=name,
                )

        return copy_with_retries(mirror, primary, name, guard=unchanged)
    raise NotFoundError(
        f"no mirror holds a whole copy of {name}" + (f" ({'; '.join(errors)})" if errors else ""),
        name=name,
    )
