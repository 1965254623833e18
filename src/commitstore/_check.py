"""Checks of stored bytes against their records: the one comparison, the one record reader, the
scan of a store's records, and ``verify`` / ``latest`` over them.

Nothing here raises for a bad artifact: every problem becomes a :class:`VerifyResult` (or, for
reads, a :class:`Mismatch` the caller turns into an IntegrityError).
"""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass
from typing import Literal

from commitstore import _recordcache
from commitstore.backends import Backend, FileInfo
from commitstore.digest import hash_stream
from commitstore.errors import (
    CommitStoreError,
    ConfigurationError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
)
from commitstore.layout import (
    META_DIR,
    RECORDS_DIR,
    Parts,
    intent_parts,
    is_record_leaf,
    is_staging_part,
    name_from_record_parts,
    record_parts,
    validate_name,
)
from commitstore.records import (
    MAX_RECORD_BYTES,
    Record,
    RecordFormatError,
    VerifyReport,
    VerifyResult,
    decode_record,
)

NOT_REGULAR = "not a regular file"
"""The detail of a ``size_mismatch`` for a symlink, FIFO, socket or device at an artifact's name
(or inside a folder artifact), and of a ``bad_record`` for one at a record's path."""

log = logging.getLogger("commitstore")

LEVELS = ("size", "full")


def check_level(level: str, *, allow_none: bool = False) -> None:
    """Raise ConfigurationError for an unknown verify level, before any I/O."""
    allowed = (*LEVELS, "none") if allow_none else LEVELS
    if level not in allowed:
        raise ConfigurationError(f"verify level must be one of {allowed}, not {level!r}")


# -- the one comparison ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Mismatch:
    """How observed bytes differ from what a record says."""

    status: Literal["size_mismatch", "hash_mismatch"]
    expected_size: int
    actual_size: int
    expected_digest: str
    actual_digest: str | None
    """None when only sizes were compared."""

    @property
    def detail(self) -> str:
        """``expected ..., found ...``, as shown in reports and errors."""
        if self.status == "size_mismatch":
            return f"expected {self.expected_size} bytes, found {self.actual_size}"
        return f"expected {self.expected_digest}, found {self.actual_digest}"

    def error(
        self, name: str, where: str = "", cls: type[IntegrityError] = IntegrityError
    ) -> IntegrityError:
        """The IntegrityError (or subclass ``cls``) for artifact ``name``; ``where`` names the
        file inside a folder artifact."""
        return cls(
            f"{name}{'/' + where if where else ''}: {self.detail}",
            name=name,
            status=self.status,
            expected_size=self.expected_size,
            actual_size=self.actual_size,
            expected_digest=self.expected_digest,
            actual_digest=self.actual_digest,
        )


def compare(
    size: int, digest: str, *, found_size: int, found_digest: str | None, level: str
) -> Mismatch | None:
    """Compare what was observed with what was recorded (``size``, ``digest``) at ``level``:
    ``"none"`` accepts anything, ``"size"`` compares sizes, ``"full"`` sizes then digests.
    A digest is compared only when one was observed."""
    if level == "none":
        return None
    if found_size != size:
        return Mismatch("size_mismatch", size, found_size, digest, found_digest)
    if level == "full" and found_digest is not None and found_digest != digest:
        return Mismatch("hash_mismatch", size, found_size, digest, found_digest)
    return None


# -- the one record reader -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record as stored: its exact bytes (copied byte for byte to mirrors) and their decoding."""

    raw: bytes
    record: Record


def read_record(backend: Backend, parts: Parts) -> StoredRecord | None:
    """The record of artifact ``parts``, None if there is none.

    Raises:
        RecordFormatError: the record exists but is unreadable (not a regular file, too large,
            not valid by the schema) or names another artifact.
    """
    try:
        raw = backend.read_small(record_parts(parts))
    except NotFoundError:
        return None
    except (IntegrityError, InvalidNameError) as exc:  # a symlink, FIFO... where a record goes
        raise RecordFormatError(f"{NOT_REGULAR}: {exc}") from exc
    record = decode_record(raw)
    if record.name != "/".join(parts):
        raise RecordFormatError(f"record names {record.name!r}, expected {'/'.join(parts)!r}")
    return StoredRecord(raw, record)


