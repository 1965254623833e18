"""Reading a store's records: the one record reader (and a name's pending record), and the scan
of every record with its cache. Nothing here raises for a bad record: a scan reports it as
``bad_record``; a single read raises RecordFormatError for the caller to report.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Collection
from dataclasses import dataclass
from typing import TypeGuard

from commitstore import _recordcache
from commitstore._order import arrange_records
from commitstore.backends import Backend, FileInfo
from commitstore.errors import CommitStoreError, IntegrityError, InvalidNameError, NotFoundError
from commitstore.layout import (
    META_DIR,
    RECORDS_DIR,
    RESERVED_PREFIX,
    Parts,
    aside_parts,
    intent_parts,
    is_aside_part,
    is_record_leaf,
    is_staging_part,
    name_from_record_parts,
    record_parts,
    unaside_part,
)
from commitstore.records import (
    MAX_RECORD_BYTES,
    Record,
    RecordFormatError,
    VerifyResult,
    decode_record,
)

NOT_REGULAR = "not a regular file"
"""The detail of a ``size_mismatch`` for a symlink, FIFO, socket or device at an artifact's name
(or inside a folder artifact), and of a ``bad_record`` for one at a record's path."""


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
        raw = _read_record_bytes(backend, record_parts(parts))
    except NotFoundError:
        return None
    except (IntegrityError, InvalidNameError) as exc:  # a symlink, FIFO... where a record goes
        raise RecordFormatError(f"{NOT_REGULAR}: {exc}") from exc
    record = decode_record(raw)
    if record.name != "/".join(parts):
        raise RecordFormatError(f"record names {record.name!r}, expected {'/'.join(parts)!r}")
    return StoredRecord(raw, record)


def _read_record_bytes(backend: Backend, where: Parts) -> bytes:
    """The record stored at ``where``; when it is missing, the old record a stopped move-aside
    replace of it left under its aside name (``backends/rename/aside.py``: a record replace on
    storage without a one-step replace), which gc or the next commit moves back."""
    try:
        return backend.read_small(where)
    except NotFoundError:
        if not backend.capabilities.staging_names:
            raise
        return backend.read_small(aside_parts(where))


def _logical(rel: Parts) -> Parts:
    """The record path an entry of the records folder stands for: itself, or the record whose
    aside entry it is."""
    last = unaside_part(rel[-1])
    return rel if last is None else (*rel[:-1], last)


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


def list_records(backend: Backend) -> list[Record]:
    """Committed artifacts (valid records only), oldest to newest (``_order.arrange``)."""
    records, _bad = scan_records(backend)
    return arrange_records(records)


def scan_records(
    backend: Backend, listing: list[tuple[Parts, FileInfo]] | None = None
) -> tuple[list[Record], list[VerifyResult]]:
    """Every valid record in the store, and a ``bad_record`` result for every unreadable one
    (:func:`scan_entries`, without the listing's entries)."""
    found, bad = scan_entries(backend, listing)
    return [entry.record for entry in found], bad


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """A valid record found by a scan, with the listing's entry of its record file."""

    record: Record
    info: FileInfo | None
    """The listed record file; None when the record was read from its aside entry (a stopped
    replace: the record itself is missing, so its age is unknown)."""


