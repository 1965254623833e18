"""Checks of stored bytes against their records, and the scan of a store's records.

Nothing here raises for a bad artifact: every problem becomes a :class:`VerifyResult`.
"""

from __future__ import annotations

import concurrent.futures

from commitstore import _recordcache
from commitstore.backends import Backend, FileInfo
from commitstore.digest import hash_stream
from commitstore.errors import CommitStoreError, InvalidNameError, NotFoundError
from commitstore.layout import (
    META_DIR,
    RECORDS_DIR,
    Parts,
    is_record_leaf,
    is_staging_part,
    name_from_record_parts,
    record_parts,
    validate_name,
)
from commitstore.records import Record, RecordFormatError, VerifyResult, decode_record

LEVELS = ("size", "full")


def check_level(level: str, *, allow_none: bool = False) -> None:
    """Raise ValueError-typed InvalidNameError for an unknown verify level, before any I/O."""
    allowed = (*LEVELS, "none") if allow_none else LEVELS
    if level not in allowed:
        raise InvalidNameError(f"verify level must be one of {allowed}, not {level!r}")


def read_record(backend: Backend, parts: Parts) -> Record | None:
    """The record of ``parts``, None if there is none.

    Raises:
        RecordFormatError: the record exists but is unreadable or does not belong to this name.
    """
    try:
        with backend.open_read(record_parts(parts)) as f:
            data = f.read()
    except NotFoundError:
        return None
    record = decode_record(data)
    if record.name != "/".join(parts):
        raise RecordFormatError(f"record names {record.name!r}, expected {'/'.join(parts)!r}")
    return record


def check(backend: Backend, record: Record, level: str) -> VerifyResult:
    """Compare the stored artifact with ``record`` at ``level`` (``"size"`` or ``"full"``)."""
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
    if info.size != record.size:
        return VerifyResult(
            record.name, "size_mismatch", f"expected {record.size} bytes, found {info.size}"
        )
    if level == "full":
        try:
            with backend.open_read(parts) as f:
                size, digest = hash_stream(f)
        except NotFoundError:
            return VerifyResult(record.name, "missing", "no data under this name")
        if size != record.size:
            return VerifyResult(
                record.name, "size_mismatch", f"expected {record.size} bytes, read {size}"
            )
        if digest != record.digest:
            return VerifyResult(
                record.name, "hash_mismatch", f"expected {record.digest}, found {digest}"
            )
    return VerifyResult(record.name, "ok")


def _check_dir(backend: Backend, parts: Parts, record: Record, level: str) -> VerifyResult:
    if not record.files and not backend.capabilities.empty_folders:
        return VerifyResult(record.name, "ok")  # nothing to check: the storage has no folders
    info = backend.stat(parts)
    if info is None:
        return VerifyResult(record.name, "missing", "no folder under this name")
    if not info.is_dir:
        return VerifyResult(
            record.name, "size_mismatch", "a file stands where a folder was recorded"
        )
    found = {"/".join(rel): fi for rel, fi in backend.walk(parts)}
    for entry in record.files:
        fi = found.pop(entry.path, None)
        if fi is None:
            return VerifyResult(record.name, "missing", f"file {entry.path!r} is missing")
        if fi.size != entry.size:
            return VerifyResult(
                record.name,
                "size_mismatch",
                f"{entry.path}: expected {entry.size} bytes, found {fi.size}",
            )
    if found:
        extra = sorted(found)[0]
        return VerifyResult(
            record.name, "size_mismatch", f"unrecorded file {extra!r} in the folder"
        )
    if level == "full":
        for entry in record.files:
            with backend.open_read((*parts, *entry.path.split("/"))) as f:
                size, digest = hash_stream(f)
            if size != entry.size:
                return VerifyResult(
                    record.name,
                    "size_mismatch",
                    f"{entry.path}: expected {entry.size} bytes, read {size}",
                )
            if digest != entry.digest:
                return VerifyResult(
                    record.name,
                    "hash_mismatch",
                    f"{entry.path}: expected {entry.digest}, found {digest}",
                )
    return VerifyResult(record.name, "ok")


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
        try:
            record = decode_record(fetch(rel, info))
            parts = validate_name(record.name)
            if record_parts(parts) != (META_DIR, RECORDS_DIR, *rel):
                raise RecordFormatError(f"record names {record.name!r} but is stored at {where}")
        except (RecordFormatError, InvalidNameError) as exc:
            return VerifyResult(shown, "bad_record", str(exc))
        except NotFoundError:
            return None
        except CommitStoreError as exc:
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


def sort_key(record: Record) -> tuple[bool, int, float, str]:
    """Oldest to newest: unstepped artifacts (by commit time) before stepped ones (by step)."""
    return (record.step is not None, record.step or 0, record.created.timestamp(), record.name)