def read_intent(backend: Backend, parts: Parts) -> StoredRecord | None:
    """The pending record a commit of ``parts`` left (written before its data was published,
    removed after its record was), None if there is none or it is unreadable: a pending record
    only ever adds a candidate version, so a damaged one is as good as none."""
    try:
        raw = backend.read_small(intent_parts(parts))
        record = decode_record(raw)
    except (NotFoundError, RecordFormatError):
        return None
    except CommitStoreError:
        return None
    if record.name != "/".join(parts):
        return None
    return StoredRecord(raw, record)


def pending_version(backend: Backend, record: Record) -> Record | None:
    """The version a commit in flight (or interrupted after its data step) is publishing over
    ``record``: its pending record, when there is one that differs from ``record``."""
    found = read_intent(backend, tuple(record.name.split("/")))
    if found is None or found.record == record:
        return None
    return found.record


def record_of(backend: Backend, url: str, name: str) -> StoredRecord:
    """The committed record of ``name``, for callers that need one.

    Raises:
        NotFoundError: no record. IntegrityError: the record is unreadable (``bad_record``).
    """
    parts = validate_name(name)
    try:
        found = read_record(backend, parts)
    except RecordFormatError as exc:
        raise IntegrityError(f"{name}: bad record: {exc}", name=name, status="bad_record") from exc
    if found is None:
        raise NotFoundError(f"{name} is not committed in {url}", name=name)
    return found


# -- checks of one artifact ------------------------------------------------------------------
def check(backend: Backend, record: Record, level: str) -> VerifyResult:
    """Compare the stored artifact with ``record`` at ``level`` (``"size"`` or ``"full"``).

    When it does not match, a pending record of the same name (a commit whose data was
    published but whose record was not, see ``_commit``) is tried too: the name then verifies
    as that new version (the detail says so). Never both a mismatch and a match: old or new.
    """
    return resolve(backend, record, level)[0]


def resolve(backend: Backend, record: Record, level: str) -> tuple[VerifyResult, Record]:
    """:func:`check`, plus the version that passed it: ``record``, or the pending version."""
    result = check_exact(backend, record, level)
    if result.status == "ok":
        return result, record
    pending = pending_version(backend, record)
    if pending is not None and check_exact(backend, pending, level).status == "ok":
        note = "the new version of a commit whose record is pending"
        return VerifyResult(record.name, "ok", note), pending
    return result, record


def check_exact(backend: Backend, record: Record, level: str) -> VerifyResult:
    """:func:`check` against ``record`` alone (no pending version considered)."""
    parts = tuple(record.name.split("/"))
    if record.kind == "dir":
        return _check_dir(backend, parts, record, level)
    info = backend.stat(parts)
    if info is None:
        return VerifyResult(record.name, "missing", "no data under this name")
    if info.is_dir:
        return VerifyResult(
            record.name, "size_mismatch", "a folder stands where a file was recorded"
        )
    if not info.regular:
        return VerifyResult(record.name, "size_mismatch", NOT_REGULAR)
    problem = _compare_file(backend, parts, (record.size, record.digest), info, level)
    if problem == MISSING:
        return VerifyResult(record.name, "missing", "no data under this name")
    if problem == NOT_A_FILE:
        return VerifyResult(record.name, "size_mismatch", NOT_REGULAR)
    if isinstance(problem, Mismatch):
        return VerifyResult(record.name, problem.status, problem.detail)
    return VerifyResult(record.name, "ok")


MISSING, NOT_A_FILE = "missing", "not a file"
"""What :func:`_compare_file` returns when the bytes could not be read: gone since the listing,
or replaced by a symlink or special file since then."""


def _compare_file(
    backend: Backend, parts: Parts, expected: tuple[int, str], info: FileInfo, level: str
) -> Mismatch | str | None:
    """Sizes from ``info`` first; at ``"full"`` the bytes are read and hashed. A str: MISSING
    or NOT_A_FILE."""
    size, digest = expected
    problem = compare(size, digest, found_size=info.size, found_digest=None, level=level)
    if problem is not None or level != "full":
        return problem
    try:
        with backend.open_read(parts) as f:
            found_size, found_digest = hash_stream(f)
    except NotFoundError:
        return MISSING
    except (IntegrityError, InvalidNameError):  # replaced by a symlink or FIFO since the stat
        return NOT_A_FILE
    return compare(size, digest, found_size=found_size, found_digest=found_digest, level=level)


