"""One pending record per writer, where the publish lock holds nothing (object stores).

On storage with a real publish lock (``Backend.publish_lock``) a name has one pending record
(``layout.intent_parts``), written under the lock. An object store has no lock: two processes
overwriting one name (every rank saving ``last.ckpt``, a restarted job and its zombie) would
share that one slot, and the second writer's pending record could replace the first's after
the first's data was published, leaving data that no record names. There, each commit writes
its pending record to a slot of its own, ``.commitstore/pending/<dir>/<intent leaf>/<writer>.json``
(``layout.slot_parts``), and the protocol is:

1. write the own slot (then refreshed every ``heartbeat`` seconds until the commit ends: its
   modification time is the writer's proof of life, which gc respects);
2. publish the data; 3. publish the record;
4. remove the own slot only if the record, read again, is the own one **and** the slot folder,
   listed after that read, holds no other writer's slot; otherwise leave it (gc settles it).
   A record read back that is another writer's, while the own data still stands (checked in
   full: a writer whose data was overwritten published its record late), is published again,
   and step 4 repeated (a few times at most): so with two writers the record ends up matching
   the data, not only one of the pending records.

Why a version always verifies (two or more writers, each killed at any point): the bytes under
the name are the last data publish, by some writer W, whose slot was written before that
publish. W removes its slot only after it saw its own record and then no other slot. A writer V
that could still publish a record afterwards published its data before W's (else the data
would be V's), so V's slot existed from before W's data until after V's record: W either saw
V's record instead of its own, or V's slot in the listing, and kept its slot. So the bytes
under the name always match the record or a slot; readers try every slot
(``pending_records``), gc makes the matching one the record once every writer of the name is
dead. No conditional write is needed (``rclone serve s3`` honours none).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from commitstore._scan import StoredRecord
from commitstore._small import put_small
from commitstore.backends import Backend, PutMode
from commitstore.errors import CommitStoreError, NotFoundError
from commitstore.layout import Parts, is_slot_leaf, record_parts, slot_dir_parts, slot_parts
from commitstore.records import RecordFormatError, decode_record

log = logging.getLogger("commitstore")


@dataclass(frozen=True, slots=True)
class Slot:
    """One writer's pending record of a name, as stored."""

    parts: Parts
    stored: StoredRecord
    mtime: float | None
    """Its last heartbeat (None when unknown)."""


def uses_slots(backend: Backend) -> bool:
    """True where pending records go to per-writer slots: the publish lock holds nothing."""
    return backend.capabilities.writer_slots


def read_slots(backend: Backend, parts: Parts) -> list[Slot]:
    """Every readable writer slot of ``parts`` that names ``parts`` (one listing, one read
    each); an unreadable or foreign one is skipped: a slot only ever adds a candidate."""
    if not uses_slots(backend):
        return []
    folder = slot_dir_parts(parts)
    name = "/".join(parts)
    out: list[Slot] = []
    try:
        listing = backend.walk(folder)
    except CommitStoreError:
        return []
    for rel, info in listing:
        if len(rel) != 1 or not is_slot_leaf(rel[0]):
            continue
        where = (*folder, rel[0])
        try:
            raw = backend.read_small(where)
            record = decode_record(raw)
        except (CommitStoreError, RecordFormatError):
            continue
        if record.name == name:
            out.append(Slot(where, StoredRecord(raw, record), info.mtime))
    return out


DEFAULT_HEARTBEAT = 60.0
"""Seconds between a writer's heartbeats unless its backend sets ``heartbeat``; gc's ``min_age``
must exceed it (its default, 3600 s, does)."""


def interval(backend: Backend) -> float:
    """The heartbeat interval of writers on ``backend``."""
    value = getattr(backend, "heartbeat", None)
    return float(value) if isinstance(value, (int, float)) and value > 0 else DEFAULT_HEARTBEAT


def new_slot(parts: Parts) -> Parts:
    """A fresh writer slot of ``parts``."""
    return slot_parts(parts, secrets.token_hex(8))


class Beat:
    """Rewrites one small file (a writer's pending record or marker) every ``interval`` seconds
    on a daemon thread until :meth:`stop`, so its modification time shows the writer alive.
    ``body``: its bytes, or a callable giving its current bytes at each beat. ``lock``: held
    around each rewrite (its owner's own rewrites of the file take it too, so a beat never
    puts back an older body over a newer one)."""

    def __init__(
        self,
        backend: Backend,
        parts: Parts,
        body: bytes | Callable[[], bytes],
        interval: float,
        *,
        lock: contextlib.AbstractContextManager[object] | None = None,
    ) -> None:
        self._stop = threading.Event()
        self._args = (backend, parts, body, interval)
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._thread = threading.Thread(target=self._run, name="commitstore-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backend, parts, body, interval = self._args
        while not self._stop.wait(interval):
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    put_small(backend, parts, body() if callable(body) else body, PutMode.REPLACE)
            except CommitStoreError as exc:  # the next beat tries again
                log.warning("heartbeat of %s failed: %s", "/".join(parts), exc)

    def stop(self) -> None:
        """Stop and join: no rewrite happens after this returns."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


@contextlib.contextmanager
def heartbeat(backend: Backend, slot: Parts, body: bytes, interval: float) -> Iterator[None]:
    """A :class:`Beat` of ``slot`` while the block runs; stopped and joined before the block's
    end returns, so no rewrite can bring the slot back after its writer removed it."""
    beat = Beat(backend, slot, body, interval)
    try:
        yield
    finally:
        beat.stop()


def release(backend: Backend, parts: Parts, slot: Parts, body: bytes) -> str:
    """After the record of ``parts`` was published with ``body``: remove the own ``slot`` only
    if the record, read again, is still ``body`` and then no other writer's slot is there
    (step 4 of the module's protocol). ``"released"``; ``"kept"`` (another writer's slot is
    there, or the storage failed: gc settles it); ``"overwritten"`` (the record read back is
    another writer's: the caller may publish its own again if its data still stands)."""
    try:
        if backend.read_small(record_parts(parts)) != body:
            return "overwritten"
        folder = slot_dir_parts(parts)
        others = [rel for rel, _info in backend.walk(folder) if rel != (slot[-1],)]
        if others:
            return "kept"
        backend.remove_leftover(slot)
    except (NotFoundError, CommitStoreError):
        return "kept"
    return "released"
