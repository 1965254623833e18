"""Garbage collection of what dead writers left: staging files and folders, unfinished uploads."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from commitstore import _stagedcopies
from commitstore._scan import StoredRecord, read_record, scan_records
from commitstore._slotorder import staged_order
from commitstore._small import put_small
from commitstore._verify import check_exact
from commitstore.backends import Backend, PendingUpload, PutMode
from commitstore.errors import (
    BackendUnavailableError,
    InvalidNameError,
    NotFoundError,
    StorageError,
)
from commitstore.layout import (
    FOLDERS_DIR,
    META_DIR,
    PENDING_DIR,
    RECORD_SUFFIX,
    RECORDS_DIR,
    Parts,
    intent_parts,
    is_aside_part,
    is_intent_leaf,
    is_slot_leaf,
    is_staging_part,
    record_parts,
    slot_dir_parts,
    validate_name,
)
from commitstore.maintenance import _asides, _owned, _resumestate
from commitstore.records import Record, RecordFormatError, decode_record


@dataclass(frozen=True, slots=True)
class GcItem:
    """One leftover of an interrupted write."""

    path: str
    """Relative to the store root (for uploads: the object key the upload would have created)."""
    kind: str
    """``"staging"`` (a staging file or folder), ``"upload"`` (an unfinished multipart upload) or
    ``"pending"`` (the pending record of an interrupted commit: made the record if the data is
    the new version, dropped if it is the old one) or ``"folder"`` (object stores: the files of
    a multi-writer folder commit that never got its record, with its marker), ``"aside"`` (the
    old version a stopped move-aside replace left beside the name, removed once the name
    verifies), ``"restored"`` (such an old version moved back under the missing name) or
    ``"resume"`` (object stores: the state of an unfinished upload a later attempt could have
    resumed, ``.commitstore/resume/``; its upload is aborted as an ``"upload"``)."""
    age: float | None
    """Seconds since it was last modified (started, for uploads); None when unknown."""
    reason: str = ""
    """Why it was kept (``"younger than min_age"``, ``"unknown mtime"``; local staging entries:
    ``"held by a live writer"``, or ``"a writer is creating an entry in this folder"`` while a
    writer is between an entry's create and its lock there, when no entry of the folder is
    taken), or empty if removed."""


@dataclass(frozen=True, slots=True)
class GcReport:
    """What :meth:`CommitStore.gc` removed (or, in a dry run, would remove) and what it kept."""

    removed: tuple[GcItem, ...]
    kept: tuple[GcItem, ...]
    dry_run: bool


def _committed_folders(backend: Backend) -> set[Parts]:
    """Names of committed folder artifacts, and of every artifact whose record is unreadable (it
    may be one): nothing inside them is ever a gc candidate, whatever its name."""
    records, bad = scan_records(backend)
    out = {tuple(r.name.split("/")) for r in records if r.kind == "dir"}
    out.update(tuple(b.name.split("/")) for b in bad)
    return out


def _root_of(rel: Parts, committed: set[Parts]) -> Parts | None:
    """The staging or aside entry ``rel`` belongs to: its first part with a staging or aside
    name, unless a path before it is a committed folder artifact (then its contents, and never
    a candidate)."""
    for i, part in enumerate(rel):
        if rel[:i] in committed:
            return None
        if is_staging_part(part) or is_aside_part(part):
            return rel[: i + 1]
    return None


def store_level_roots(backend: Backend) -> tuple[set[Parts], set[Parts]]:
    """Each staging file or folder (empty ones included) and each aside entry of a stopped
    replace (``backends/rename/aside.py``) at the store's level: never anything inside a
    committed folder artifact, even when named like them (frameworks write
    ``.commitstore.tmp.cache`` files of their own). One walk of the store."""
    if not backend.capabilities.staging_names:
        return set(), set()
    committed = _committed_folders(backend)
    paths = [rel for rel, _info in backend.walk(())] + backend.walk_folders(())
    roots = {root for rel in paths if (root := _root_of(rel, committed)) is not None}
    asides = {r for r in roots if is_aside_part(r[-1])}
    return roots - asides, asides


def staging_roots(backend: Backend) -> set[Parts]:
    """The staging entries of :func:`store_level_roots`."""
    return store_level_roots(backend)[0]


def collect(backend: Backend, *, min_age: float, dry_run: bool) -> GcReport:
    """Remove staging leftovers and unfinished uploads (with the state a later attempt would
    have resumed them from) older than ``min_age`` seconds.

    Aside entries of stopped replaces are settled first (``_asides``: moved back under a
    missing name whatever their age; removed only once the name verifies; never deleted while
    the name is missing or does not verify).

    Guarantees: only entries whose own name has the reserved staging prefix, outside every
    committed folder artifact (checked against the records), and only uploads under this store's
    root, are candidates; committed artifacts and records can never match. A staging file is
    aged by its mtime; a staging folder by the newest mtime and ctime of itself and of
    everything in it (an empty one by its own), less the store's ``mtime_resolution`` (whole
    seconds on S3, Azure, SFTP, WebDAV: a time truncated to the second never makes an entry
    look older than it is). Anything younger than ``min_age`` (a live writer may own it) or
    of unknown age is kept.
    """
    now = time.time()
    removed: list[GcItem] = []
    kept: list[GcItem] = []
    lag = backend.capabilities.mtime_resolution  # a truncated time makes an entry look older

    def judge(path: str, kind: str, mtime: float | None) -> bool:
        age = None if mtime is None else max(0.0, now - mtime - lag)
        if age is None:
            kept.append(GcItem(path, kind, None, "unknown mtime"))
            return False
        if age < min_age:
            kept.append(GcItem(path, kind, age, "younger than min_age"))
            return False
        removed.append(GcItem(path, kind, age))
        return True

    roots, asides = store_level_roots(backend)
    for aside in sorted(asides):  # first: a pending record is settled against the name
        settled = _asides.settle(backend, aside, min_age=min_age, now=now, dry_run=dry_run)
        if settled is not None:
            gone, kind, age, why = settled
            (removed if gone else kept).append(GcItem("/".join(aside), kind, age, why))
    for root in sorted(roots):
        _staging_entry(backend, root, judge, kept, dry_run=dry_run)
    uploads: list[PendingUpload] = backend.pending_uploads()
    live: set[str] = set()
    for up in uploads:
        if not judge(up.key, "upload", up.started):
            live.add(up.upload_id)
        elif not dry_run:
            with contextlib.suppress(NotFoundError):  # completed (or aborted) since listed
                backend.abort_upload(up)
    for parts, mtime in backend.orphan_markers(uploads):  # their uploads ended: never aged
        if judge("/".join(parts), "upload marker", mtime) and not dry_run:
            backend.remove(parts)
    for path, why in _resumestate.collect(backend, judge, live, dry_run=dry_run):
        kept.append(GcItem(path, "resume", None, why))
    committed = _owned.Committed.scan(backend)
    _folder_writes(backend, judge, committed, dry_run=dry_run)
    for rel, info in backend.walk((META_DIR, RECORDS_DIR)):
        if not is_intent_leaf(rel[-1]):
            continue
        path = "/".join((META_DIR, RECORDS_DIR, *rel))
        if judge(path, "pending", info.mtime):
            outcome = _settle(backend, (META_DIR, RECORDS_DIR, *rel), committed, dry_run=dry_run)
            if outcome is not None:  # neither version stands: kept for a person to look at
                done = removed.pop()
                kept.append(GcItem(done.path, done.kind, done.age, outcome))
    _writer_slots(backend, judge, committed, removed, kept, dry_run=dry_run)
    for root, mtime in _stagedcopies.leftovers(backend):  # staged folder copies now settled
        if judge("/".join(root), "staging", mtime) and not dry_run:
            backend.remove(root)
    return GcReport(tuple(removed), tuple(kept), dry_run)


def _staging_entry(
    backend: Backend,
    root: Parts,
    judge: Callable[[str, str, float | None], bool],
    kept: list[GcItem],
    *,
    dry_run: bool,
) -> None:
    """Judge and remove one staging entry, inside ``backend.claimed``: a live writer's
    (locked) is kept whatever its age, and none can lock it while gc removes it (a writer that
    made it but had not locked it yet makes another). One gone meanwhile (published or removed
    by its writer; the old version a replace exchanged out, removed by that replace) is skipped.
    """
    try:
        with backend.claimed(root) as why_kept:
            if why_kept is not None:  # a live writer's, whatever its age (or one is near)
                kept.append(GcItem("/".join(root), "staging", None, why_kept))
                return
            info = backend.stat(root)
            if info is None:
                return  # published or removed by its writer meanwhile
            # A staging file is written only by commitstore's sinks: every write moves its
            # mtime. A staging folder is filled by the caller, whose copies may keep old mtimes
            # (copytree): its own times and those of everything in it count, ctime included.
            mtime = backend.last_change(root) if info.is_dir else info.mtime
            if judge("/".join(root), "staging", mtime) and not dry_run:
                backend.remove(root)
    except NotFoundError:
        if backend.stat(root) is not None:
            raise
        # gone (in part) while gc looked at it: its writer published or removed it; skipped


def _writer_slots(
    backend: Backend,
    judge: Callable[[str, str, float | None], bool],
    committed: _owned.Committed,
    removed: list[GcItem],
    kept: list[GcItem],
    *,
    dry_run: bool,
) -> None:
    """The writers' pending records (object stores, ``_slots``), by name: a name is settled
    only when every one of its slots is older than min_age (each slot's age is its writer's
    last heartbeat, so a live writer's never is); then as :func:`_resolve`."""
    if not backend.capabilities.writer_slots:
        return
    groups: dict[Parts, list[tuple[Parts, float | None]]] = {}
    for rel, info in backend.walk((META_DIR, PENDING_DIR)):
        if len(rel) < 2 or not is_slot_leaf(rel[-1]) or not is_intent_leaf(rel[-2]):
            continue
        folder = (META_DIR, PENDING_DIR, *rel[:-1])
        groups.setdefault(folder, []).append(((*folder, rel[-1]), info.mtime))
    for folder, slots in sorted(groups.items()):
        times = [t for _s, t in slots]
        newest = None if any(t is None for t in times) else max(t for t in times if t is not None)
        if not judge("/".join(folder), "pending", newest):
            continue
        outcome = _settle_slots(backend, folder, [s for s, _t in slots], committed, dry_run=dry_run)
        if outcome is not None:  # neither version stands: kept for a person to look at
            done = removed.pop()
            kept.append(GcItem(done.path, done.kind, done.age, outcome))


def _folder_writes(
    backend: Backend,
    judge: Callable[[str, str, float | None], bool],
    committed: _owned.Committed,
    *,
    dry_run: bool,
) -> None:
    """Markers of multi-writer folder commits (``_folderwrite``, object stores), grouped by write:
    the coordinator's ``<id>.json`` and each writer's ``<id>/<writer>.json``, which lists the
    files that writer uploaded. A write whose markers and listed files are all older than
    min_age is dead: the files its markers list go (exactly those, never anything else under
    the name, never a file a committed record names, none at all if the folder got its
    record), then the markers. A marker without a file list (an older version's) removes no
    file."""
    groups: dict[str, list[tuple[Parts, float | None]]] = {}
    for rel, info in backend.walk((META_DIR, FOLDERS_DIR)):
        wid = rel[0][: -len(RECORD_SUFFIX)] if len(rel) == 1 else rel[0]
        groups.setdefault(wid, []).append(((META_DIR, FOLDERS_DIR, *rel), info.mtime))
    for markers in groups.values():
        parts: Parts | None = None
        listed: list[Parts] = []
        times = [t for _m, t in markers]
        unreadable = False
        for marker, _t in markers:
            try:
                doc = json.loads(backend.read_small(marker))
                found = validate_name(doc["name"]) if isinstance(doc, dict) else None
            except (NotFoundError, InvalidNameError, ValueError, KeyError, TypeError):
                continue
            except (BackendUnavailableError, StorageError):
                # a marker its writer is rewriting right now (rclone serves it half written),
                # or a storage hiccup: this write is left whole, judged again by the next gc
                unreadable = True
                break
            if found is None or (parts is not None and found != parts):
                continue  # a marker naming another folder than its write's others: skipped
            parts = found
            files = doc.get("files")
            if isinstance(files, list):
                listed += _owned.listed_paths(parts, files)
        if unreadable:
            continue
        if parts is not None:
            here = {(*parts, *r): i for r, i in backend.walk(parts)}
            times += [here[p].mtime for p in listed if p in here]
        mtime = None if any(t is None for t in times) else max(t for t in times if t is not None)
        shown = "/".join(parts) if parts is not None else "/".join(markers[0][0])
        if not judge(shown, "folder", mtime) or dry_run:
            continue
        if parts is not None and backend.stat(record_parts(parts)) is None:
            _owned.remove_listed(backend, listed, committed)
        for marker, _t in markers:
            backend.remove(marker)


def _settle(
    backend: Backend, intent: Parts, committed: _owned.Committed, *, dry_run: bool
) -> str | None:
    """Finish or drop one pending record (the one beside the record) older than min_age, under
    the publish lock (:func:`_resolve`). An unreadable one, or one of another name's place, is
    removed or kept with the reason."""
    with backend.publish_lock():
        try:
            raw = backend.read_small(intent)
            pending = decode_record(raw)
            parts = validate_name(pending.name)
        except (NotFoundError, RecordFormatError, InvalidNameError):
            if not dry_run:
                backend.remove(intent)
            return None
        if intent_parts(parts) != intent:
            return "names another artifact"
        return _resolve(backend, parts, [(intent, raw, pending)], committed, dry_run=dry_run)


def _settle_slots(
    backend: Backend,
    folder: Parts,
    slots: list[Parts],
    committed: _owned.Committed,
    *,
    dry_run: bool,
) -> str | None:
    """Finish or drop the writers' pending records of one name (``_slots``), all older than
    min_age (every writer of the name dead), as :func:`_resolve`. An unreadable one, or one
    naming an artifact whose slots are elsewhere, is removed."""
    found: list[tuple[Parts, bytes, Record]] = []
    parts: Parts | None = None
    for slot in slots:
        try:
            raw = backend.read_small(slot)
            pending = decode_record(raw)
            named = validate_name(pending.name)
        except (NotFoundError, RecordFormatError, InvalidNameError):
            named = None
        if named is None or slot_dir_parts(named) != folder or (parts and named != parts):
            if not dry_run:
                backend.remove(slot)
            continue
        parts = named
        found.append((slot, raw, pending))
    if parts is None:
        return None
    with backend.publish_lock():
        return _resolve(backend, parts, found, committed, dry_run=dry_run)


def _resolve(
    backend: Backend,
    parts: Parts,
    pendings: list[tuple[Parts, bytes, Record]],
    committed: _owned.Committed,
    *,
    dry_run: bool,
) -> str | None:
    """Settle the pending records ``pendings`` (where each is stored, its bytes, its record)
    of artifact ``parts``, whose writers are all dead.

    One matches the data: its commit stopped after its data step, so it becomes the record
    (roll forward). The data matches the record instead, or there is neither data nor record:
    the commits stopped before their data step, so they are dropped (roll back; a staged
    folder copy one names goes with it). No record, and the files under the name are some of
    those a pending record lists (an object-store upload of a new folder stopped part way):
    they are removed with it (roll back). Neither, but a whole new folder is in its staged
    copy (an object-store folder replace stopped while copying): the copies are completed
    from it and it becomes the record (roll forward). Otherwise all are kept and the reason
    returned.

    A pending record is untrusted: it is never made the record over another committed artifact
    (one inside its name, or one its name is inside), and a roll-back removes exactly the files
    it lists that no committed record names (``_owned``), never the name's folder by prefix.
    """
    try:
        found = read_record(backend, parts)
    except RecordFormatError:
        found = None
    fresh = [p for p in pendings if found is None or p[1] != found.raw]
    if not fresh and found is not None and not dry_run:
        # a pending record equal to the record: a folder replace that stopped among its copies
        # and returned its record; the copies are completed from the staged copy it names
        settled = _stagedcopies.complete_recorded(backend, found.record)
        if settled is not None:
            return settled
    if fresh:
        usable = [p for p in fresh if not committed.overlaps(p[2])]
        if not usable:
            return "it would cover another committed artifact"
        outcome = _outcome(backend, parts, found, usable, committed, dry_run=dry_run)
        if outcome is not None:
            return outcome
    if not dry_run:
        for where, _raw, _rec in pendings:
            backend.remove(where)
    return None


def _outcome(
    backend: Backend,
    parts: Parts,
    found: StoredRecord | None,
    pendings: list[tuple[Parts, bytes, Record]],
    committed: _owned.Committed,
    *,
    dry_run: bool,
) -> str | None:
    """:func:`_resolve`'s decision for pending records that differ from the record: None once
    it is applied (the pending records may go), else why they are kept."""
    for _where, raw, pending in pendings:
        if check_exact(backend, pending, "full").status == "ok":
            if not dry_run:
                put_small(backend, record_parts(parts), raw, PutMode.REPLACE)
            return None
    if (found is not None and check_exact(backend, found.record, "full").status == "ok") or (
        found is None and backend.stat(parts) is None
    ):
        return None  # stopped before their data step: the old version stands
    for _where, _raw, pending in pendings:
        if found is None and _partial_new_folder(backend, parts, pending):
            if not dry_run:  # a new folder's upload stopped part way: drop what it uploaded
                listed = _owned.listed_paths(parts, (f.path for f in pending.files))
                _owned.remove_listed(backend, listed, committed)
            return None
    # a folder replace stopped while copying: finish the version readers serve, in their order
    # (``_slotorder.staged_order``: a pending version not known to be newer than the record, a
    # replace that returned it, is not completed over it)
    versions = [pending for _where, _raw, pending in pendings]
    ordered = versions if found is None else staged_order(backend, found.record, versions)
    for version in ordered:
        if (staged := _stagedcopies.staged_whole(backend, version)) is not None:
            if not dry_run:
                _stagedcopies.roll_forward(backend, version, staged)
                if found is None or version != found.record:
                    raw = next(raw for _where, raw, p in pendings if p == version)
                    put_small(backend, record_parts(parts), raw, PutMode.REPLACE)
            return None
    return "neither its record nor its pending record matches the data"


def _partial_new_folder(backend: Backend, parts: Parts, pending: Record) -> bool:
    """True if every file under ``parts`` is one that ``pending`` (a folder's) lists: what an
    object-store upload of a new folder, stopped part way, leaves (each file lands whole)."""
    if pending.kind != "dir":
        return False
    listed = {f.path for f in pending.files}
    present = ["/".join(rel) for rel, _info in backend.walk(parts)]
    return bool(present) and all(p in listed for p in present)