def _check_dir(backend: Backend, parts: Parts, record: Record, level: str) -> VerifyResult:
    if not record.files and not backend.capabilities.empty_folders:
        return VerifyResult(record.name, "ok")  # nothing to check: the storage has no folders
    info = backend.stat(parts)
    if info is None:
        return VerifyResult(record.name, "missing", "no folder under this name")
    if not info.is_dir:
        return VerifyResult(
            record.name,
            "size_mismatch",
            NOT_REGULAR if not info.regular else "a file stands where a folder was recorded",
        )
    found = {"/".join(rel): fi for rel, fi in backend.walk(parts)}
    odd = sorted(path for path, fi in found.items() if not fi.regular)
    if odd:
        return VerifyResult(record.name, "size_mismatch", f"{odd[0]}: {NOT_REGULAR}")
    infos = {}
    for entry in record.files:
        fi = found.pop(entry.path, None)
        if fi is None:
            return VerifyResult(record.name, "missing", f"file {entry.path!r} is missing")
        infos[entry.path] = fi
    if found:
        extra = sorted(found)[0]
        return VerifyResult(
            record.name, "size_mismatch", f"unrecorded file {extra!r} in the folder"
        )
    for current in ("size", level) if level == "full" else ("size",):
        for entry in record.files:
            fparts = (*parts, *entry.path.split("/"))
            problem = _compare_file(
                backend, fparts, (entry.size, entry.digest), infos[entry.path], current
            )
            if problem == MISSING:
                return VerifyResult(record.name, "missing", f"file {entry.path!r} is missing")
            if problem == NOT_A_FILE:
                return VerifyResult(record.name, "size_mismatch", f"{entry.path}: {NOT_REGULAR}")
            if isinstance(problem, Mismatch):
                return VerifyResult(record.name, problem.status, f"{entry.path}: {problem.detail}")
    return VerifyResult(record.name, "ok")


# -- whole-store answers ---------------------------------------------------------------------
def list_records(backend: Backend) -> list[Record]:
    """Committed artifacts (valid records only), oldest to newest."""
    records, _bad = scan_records(backend)
    return sorted(records, key=sort_key)


def verify(backend: Backend, name: str | None, level: str) -> VerifyReport:
    """Check one artifact or every artifact (plus ``no_record`` for unrecorded data)."""
    if name is not None:
        parts = validate_name(name)
        try:
            found = read_record(backend, parts)
        except RecordFormatError as exc:
            return VerifyReport((VerifyResult(name, "bad_record", str(exc)),))
        if found is None:
            if backend.stat(parts) is not None:
                return VerifyReport((VerifyResult(name, "no_record", _unrecorded(backend, name)),))
            return VerifyReport((VerifyResult(name, "missing", "nothing under this name"),))
        return VerifyReport((check(backend, found.record, level),))
    records, bad = scan_records(backend)
    results = [check(backend, r, level) for r in records] + bad
    results += [
        VerifyResult(n, "no_record", _unrecorded(backend, n))
        for n in unrecorded(backend, records, bad)
    ]
    return VerifyReport(tuple(sorted(results, key=lambda r: r.name)))


def _unrecorded(backend: Backend, name: str) -> str:
    try:
        pending = read_intent(backend, validate_name(name))
    except InvalidNameError:
        pending = None
    if pending is None:
        return "data without a record"
    return "data without a record; a commit of it stopped after its data step (gc completes it)"


def latest(backend: Backend, level: str) -> Record | None:
    """The newest artifact that passes :func:`check` at ``level``; skipped ones are logged."""
    records, bad = scan_records(backend)
    for b in bad:
        log.warning("latest: skipping %s: bad_record (%s)", b.name, b.detail)
    for rec in sorted(records, key=sort_key, reverse=True):
        result, version = resolve(backend, rec, level)
        if result.status == "ok":
            return version
        log.warning("latest: skipping %s: %s (%s)", rec.name, result.status, result.detail)
    return None


def sort_key(record: Record) -> tuple[bool, int, float, str]:
    """Oldest to newest: unstepped artifacts (by commit time) before stepped ones (by step)."""
    return (record.step is not None, record.step or 0, record.created.timestamp(), record.name)