def scan_entries(
    backend: Backend, listing: list[tuple[Parts, FileInfo]] | None = None
) -> tuple[list[ScannedRecord], list[VerifyResult]]:
    """Every valid record in the store with its listed entry, and a ``bad_record`` result for
    every unreadable one.

    One listing of the records folder, and the records read through one ``Backend.small_reads``
    (locally: one descriptor of the records folder for the whole scan, one open per record); on
    storage whose listing carries version tags, records whose tag matches the record cache
    (``_recordcache``) are not fetched again. A record deleted between the listing and its read
    (a concurrent prune) is left out, not reported as bad. ``listing``: a fresh walk of the
    records folder the caller already made (relative to that folder).
    """
    if listing is None:
        listing = backend.walk((META_DIR, RECORDS_DIR))
    blocked = _blocked_folders(backend, listing)
    present = {rel for rel, _info in listing}
    leaves = [
        (rel, info)
        for rel, info in listing
        if is_record_leaf((logical := _logical(rel))[-1])
        and not is_staging_part(rel[-1])
        and (logical is rel or logical not in present)  # an aside of a missing one
    ]
    tagged = bool(leaves) and all(info.tag for _rel, info in leaves)
    caching = tagged and len(leaves) > _recordcache.DIRECT_MAX
    cached = (
        _recordcache.load(backend, {_recordcache.shard_of("/".join(rel)) for rel, _i in leaves})
        if caching
        else {}
    )
    fresh: _recordcache.Entries = {}
    vouched: dict[str, bytes] = {}  # record key -> its bytes, where the cache vouches for it
    for rel, info in leaves if cached else ():
        key = "/".join(rel)
        entry = cached.get(key)
        if _vouched(entry, _recordcache.norm(info.tag), info):
            vouched[key] = entry[1]

    def fetch(rel: Parts, info: FileInfo) -> bytes:
        key = "/".join(rel)
        if key in vouched:
            return vouched[key]
        if not caching:
            return read(rel)[0]
        listed = _recordcache.norm(info.tag)
        raw, got = read(rel)
        # only the version the listing shows is cached (a record replaced since, or a service
        # whose GET tags differ from its listing's, would miss again at every scan)
        if caching and listed and _recordcache.norm(got) == listed and _recordcache.cacheable(raw):
            fresh[key] = (listed, raw)
        return raw

    def load(leaf: tuple[Parts, FileInfo]) -> ScannedRecord | VerifyResult | None:
        rel, info = leaf
        if not info.regular:
            return _bad(rel, f"{_where(rel)}: {NOT_REGULAR}")
        if info.size > MAX_RECORD_BYTES:
            return _bad(rel, f"{_where(rel)} is {info.size} bytes, more than {MAX_RECORD_BYTES}")
        try:
            record = decode_record(fetch(rel, info))
            logical = _logical(rel)
            # a valid name (decode_record checked it)
            if record_parts(tuple(record.name.split("/"))) != (META_DIR, RECORDS_DIR, *logical):
                raise RecordFormatError(
                    f"record names {record.name!r} but is stored at {_where(rel)}"
                )
        except (RecordFormatError, InvalidNameError) as exc:
            return _bad(rel, str(exc))
        except NotFoundError:
            return None
        except IntegrityError as exc:  # replaced by a symlink or FIFO since the listing
            return _bad(rel, f"{NOT_REGULAR}: {exc}")
        except (CommitStoreError, OSError) as exc:
            return _bad(rel, f"unreadable: {exc}")
        return ScannedRecord(record, info if logical is rel else None)

    # Records the cache vouches for cost no request: decoded here, in the listing's order; only
    # the others go to the readers (a thread per record would cost more than the decoding).
    hits = ["/".join(rel) in vouched for rel, _info in leaves]
    with backend.small_reads((META_DIR, RECORDS_DIR), max_bytes=MAX_RECORD_BYTES) as read:
        loaded = [load(leaf) if h else None for leaf, h in zip(leaves, hits, strict=True)]
        misses = [i for i, h in enumerate(hits) if not h]
        if backend.capabilities.read_concurrency > 1 and len(misses) > 1:
            with concurrent.futures.ThreadPoolExecutor(
                backend.capabilities.read_concurrency
            ) as pool:
                for i, got in zip(misses, pool.map(load, [leaves[i] for i in misses]), strict=True):
                    loaded[i] = got
        else:
            for i in misses:
                loaded[i] = load(leaves[i])
    # the cache needs rewriting only where records were fetched, or where at least REWRITE_DROPS
    # entries are gone (fewer than that unused in all: no shard can have lost that many)
    if caching and (fresh or len(cached) - len(vouched) >= _recordcache.REWRITE_DROPS):
        _refresh_cache(backend, leaves, cached, vouched, fresh)
    good = [r for r in loaded if type(r) is ScannedRecord]
    bad = [r for r in loaded if isinstance(r, VerifyResult)] + blocked
    return good, bad


NOT_A_FOLDER = "not a folder (a symlink, file or special file); no record below it can be read"
"""The detail of a ``bad_record`` for an entry of the records tree where only a folder can
stand: the records folder itself, ``.commitstore/``, or a folder of records."""


