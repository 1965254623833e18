"""The one commit path: check, stage, publish the data, publish the record.

Every writer goes through here: the facade (``stage``, ``stage_dir``, ``put_*``), mirror copies and
``restore``, ``adopt`` (a record for data already in place) and the record cache (a small file).
What a backend offers decides how much is checked here: where a publish with ``PutMode.CREATE`` is
atomic on the storage (``Capabilities.exclusive_create``) the storage is the check; elsewhere the
absence of both record and data is checked under the backend's publish lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from datetime import datetime, timezone
from typing import Any

from commitstore import _recordcache, _slots, _stagedcopies
from commitstore._filecommit import FileCommits, PublishData
from commitstore._hierarchy import committed_below, shown
from commitstore._scan import read_record
from commitstore._small import put_small as put_small  # noqa: PLC0414 (re-exported: a test seam)
from commitstore._verify import check_exact
from commitstore.backends import Backend, CommitInfo, DirSink, FileInfo, FileSink, PutMode
from commitstore.errors import (
    AlreadyExistsError,
    CommitStoreError,
    ConfigurationError,
    NotFoundError,
)
from commitstore.layout import (
    Parts,
    infer_step,
    intent_parts,
    record_parts,
    validate_name,
)
from commitstore.records import (
    CommitOutcome,
    Record,
    RecordFormatError,
    decode_record,
    encode_record,
    new_fields,
)

log = logging.getLogger("commitstore")


def mode_of(overwrite: bool) -> PutMode:
    """The publish mode of the public ``overwrite=`` flag (a bool: ConfigurationError, before
    any I/O, for anything else, so ``overwrite="no"`` never replaces)."""
    return PutMode.REPLACE if check_flag(overwrite, "overwrite") else PutMode.CREATE


def check_new(
    name: str, step: object, metadata: object
) -> tuple[Parts, int | None, dict[str, Any]]:
    """Check what a new record of ``name`` will hold, before any I/O: the name's parts, the
    step and a private deep copy of the metadata (so a caller changing its dict later cannot
    break the record after the data is published).

    Raises:
        InvalidNameError: the name. ConfigurationError: ``step`` or ``metadata``
            (``records.new_fields``).
    """
    parts = validate_name(name)
    checked, meta = new_fields(step, metadata)
    return parts, checked, meta


def check_flag(value: object, what: str) -> bool:
    """``value`` as a bool option; ConfigurationError (before any I/O) for anything else."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{what} must be True or False, not {value!r}")
    return value


def make_record(name: str, step: object, metadata: object, **kw: Any) -> Record:
    """A new record of ``name``, committed now (the step inferred from the name if not given).
    ``step`` and ``metadata`` are checked as by :func:`check_new` (ConfigurationError)."""
    checked, meta = new_fields(step, metadata)
    return Record(
        name=name,
        step=checked if checked is not None else infer_step(name),
        created=datetime.now(timezone.utc),
        metadata=meta,
        **kw,
    )