def scan_records(
    backend: Backend, listing: list[tuple[Parts, FileInfo]] | None = None
) -> tuple[list[Record], list[VerifyResult]]:
    """Every valid record in the store, and a ``bad_record`` result for every unreadable one.

    One listing of the records folder; on storage whose listing carries version tags, records whose
    tag matches the record cache (``_recordcache``) are not fetched again. A record deleted between
    the listing and its read (a concurrent prune) is left out, not reported as bad. ``listing``:
    a fresh walk of the records folder the caller already made (relative to that folder).
    """
    if listing is None:
        listing = backend.walk((META_DIR, RECORDS_DIR))
    leaves = [
        (rel, info)
        for rel, info in listing
        if not is_staging_part(rel[-1]) and is_record_leaf(rel[-1])
    ]
    tagged = bool(leaves) and all(info.tag for _rel, info in leaves)
    cached = _recordcache.load(backend) if tagged else {}
    fresh: _recordcache.Entries = {}

    def fetch(rel: Parts, info: FileInfo) -> bytes:
        key = "/".join(rel)
        hit = cached.get(key)
        if hit is not None and hit[0] == _recordcache.norm(info.tag):
            return hit[1]
        raw, got = backend.read_small_tagged((META_DIR, RECORDS_DIR, *rel))
        tag = _recordcache.norm(got)
        if tagged and tag and _recordcache.cacheable(raw):
            fresh[key] = (tag, raw)
        return raw

    def load(leaf: tuple[Parts, FileInfo]) -> Record | VerifyResult | None:
        rel, info = leaf
        where = "/".join((META_DIR, RECORDS_DIR, *rel))
        shown = name_from_record_parts(rel) or where
        if not info.regular:
            return VerifyResult(shown, "bad_record", f"{where}: {NOT_REGULAR}")
        if info.size > MAX_RECORD_BYTES:
            return VerifyResult(
                shown, "bad_record", f"{where} is {info.size} bytes, more than {MAX_RECORD_BYTES}"
            )
        try:
            record = decode_record(fetch(rel, info))
            parts = validate_name(record.name)
            if record_parts(parts) != (META_DIR, RECORDS_DIR, *rel):
                raise RecordFormatError(f"record names {record.name!r} but is stored at {where}")
        except (RecordFormatError, InvalidNameError) as exc:
            return VerifyResult(shown, "bad_record", str(exc))
        except NotFoundError:
            return None
        except IntegrityError as exc:  # replaced by a symlink or FIFO since the listing
            return VerifyResult(shown, "bad_record", f"{NOT_REGULAR}: {exc}")
        except (CommitStoreError, OSError) as exc:
            return VerifyResult(shown, "bad_record", f"unreadable: {exc}")
        return record

    if backend.read_concurrency > 1 and len(leaves) > 1:
        with concurrent.futures.ThreadPoolExecutor(backend.read_concurrency) as pool:
            loaded = list(pool.map(load, leaves))
    else:
        loaded = [load(leaf) for leaf in leaves]
    if tagged:
        _refresh_cache(backend, leaves, cached, fresh)
    good = [r for r in loaded if isinstance(r, Record)]
    bad = [r for r in loaded if isinstance(r, VerifyResult)]
    return good, bad


def _refresh_cache(
    backend: Backend,
    leaves: list[tuple[Parts, FileInfo]],
    cached: _recordcache.Entries,
    fresh: _recordcache.Entries,
) -> None:
    """Rewrite the record cache when enough of it was missing or stale."""
    entries: _recordcache.Entries = {}
    for rel, info in leaves:
        key = "/".join(rel)
        hit = cached.get(key)
        if hit is not None and hit[0] == _recordcache.norm(info.tag):
            entries[key] = hit
        elif key in fresh:
            entries[key] = fresh[key]
    dropped = len(cached) - (len(entries) - len(fresh))
    if len(fresh) + max(dropped, 0) >= _recordcache.REWRITE_AFTER:
        _recordcache.save(backend, entries)


def unrecorded(backend: Backend, records: list[Record], bad: list[VerifyResult]) -> list[str]:
    """Data files under the root that no record (good or bad) covers; staging is skipped."""
    files = {r.name for r in records if r.kind == "file"}
    dirs = {r.name for r in records if r.kind == "dir"}
    claimed = {b.name for b in bad}
    out = []
    for rel, _info in backend.walk(()):
        if rel[0] == META_DIR or any(is_staging_part(p) for p in rel):
            continue
        name = "/".join(rel)
        if name in files or name in claimed:
            continue
        if any(
            "/".join(rel[:i]) in dirs or "/".join(rel[:i]) in claimed for i in range(1, len(rel))
        ):
            continue
        out.append(name)
    return sorted(out)
