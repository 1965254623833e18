"""Newest first, by the version each name verifies as: ``latest``, ``newest`` and the resume
order of the integrations.

A name's stored record is not always the version the name verifies as: a commit stopped after
its data step leaves the new bytes under the name, the old record, and the new version as a
pending record (docs/guarantees.md, "What a crash leaves"). Ordering names by their stored
records alone would then rank ``last.ckpt`` by its old step, and ``latest()`` would return an
older step than the newest whole one until gc settles the record.

So every pending version is a candidate too, at its own place in the order (``_order``): the
names that have one are found from the same listing of the records folder (pending records sit
beside the records) plus, on object stores, one listing of the writers' slots; only those names'
pending records are read. A name one of whose pending versions has the same sizes as its record
(a same-size overwrite: one model's checkpoints) is checked in full whatever the level asked,
since sizes cannot tell which version it holds. Walking candidates newest first, a pending
version is taken only when its name verifies as exactly that version (the name is checked
once, whichever of its candidates comes first); a record only when its name verifies (as the
record, or as a pending version that appeared after the listing). Each name is yielded at most
once, so the walk is exactly the order of the versions the names hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass

from commitstore._order import arrange, sort_key
from commitstore._scan import scan_records
from commitstore._slots import uses_slots
from commitstore._verify import pending_versions, resolve, same_shape
from commitstore.backends import Backend, FileInfo
from commitstore.errors import CommitStoreError
from commitstore.layout import (
    META_DIR,
    PENDING_DIR,
    RECORDS_DIR,
    Parts,
    is_intent_leaf,
    is_slot_leaf,
    record_of_intent,
    record_parts,
)
from commitstore.records import Record, VerifyResult

log = logging.getLogger("commitstore")

Resolver = Callable[[Record, Hashable], tuple[VerifyResult, Record] | None]
"""``(record, where) -> (result, version)`` of the name at ``where``; None to skip it there."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A version a name may verify as: its record (``origin`` None) or a pending version of
    ``origin`` (the record it would replace), to be checked at ``where``."""

    version: Record
    origin: Record | None
    where: Hashable


def pending_marked(backend: Backend, listing: Iterable[tuple[Parts, FileInfo]]) -> set[Parts]:
    """The record paths (below the records folder) of the names that have a pending record:
    from ``listing`` (a walk of the records folder) and, on object stores, the writers' slots."""
    marked = {record_of_intent(rel) for rel, _info in listing if is_intent_leaf(rel[-1])}
    if uses_slots(backend):
        try:
            slots = backend.walk((META_DIR, PENDING_DIR))
        except CommitStoreError as exc:
            log.warning("latest: the pending records cannot be listed: %s", exc)
            slots = []
        marked |= {
            record_of_intent(rel[:-1])
            for rel, _info in slots
            if len(rel) >= 2 and is_slot_leaf(rel[-1]) and is_intent_leaf(rel[-2])
        }
    return marked


def candidates(
    backend: Backend,
    records: Iterable[Record],
    listing: Iterable[tuple[Parts, FileInfo]],
    where: Hashable = None,
) -> list[Candidate]:
    """Each record, and the pending versions of the records :func:`pending_marked` finds."""
    marked = pending_marked(backend, listing)
    out: list[Candidate] = []
    for rec in records:
        out.append(Candidate(rec, None, where))
        if record_parts(tuple(rec.name.split("/")))[2:] not in marked:
            continue
        try:
            versions = pending_versions(backend, rec)
        except CommitStoreError as exc:
            log.warning("latest: the pending records of %s cannot be read: %s", rec.name, exc)
            continue
        out.extend(Candidate(v, rec, where) for v in versions if v.name == rec.name)
    return out


def ambiguous(found: Iterable[Candidate]) -> set[str]:
    """The names one of whose pending versions a size-level check cannot tell from its record
    (:func:`same_shape`): they are checked in full wherever a walk ranks by the version a name
    holds, else a stopped same-size overwrite would rank (and be served) as its old step."""
    return {
        c.version.name for c in found if c.origin is not None and same_shape(c.version, c.origin)
    }


def level_for(name: str, level: str, sharp: set[str]) -> str:
    """``level``, raised to ``"full"`` for a name in ``sharp`` (:func:`ambiguous`)."""
    return "full" if name in sharp else level


def walk(found: Iterable[Candidate], check: Resolver) -> Iterator[tuple[VerifyResult, Record]]:
    """``(result, version)`` per name, newest first by the version each name verifies as
    (module docstring); a name that does not verify is yielded once, with its failed result,
    at its record's place."""
    checked: dict[tuple[str, Hashable], tuple[VerifyResult, Record] | None] = {}
    done: set[str] = set()
    for cand in reversed(arrange(found, lambda c: sort_key(c.version))):
        name = cand.version.name
        if name in done:
            continue
        record = cand.origin or cand.version
        key = (name, cand.where)
        if key not in checked:
            checked[key] = check(record, cand.where)
        got = checked[key]
        if got is None:
            continue
        result, version = got
        if cand.origin is not None and (result.status != "ok" or version != cand.version):
            continue  # not this pending version: the name's own record comes later
        done.add(name)
        yield result, version


def newest(backend: Backend, level: str) -> Iterator[tuple[VerifyResult, Record]]:
    """:func:`walk` over one store's records and pending versions, each checked at ``level``."""
    listing = backend.walk((META_DIR, RECORDS_DIR))
    records, bad = scan_records(backend, listing)
    for b in bad:
        log.warning("latest: skipping %s: bad_record (%s)", b.name, b.detail)
    found = candidates(backend, records, listing)
    sharp = ambiguous(found)
    yield from walk(
        found,
        lambda rec, _where: resolve(backend, rec, level_for(rec.name, level, sharp), settle=False),
    )


def latest(backend: Backend, level: str) -> Record | None:
    """The newest version that passes the check at ``level``; each name skipped is logged."""
    for result, version in newest(backend, level):
        if result.status == "ok":
            return version
        log.warning("latest: skipping %s: %s (%s)", version.name, result.status, result.detail)
    return None
