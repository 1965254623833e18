"""Staged copies of object-store folder replaces, as gc settles them.

A folder replace on an object store uploads the new version under
``.commitstore/staged/.../.commitstore.stg.<last>.<folder hex>`` before it touches an old file,
then copies it over the final keys (``backends/object/dirsink``). gc completes a replace that
stopped while copying (roll forward: the staged copy is whole, so the copies can always be
redone), and removes staged copies that no pending record (beside the record, or a writer's
own: ``_slots``) names any more.
"""

from __future__ import annotations

from commitstore._slotorder import writers_after
from commitstore._verify import _check_dir, check_exact
from commitstore.backends import Backend
from commitstore.errors import CommitStoreError
from commitstore.layout import (
    META_DIR,
    PENDING_DIR,
    RECORDS_DIR,
    STAGED_DIR,
    Parts,
    is_intent_leaf,
    is_slot_leaf,
    is_staged_leaf,
    staged_parts,
    validate_name,
)
from commitstore.records import Record, RecordFormatError, decode_record


def staged_whole(backend: Backend, pending: Record) -> Parts | None:
    """Where the whole staged copy of folder version ``pending`` is (checked against it at the
    full level), or None if there is none, or it is not whole."""
    if pending.kind != "dir" or not pending.files:
        return None
    root = staged_parts(tuple(pending.name.split("/")), pending.digest)
    if _check_dir(backend, root, pending, "full").status != "ok":
        return None
    return root


def roll_forward(backend: Backend, pending: Record, root: Parts) -> None:
    """Finish the replace of folder ``pending`` from its staged copy at ``root``: copy every
    staged file over its final key, delete what the new version lacks and the staged copy.

    Raises:
        CommitError: the backend is not an object store (no other kind stages folders); what the
            store raises for a copy or a delete (the staged copy stays, gc tries again).
    """
    files = [(f.path, f.size, f.digest) for f in pending.files]
    backend.settle_staged(tuple(pending.name.split("/")), files, root)


def complete_recorded(backend: Backend, record: Record) -> str | None:
    """Complete the copies of a recorded folder version whose final keys do not verify but
    whose staged copy is whole (roll forward: a replace that returned its record while its
    copies were stopped); None when done or nothing to do, else why it cannot be. Never where
    another writer of the name may be at work or stopped after the record
    (``_slotorder.writers_after``): the final keys may be that writer's newer version, which a
    roll-forward of the record would overwrite. Costs one stat of the staged copy when there
    is none."""
    if record.kind != "dir" or not record.files:
        return None
    if backend.stat(staged_parts(tuple(record.name.split("/")), record.digest)) is None:
        return None
    if writers_after(backend, record):
        return "another writer of the name may be at work, or stopped after its record"
    if check_exact(backend, record, "full").status == "ok":
        return None  # the copies were done: the leftover pass removes the staged copy
    staged = staged_whole(backend, record)
    if staged is None:
        return "neither its record nor its pending record matches the data"
    roll_forward(backend, record, staged)
    return None


def leftovers(backend: Backend) -> list[tuple[Parts, float | None]]:
    """Staged copies no pending record names (their replace completed, was rolled back, or its
    record was deleted since), each with the newest modification time of its files (None if
    one is unknown): removable once older than gc's ``min_age``."""
    listing = backend.walk((META_DIR, STAGED_DIR))
    if not listing:
        return []
    roots: dict[Parts, list[float | None]] = {}
    for rel, info in listing:
        for i, part in enumerate(rel):
            if is_staged_leaf(part):
                roots.setdefault((META_DIR, STAGED_DIR, *rel[: i + 1]), []).append(info.mtime)
                break
    wanted: set[Parts] = set()
    pendings = [
        (META_DIR, RECORDS_DIR, *rel)
        for rel, _info in backend.walk((META_DIR, RECORDS_DIR))
        if is_intent_leaf(rel[-1])
    ]
    if backend.capabilities.writer_slots:  # each writer's own pending record (``_slots``)
        pendings += [
            (META_DIR, PENDING_DIR, *rel)
            for rel, _info in backend.walk((META_DIR, PENDING_DIR))
            if is_slot_leaf(rel[-1])
        ]
    for where in pendings:
        try:
            pending = decode_record(backend.read_small(where))
            wanted.add(staged_parts(validate_name(pending.name), pending.digest))
        except (RecordFormatError, CommitStoreError):
            continue
    return [
        (root, None if any(t is None or t <= 0 for t in times) else max(t or 0 for t in times))
        for root, times in sorted(roots.items())
        if root not in wanted
    ]