class Committer(FileCommits):
    """One storage target (a primary or a mirror) and the one commit path into it.

    Guarantees: data is published before its record, both with the backend's one-step primitive;
    two writers' (data, record) pairs never interleave (the backend's publish lock, or its
    conditional writes); a failure before the data step publishes nothing.
    """

    def __init__(self, backend: Backend, url: str) -> None:
        self.backend = backend
        self.url = url
        """The target's URL, without credentials."""
        self.locks = type(backend).publish_lock is not Backend.publish_lock
        """Whether the backend's publish lock holds anything (file systems, ``memory://``):
        checks of the name hierarchy are then repeated under it. Object stores' lock holds
        nothing; there a folder commit checks again for artifacts below its name right before
        its pending record (one listing), and the other checks are made when staging starts (a
        commit of a name below that lands between that listing and the record is not
        excluded)."""

    def __repr__(self) -> str:
        return f"Committer({self.url!r}, strategy={self.backend.strategy!r})"

    # -- checks (the others: _namechecks; deletes: _delete) -------------------------------------
    def check_name_free(self, parts: Parts) -> None:
        """:meth:`check_absent` for a create-only commit starting (outside the publish lock):
        data without a record that an interrupted commit of the name left, matching its pending
        record, is first made a commit (:meth:`promote_earlier`, under the lock), so the refusal
        says "already committed" rather than advising to overwrite a whole version. Neither
        record nor data: free, from the same two stats :meth:`check_absent` makes (not
        repeated)."""
        if self.backend.stat(record_parts(parts)) is None:
            if self.backend.stat(parts) is None:
                return
            with self.backend.publish_lock():
                self.promote_earlier(parts)
        self.check_absent(parts)

    # -- staging -------------------------------------------------------------------------------
    def open_file(self, parts: Parts, mode: PutMode) -> FileSink:
        """Start staging a file artifact. With ``CREATE`` a taken name fails now, before any
        bytes are sent (and again, atomically, at publish). A name inside a committed artifact
        (``ckpt-100/notes.txt`` when ``ckpt-100`` is a committed folder) is refused, and so is a
        folder path that holds committed artifacts (:meth:`check_place`)."""
        with self.backend.folders_kept():
            self.check_place(parts)
            if mode is PutMode.CREATE:
                self.check_name_free(parts)
            return self.backend.open_sink(parts, mode=mode)

    def open_dir(self, parts: Parts, mode: PutMode) -> DirSink:
        """Start staging a folder artifact (same early checks as :meth:`open_file`)."""
        self.check_place(parts)
        if mode is PutMode.CREATE:
            self.check_name_free(parts)
        return self.backend.open_dir_sink(parts, mode=mode)

    # -- publishing ----------------------------------------------------------------------------
    def commit(
        self,
        parts: Parts,
        mode: PutMode,
        publish_data: PublishData,
        *,
        intent: Record | None = None,
        body: bytes | None = None,
        data_in_place: bool = False,
        started: float | None = None,
    ) -> Record:
        """Under the publish lock: publish the data (``publish_data`` returns its record and what
        the data's publish did, None if nothing was published there), then the record with the
        same mode (``body``: the exact record bytes, for mirror copies). Returns the record with
        its :class:`~commitstore.records.CommitOutcome` (``started``: ``time.monotonic()`` when
        the caller's write began, for ``seconds``; default now).

        ``intent``: the record the data will have, when it is known before the data is
        published. It is then written first, as the name's pending record (``intent_parts``):
        a crash or failure after the data step leaves a pending record that the data matches,
        so the name verifies as the new version (readers resolve it; gc makes it the record),
        and one before it leaves a pending record the data does not match (the old version
        stands; gc removes it). Without ``intent`` the record is published last, as before.
        Where the publish lock holds nothing (object stores) the pending record goes to a slot
        of this writer's own, kept alive by a heartbeat while the commit runs, and is removed
        afterwards only when no other writer of the name may need it (``_slots``).

        Where the pending record is the record to publish (same bytes) and the backend renames
        in one step (``Backend.publish_small_from``: local disks), the record is published by
        renaming the pending record onto it, then syncing that folder, instead of writing and
        syncing a second copy and removing the first. There the pending record is written in
        place (``Backend.put_pending``). A small local commit then makes five syncs: (1) the
        pending record's file, (2) the records folder (the pending record is named) and (3)
        the data's file, all three in flight at once (workers), then (4) the data's folder
        (its rename), (5) the records folder again (the record's rename). Crash consistency,
        step by step: until (1), (2) and (3) complete, the data is not renamed yet, so the old
        version stands whatever of the pending record survives (none, a torn one: a pending
        record without matching data is ignored, and the one it replaced was not what made
        the name verify: ``promote_earlier``). From then on, the pending record is whole and
        named durably before the data's rename is even issued, so once that rename survives,
        the name verifies as the new version. (4)
        completes before the record's rename is issued, so a record naming the new data never
        survives without it. The rename of (5) is one step: a crash leaves the same bytes under
        the pending name or under the record's (old record or none beside it), both of which
        verify as the new version. (2) and (5) cannot be one sync: the pending record must be
        durable before the data's rename and the record's rename must follow the data's sync;
        nor can (5) be left to a later sync: a new name whose record's rename is lost is found
        by no reader until gc.

        With ``CREATE`` on storage without an atomic create-only publish, the absence of record
        and data is checked first, under the lock. ``data_in_place``: the data under the name
        is this commit's own (a multi-writer folder on an object store, ``_folderwrite``), so only
        the record's absence is checked.

        The outcome is binary. Until the new data is published under the name, a failure is
        raised and the name holds what it held before. Once it is, and the name verifies as
        the new version (the data matches the pending record), nothing after raises: a failed
        data-step confirmation (a stat or folder sync after the rename: the data is checked in
        full against the pending record, and the record is then written as usual), a failed
        record write of a name that has a record (the pending record makes the name verify as
        the new version; gc makes it the record), a failed removal of the pending record, an
        object-store folder replace stopped among its copies whose staged copy is whole (the
        name verifies as the new version from there; this writer's slot stays, naming it, and
        gc completes the copies):
        each is a note of the returned record's outcome, with ``durable`` False and a warning
        in the log. A failed record write of a **new** name (no record, read again after the
        failure) is raised instead: no reader finds a name without a record, so the commit is
        withdrawn first (its pending record, then the data it published if still its own;
        data of a multi-writer folder written in place stays, for a later commit), and the
        name stays unpublished. Where the record cannot even be read then, the commit returns
        as above (``durable`` False; gc completes it).

        Raises:
            AlreadyExistsError: the name is taken (``CREATE``): at the data's publish, or by
                the record's own create-only write (another writer's record published
                meanwhile, as a folder written in place on an object store can meet). The
                other writer's version stands, untouched; this commit's pending record is
                removed, so the name never verifies as this commit's version.
            NameConflictError: a folder (``intent`` of kind ``dir``) whose name holds other
                committed artifacts below it (object stores: committed since its staging
                began); nothing is published, the other artifacts are untouched.
            CommitError, StorageError, InsufficientSpaceError, BackendUnavailableError: a
                failure before the new data was published (or one after it that leaves a name
                not verifying as the new version: without a pending record, or a folder whose
                files changed meanwhile); the name holds what it held before.
        """
        t0 = time.monotonic() if started is None else started
        notes: list[str] = []
        durable = True
        keep_slot = False
        slot = (
            _slots.new_slot(parts)
            if intent is not None and _slots.uses_slots(self.backend)
            else None
        )
        with self.backend.publish_lock():
            if self.locks:  # again where the lock holds: no commit below can land meanwhile
                self.check_place(parts)
            elif intent is not None and intent.kind == "dir":
                # object stores: a folder's files are its keys below the name, so an artifact
                # committed below it since staging began (one listing) would be inside it
                self.check_nothing_below(parts, "committing this folder there")
            if mode is PutMode.REPLACE and intent is not None and intent.kind == "dir":
                if slot is not None:  # object stores
                    self.complete_returned(parts)
                self.check_no_foreign_files(parts, intent)
            if mode is PutMode.CREATE and not self.backend.capabilities.exclusive_create:
                if data_in_place:
                    self.check_unrecorded(parts)
                else:
                    self.check_absent(parts)
            pending = None
            if intent is not None:
                if slot is None:
                    self.promote_earlier(parts)
                pending = body if body is not None else encode_record(intent)
                where = slot or intent_parts(parts)
                wrote = None if slot is not None else self.backend.put_pending(where, pending)
                if wrote is None:
                    put_small(self.backend, where, pending, PutMode.REPLACE)
                elif not wrote.durable:  # its folder sync failed: said, as the data's would be
                    durable = False
                    notes += (f"pending record: {n}" for n in wrote.notes)
            beat = (
                _slots.heartbeat(self.backend, slot, pending, _slots.interval(self.backend))
                if slot is not None and pending is not None
                else contextlib.nullcontext()
            )
            with beat:
                try:
                    record, info = publish_data()
                except AlreadyExistsError:
                    if pending is not None:  # nothing of ours was published: drop our intent
                        with contextlib.suppress(CommitStoreError):
                            self.backend.remove(slot or intent_parts(parts))
                    raise
                except CommitStoreError as exc:
                    if intent is None:
                        raise
                    if self._stands(intent):
                        notes.append(f"data: {exc} (the new data is in place and verifies)")
                    elif slot is not None and _stagedcopies.staged_whole(self.backend, intent):
                        # a folder replace stopped among its copies (object stores): the name
                        # verifies as the new version from its staged copy, which this slot
                        # names until gc completes the copies; so it is committed, not failed
                        keep_slot = True
                        notes.append(
                            f"data: {exc} (the copies over the old files stopped; the new "
                            "version is whole in its staged copy and verifies from there; gc "
                            "completes the copies)"
                        )
                    else:
                        raise
                    record, info = intent, None
                    durable = False
                if info is not None:  # retries, refusals: said even when durable
                    durable = durable and info.durable
                    notes += info.notes
                if body is None:  # the intent's bytes when the record is the intent
                    body = pending if record is intent and pending else encode_record(record)
                published: CommitInfo | None = None
                renamed = False
                try:
                    if slot is None and pending == body:
                        published = self.backend.publish_small_from(
                            intent_parts(parts), record_parts(parts), mode=mode
                        )
                        renamed = published is not None
                    if published is None:
                        published = put_small(self.backend, record_parts(parts), body, mode)
                except AlreadyExistsError:
                    if not self._own_record(parts, body):
                        # create-only, and another writer's record took the name meanwhile
                        # (object stores: a folder written in place, whose record is the
                        # commit): that version stands and this commit fails; its pending
                        # record must not make the name verify as this one
                        if pending is not None:
                            with contextlib.suppress(CommitStoreError):
                                self.backend.remove(slot or intent_parts(parts))
                        raise
                    published = CommitInfo(len(body))  # a retried write found its own record
                except CommitStoreError as exc:
                    if pending is None or pending != body:
                        raise
                    now = self._record_now(parts)
                    if now == body:  # the write landed after all (its answer was lost)
                        published = CommitInfo(len(body), durable=False)
                    elif now is None:
                        # a new name: without its record no reader finds it, so the commit
                        # is withdrawn (pending record, then the data it published) and fails
                        self._withdraw(parts, slot, intent, data_in_place)
                        raise
                    durable = False
                    notes.append(
                        f"record: {exc} (the new data is published; its pending record makes "
                        "it verify as the new version, and gc makes that the record)"
                    )
                if published is not None:
                    durable = durable and published.durable
                    notes += (f"record: {n}" for n in published.notes)
            if published is None or keep_slot:
                pass  # the pending record stays: it is what makes the name verify
            elif slot is not None:  # kept if another writer of the name may need it (_slots)
                self._settle_slot(parts, slot, body, record)
            elif pending is not None and not renamed:
                # a leftover only costs a lookup (it equals the durable record), so the removal
                # need not be durable: no folder sync for it
                try:
                    self.backend.remove_leftover(intent_parts(parts))
                except CommitStoreError as exc:
                    durable = False
                    notes.append(f"pending record: not removed ({exc}); gc removes it")
        if published is not None and published.tag is not None:
            # object stores: keep the record cache whole (best effort)
            with contextlib.suppress(CommitStoreError):
                _recordcache.note(
                    self.backend, "/".join(record_parts(parts)[2:]), published.tag, body
                )
        outcome = CommitOutcome(
            durable=durable,
            notes=tuple(notes),
            target=self.url,
            bytes=record.size,
            seconds=time.monotonic() - t0,
        )
        if durable:
            log.info(
                "committed %s to %s (%d bytes, %s)",
                record.name,
                self.url,
                record.size,
                record.digest,
            )
        else:
            log.warning(
                "%s: committed to %s (%d bytes, %s), durability unconfirmed: %s",
                record.name,
                self.url,
                record.size,
                record.digest,
                "; ".join(notes),
            )
        return dataclasses.replace(record, outcome=outcome)

    def _record_now(self, parts: Parts) -> bytes | None:
        """After a record write failed: the name's record as stored now (its exact bytes), None
        if the name has none (a new name: no record, no aside entry of one), else ``b""`` when
        it cannot be told (unreadable record, failed read)."""
        try:
            found = read_record(self.backend, parts)
        except (CommitStoreError, RecordFormatError):
            return b""
        return None if found is None else found.raw

    def _withdraw(
        self, parts: Parts, slot: Parts | None, intent: Record | None, data_in_place: bool
    ) -> None:
        """Undo a commit of a new name whose record could not be written, best effort, so the
        name stays unpublished: its pending record first (then nothing can make the name
        verify as this version, whatever else fails), then the data this commit published,
        only if it is still this commit's (checked in full). Data a multi-writer folder
        uploaded in place (``data_in_place``) stays: it was there before the commit, and a
        later :meth:`commit` may try again."""
        try:
            self.backend.remove(slot or intent_parts(parts))
        except CommitStoreError:
            log.warning("%s on %s: pending record not withdrawn", "/".join(parts), self.url)
        if data_in_place or intent is None:
            return
        with contextlib.suppress(CommitStoreError):
            if check_exact(self.backend, intent, "full").status == "ok":
                self.backend.remove(parts)

    def _own_record(self, parts: Parts, body: bytes) -> bool:
        """After a create-only record write was refused: whether the record stored is this
        commit's own (a retried request whose first attempt landed). A failed read is no."""
        try:
            return self.backend.read_small(record_parts(parts)) == body
        except CommitStoreError:
            return False

    def _stands(self, intent: Record) -> bool:
        """After the data step raised: whether the name verifies as ``intent`` all the same (the
        data was published and a later step of its publish failed). Checked in full; a check
        the storage fails counts as no."""
        try:
            return check_exact(self.backend, intent, "full").status == "ok"
        except CommitStoreError:
            return False

    def _settle_slot(self, parts: Parts, slot: Parts, body: bytes, record: Record) -> None:
        """Step 4 of ``_slots``: drop this writer's slot when no one may need it; when the
        record read back is another writer's (published late, over data that is this one's),
        publish this one again if the data, checked in full, is still this commit's."""
        for _attempt in range(3):
            if _slots.release(self.backend, parts, slot, body) != "overwritten":
                return
            if check_exact(self.backend, record, "full").status != "ok":
                return  # a later writer's data stands, named by its own pending record
            with contextlib.suppress(CommitStoreError):  # the slot still names this version
                put_small(self.backend, record_parts(parts), body, PutMode.REPLACE)

    def promote_earlier(self, parts: Parts) -> None:
        """Under the publish lock, before this commit's pending record is written: an earlier
        commit of the name that stopped after its data step left a pending record that the data
        matches (the version the name verifies as). It is made the record first, so the pending
        record written next never hides the only version that verifies. A pending record the
        data does not match is left to be replaced (its data was never published; where the
        lock holds nothing, a concurrent writer of the same name is last-writer-wins anyway).
        Costs one small read when there is none; a full check of the data only when there is."""
        try:
            raw = self.backend.read_small(intent_parts(parts))
            earlier = decode_record(raw)
        except (NotFoundError, RecordFormatError):
            return
        if earlier.name != "/".join(parts):
            return
        with contextlib.suppress(NotFoundError, RecordFormatError):  # none, or a bad one
            if self.backend.read_small(record_parts(parts)) == raw:
                return  # its record was published: only the pending copy was left
        if check_exact(self.backend, earlier, "full").status == "ok":
            put_small(self.backend, record_parts(parts), raw, PutMode.REPLACE)
            log.info(
                "%s on %s: an interrupted commit's version was made the record first",
                earlier.name,
                self.url,
            )

    def add_record(self, parts: Parts, body: bytes, *, seen: FileInfo | None = None) -> str | None:
        """Publish a record for data already in place (``adopt``). None if published, else why
        not: a record appeared meanwhile (the data is then someone else's commit, left alone),
        or the data is no longer the one ``seen`` (size, mtime) before it was hashed (replaced
        meanwhile, so the record would not describe it). Both checks run under the publish
        lock, so no commit can publish between them and the record. A folder path that holds
        committed artifacts is never adopted (its record would claim their files), nor a path
        inside a committed artifact (a member of a committed folder is not an artifact of its
        own)."""
        with self.backend.publish_lock():
            if self.backend.stat(record_parts(parts)) is not None:
                return "already has a record"
            outer = self.outer_artifact(parts)
            if outer is not None:
                return f"inside the committed artifact {outer} (not adopted)"
            below = committed_below(self.backend, parts)
            if below:
                return f"holds committed artifacts ({shown(below)}; not adopted)"
            if seen is not None:
                now = self.backend.stat(parts)
                if now is None or (now.size, now.mtime) != (seen.size, seen.mtime):
                    return "changed while it was checked (not adopted)"
            try:
                put_small(self.backend, record_parts(parts), body, PutMode.CREATE)
            except AlreadyExistsError:
                return "already has a record"
        return None
