"""Which writer of a folder's name came last, where a publish lock holds nothing (object
stores): the order in which readers and gc try the staged copies of a folder replace stopped
among its copies, and which writer slots a delete or a new commit may settle.

Judged by the store's own clock: a slot's last heartbeat (``_slots``) against the record's
modification time, with a writer taken for dead once it missed :data:`DEAD_AFTER` heartbeats.
Every process of a store must use the same ``heartbeat`` option (as gc's ``min_age`` assumes).
"""

from __future__ import annotations

from commitstore._slots import Slot, interval, read_slots
from commitstore.backends import Backend
from commitstore.layout import Parts, record_parts
from commitstore.records import Record

__all__ = ["DEAD_AFTER", "staged_order", "superseded_slots", "writers_after"]


def _slot_times(
    backend: Backend, record: Record
) -> tuple[list[Slot], dict[str, float], float | None]:
    """The writer slots of ``record``'s name; per pending version (by digest) the newest known
    heartbeat of a slot holding it; the record's own modification time (None: unknown), both
    by the store's clock (the record is not looked at where no slot has a known time)."""
    parts = tuple(record.name.split("/"))
    slots = read_slots(backend, parts)
    times: dict[str, float] = {}
    for slot in slots:
        if slot.mtime is not None and slot.mtime > 0:
            key = slot.stored.record.digest
            times[key] = max(times.get(key, 0.0), slot.mtime)
    info = backend.stat(record_parts(parts)) if times else None
    return slots, times, info.mtime if info is not None and info.mtime else None


def staged_order(backend: Backend, record: Record, pendings: list[Record]) -> list[Record]:
    """The order in which the staged copies of a folder's versions are tried, by readers and
    by gc alike (the first whole one is the version the name is, and the one gc completes):
    first the pending versions whose writer was alive after the record was written (a replace
    begun after it, or one that ran on beside it: by the store's own clock, its slot's last
    heartbeat is newer than the record), newest first; then the record (a replace that
    returned its record while its copies were stopped: it was committed); then the other
    pending versions, newest first: their writers stopped before the record was written, so it
    superseded them (ties and unknown times count as before).

    Not decided here (known gaps, ``docs/guarantees.md``): a writer alive after the record by
    its heartbeat (also one stalled while its heartbeat thread kept beating) and killed later
    still comes first, whether or not any of its copies landed after the record.
    """
    if not pendings:
        return [record]
    _slots, times, recorded = _slot_times(backend, record)

    def newest_first(versions: list[Record]) -> list[Record]:
        return sorted(versions, key=lambda v: -times.get(v.digest, 0.0))

    later = [p for p in pendings if recorded is not None and times.get(p.digest, 0.0) > recorded]
    return [*newest_first(later), record, *newest_first([p for p in pendings if p not in later])]


def writers_after(backend: Backend, record: Record) -> bool:
    """Whether a writer of ``record``'s name other than the one that wrote it may be at work
    now, or have stopped after the record was written: a slot holding another version, unless
    its writer was dead before the record (its last heartbeat more than :data:`DEAD_AFTER`
    heartbeat intervals older than the record, by the store's clock; a live writer's heartbeat
    may lag the record by up to one interval). An unknown time counts as at work."""
    slots, _times, recorded = _slot_times(backend, record)
    dead_before = None if recorded is None else recorded - DEAD_AFTER * interval(backend)
    return any(
        slot.stored.record != record
        and (dead_before is None or slot.mtime is None or not 0 < slot.mtime < dead_before)
        for slot in slots
    )


def superseded_slots(backend: Backend, record: Record) -> list[Parts]:
    """The writer slots of folder ``record``'s name that its delete removes with it (else gc
    would roll one of their staged copies forward over the deleted name): the one holding the
    record itself (a replace that returned it while its copies were stopped: that writer is
    done), and those of writers dead before the record was written (their last heartbeat more
    than :data:`DEAD_AFTER` heartbeat intervals older than the record, by the store's clock).
    Any other slot stays: its writer may be alive and committing the name now."""
    slots, _times, recorded = _slot_times(backend, record)
    dead_before = None if recorded is None else recorded - DEAD_AFTER * interval(backend)
    return [
        slot.parts
        for slot in slots
        if slot.stored.record == record
        or (dead_before is not None and slot.mtime is not None and 0 < slot.mtime < dead_before)
    ]


DEAD_AFTER = 3
"""Heartbeat intervals without a heartbeat after which a writer is taken for dead before a
record was written (as an upload's marker: ``docs/guarantees.md``)."""