def _blocked_folders(backend: Backend, listing: list[tuple[Parts, FileInfo]]) -> list[VerifyResult]:
    """A ``bad_record`` result for every place of the records tree where a folder goes but
    something else stands, hiding the records below it (each read of one raises
    ``bad_record``): an entry of the listing that is not a regular file and whose name is not
    one of the store's own (every other name there is a folder of records), and, when the
    listing is empty on storage with real folders, the records folder or ``.commitstore/``
    itself (one ``stat`` each: an empty store pays them, a store with records never does)."""
    out = [
        VerifyResult(_where(rel), "bad_record", f"{_where(rel)}: {NOT_A_FOLDER}")
        for rel, info in listing
        if not info.regular and not rel[-1].startswith(RESERVED_PREFIX)
    ]
    if listing or not backend.capabilities.empty_folders:
        return out
    for where in ((META_DIR, RECORDS_DIR), (META_DIR,)):
        info = backend.stat(where)
        if info is not None:
            if not info.is_dir:
                path = "/".join(where)
                out.append(VerifyResult(path, "bad_record", f"{path}: {NOT_A_FOLDER}"))
            break
    return out


def folder_records(backend: Backend) -> list[VerifyResult]:
    """A ``bad_record`` result for every folder standing at a record's path (another tool's,
    or a damaged disk's): a record is a regular file, and a scan of the records folder lists
    files only, so without this the name would read as "no record". One walk of the records
    folder's subfolders (none on storage without real folders)."""
    return [
        _bad(rel, f"{_where(rel)}: {NOT_REGULAR} (a folder)")
        for rel in backend.walk_folders((META_DIR, RECORDS_DIR))
        if is_record_leaf(_logical(rel)[-1]) and not is_staging_part(rel[-1])
    ]


def _vouched(
    hit: tuple[str, bytes] | None, listed: str | None, info: FileInfo
) -> TypeGuard[tuple[str, bytes]]:
    """A cache entry stands for the listed record object: same tag and same length (an entry
    edited by hand under the right tag, but to other bytes of another length, is fetched)."""
    return hit is not None and hit[0] == listed and len(hit[1]) == info.size


def _where(rel: Parts) -> str:
    return "/".join((META_DIR, RECORDS_DIR, *rel))


def _bad(rel: Parts, detail: str) -> VerifyResult:
    """The ``bad_record`` result of the records-folder entry ``rel``: under the artifact's name
    where the entry spells it out, else under the entry's path."""
    return VerifyResult(name_from_record_parts(_logical(rel)) or _where(rel), "bad_record", detail)


def _refresh_cache(
    backend: Backend,
    leaves: list[tuple[Parts, FileInfo]],
    cached: _recordcache.Entries,
    vouched: Collection[str],
    fresh: _recordcache.Entries,
) -> None:
    """Rewrite each shard that had to be fetched from, or that lost at least
    ``REWRITE_DROPS`` entries (records pruned since), with the entries the listing confirms."""
    shard_of = _recordcache.shard_of
    kept: dict[int, _recordcache.Entries] = {}
    fetched: set[int] = set()
    for rel, _info in leaves:
        key = "/".join(rel)
        shard = shard_of(key)
        if key in vouched:
            kept.setdefault(shard, {})[key] = cached[key]
        elif key in fresh:
            kept.setdefault(shard, {})[key] = fresh[key]
            fetched.add(shard)
    had: dict[int, int] = {}
    for key in cached:
        had[shard_of(key)] = had.get(shard_of(key), 0) + 1
    for shard in sorted(set(kept) | set(had)):
        entries = kept.get(shard, {})
        dropped = had.get(shard, 0) - sum(1 for k in entries if k in cached)
        if shard in fetched or dropped >= _recordcache.REWRITE_DROPS:
            _recordcache.save(backend, shard, entries)


def unrecorded(backend: Backend, records: list[Record], bad: list[VerifyResult]) -> list[str]:
    """Data files under the root that no record (good or bad) covers; staging is skipped."""
    files = {r.name for r in records if r.kind == "file"}
    dirs = {r.name for r in records if r.kind == "dir"}
    claimed = {b.name for b in bad}
    out = []
    for rel, _info in backend.walk(()):
        if rel[0] == META_DIR or any(is_staging_part(p) or is_aside_part(p) for p in rel):
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
