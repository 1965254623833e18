"""The checks of a name that the commit path makes before it stages, publishes or deletes: free
space, a name already taken, and the name hierarchy (never inside a committed artifact, never over
a folder path that holds committed artifacts or a write in progress, never a folder replace over
another tool's file).

Each check raises, before anything is changed, the error the name's state calls for; the commit
path (``_commit.Committer``) and deletes (``_delete``) run them, some again under the publish lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from commitstore import _slots, _stagedcopies
from commitstore._hierarchy import committed_below, folder_writes_over, shown
from commitstore.backends import Backend
from commitstore.errors import (
    AlreadyExistsError,
    CommitStoreError,
    InsufficientSpaceError,
    NameConflictError,
    NotFoundError,
)
from commitstore.layout import Parts, intent_parts, is_staging_part, record_parts
from commitstore.records import Record, RecordFormatError, decode_record

log = logging.getLogger("commitstore")

RECORD_HEADROOM = 64 * 1024
"""Space reserved for the record when checking free space before a write of known size."""


@dataclass(frozen=True)
class OwnRecords:
    """What the record and the pending record of one name say about its data (read by
    :meth:`NameChecks.own_records`)."""

    records: tuple[Record, ...]
    """Those of the two that can be read and name this artifact, the record first."""
    record_damaged: bool
    """The record is there but cannot be read or decoded: its version cannot say which files
    are its own (a pending record that cannot be read is only left out of ``records``)."""


class NameChecks:
    """The checks of one target's names (``backend``, shown as ``url`` in messages): the part of
    :class:`~commitstore._commit.Committer` that reads, never writes."""

    backend: Backend
    url: str

    def check_free(self, parts: Parts, size: int) -> None:
        """Raise InsufficientSpaceError if the target says it has no room for ``size`` bytes."""
        free = self.backend.free_space(parts)
        if free is not None and free < size + RECORD_HEADROOM:
            raise InsufficientSpaceError(
                f"{self.url}: {size} bytes needed for {'/'.join(parts)}, {free} available",
                path="/".join(parts),
                needed=size,
                available=free,
            )

    def check_unrecorded(self, parts: Parts) -> None:
        """Raise AlreadyExistsError if ``parts`` has a record."""
        name = "/".join(parts)
        if self.backend.stat(record_parts(parts)) is not None:
            raise AlreadyExistsError(f"{name} is already committed (overwrite=False)", name=name)

    def check_absent(self, parts: Parts) -> None:
        """Raise AlreadyExistsError if ``parts`` has a record, or data without one."""
        name = "/".join(parts)
        if self.backend.stat(record_parts(parts)) is not None:
            raise AlreadyExistsError(f"{name} is already committed (overwrite=False)", name=name)
        if self.backend.stat(parts) is not None:
            writes = folder_writes_over(self.backend, parts)
            if writes:  # object stores: a begin_folder write uploading to its final keys
                raise AlreadyExistsError(
                    f"{name} is being written by a folder write in progress "
                    f"({shown(writes)}, begin_folder), whose files are already under the name; "
                    "nothing was changed. Add files through that write (join_folder with its "
                    "token) and let its coordinator commit it, or abort() it first; or use "
                    "another name. overwrite=True would replace that write's files. A write "
                    "whose writers died is removed by gc once older than min_age",
                    name=name,
                )
            raise AlreadyExistsError(
                f"{name} exists without a record (left by another tool or an interrupted commit); "
                "pass overwrite=True to replace it",
                name=name,
            )

    def check_nothing_below(self, parts: Parts, what: str) -> None:
        """Raise NameConflictError if committed artifacts (or commits in flight) sit below the
        folder path ``parts``: ``what`` (a delete, a replace) would reach into them. One listing
        of the records folder of ``parts`` (``_hierarchy``)."""
        below = committed_below(self.backend, parts)
        if below:
            name = "/".join(parts)
            raise NameConflictError(
                f"{name} is a folder path that holds other committed artifacts "
                f"({shown(below)}); {what} would reach into them, so it is refused and nothing "
                "was changed (delete or move those artifacts first, or use another name)",
                name=name,
            )

    def check_no_staging_below(self, parts: Parts) -> None:
        """Raise NameConflictError if the unrecorded folder at ``parts`` holds a staging entry:
        a write in progress below it (or one a dead writer left, which gc removes by age), whose
        files a delete of the whole folder would take. Nothing below ``parts``: nothing to do."""
        info = self.backend.stat(parts)
        if info is None or not info.is_dir or not self.backend.capabilities.staging_names:
            return
        staging = [rel for rel, _ in self.backend.walk(parts) if any(map(is_staging_part, rel))]
        if staging:
            name = "/".join(parts)
            raise NameConflictError(
                f"{name} has no record and holds a write in progress "
                f"({'/'.join((*parts, *staging[0]))}): deleting it would take that write's files, "
                "so it is refused and nothing was changed (gc removes what dead writers left)",
                name=name,
            )

    def check_no_folder_write(self, parts: Parts) -> None:
        """Raise NameConflictError if a multi-writer folder write is in progress at, below or
        above the unrecorded name ``parts`` (object stores, where such a write uploads its files
        to their final keys, so deleting the name would take them: ``_hierarchy``). Storage
        with staging names: no request (:meth:`check_no_staging_below` covers it)."""
        writes = folder_writes_over(self.backend, parts)
        if writes:
            name = "/".join(parts)
            raise NameConflictError(
                f"{name} has no record and a folder write is in progress there "
                f"({shown(writes)}, begin_folder): deleting {name} would take that write's "
                "files, so it is refused and nothing was changed. Let the write commit (then "
                "delete the artifact), or abort() it; gc removes what dead writers left once "
                "they are older than min_age",
                name=name,
            )

    def complete_returned(self, parts: Parts) -> None:
        """Before a folder replace on an object store: complete a replace of ``parts`` that
        returned its record while its copies were stopped (``_stagedcopies.complete_recorded``:
        from its staged copy), so the folder holds exactly the recorded version and the files
        of the version before it that the stopped copies left are not taken for another tool's
        (:meth:`check_no_foreign_files`). Costs one stat where the record has no staged copy.

        Best effort: not done where another writer of the name may be at work or stopped after
        the record (``_stagedcopies.complete_recorded``); a copy or delete that fails is logged
        and left to gc. Either way :meth:`check_no_foreign_files` then decides as before.
        """
        for rec in self.own_records(parts).records:
            if rec.kind != "dir":
                continue
            try:
                why = _stagedcopies.complete_recorded(self.backend, rec)
            except CommitStoreError as exc:
                why = f"{type(exc).__name__}: {exc}"
            if why is not None:
                log.info("%s: the stopped replace was not completed first: %s", rec.name, why)

    def check_no_foreign_files(self, parts: Parts, intent: Record) -> None:
        """Before folder version ``intent`` replaces what ``parts`` holds (under the publish
        lock): raise NameConflictError if the folder there holds a file that no version of the
        name names (the record, the pending record, a writer's slot, ``intent`` itself): another
        tool's file, which the replace would remove with the old version's files. Nothing is
        changed; the file stays. Not checked where the name has no folder, no readable version
        (an unrecorded folder: ``overwrite=True`` replaces it, as documented), or a record that
        cannot be read (a damaged version must stay replaceable). Staging entries of writes in
        flight are not files of the folder. One walk of the folder."""
        info = self.backend.stat(parts)
        if info is None or not info.is_dir:
            return
        own = self.own_records(parts)
        if own.record_damaged:
            return  # a damaged record: its version cannot say which files are its own
        versions = list(own.records)
        if not versions:
            return
        versions += [s.stored.record for s in _slots.read_slots(self.backend, parts)]
        named = {f.path for v in (*versions, intent) if v.kind == "dir" for f in v.files}
        foreign = sorted(
            "/".join(rel)
            for rel, _ in self.backend.walk(parts)
            if not any(map(is_staging_part, rel)) and "/".join(rel) not in named
        )
        if foreign:
            name = "/".join(parts)
            raise NameConflictError(
                f"{name} holds files that no version of it names ({shown(foreign)}): another "
                "tool's files, which replacing the folder would remove, so the replace is "
                "refused and nothing was changed. Move them out of the folder (or delete the "
                f"artifact: a delete removes only the files its record names) and commit "
                "again",
                name=name,
            )

    def own_records(self, parts: Parts) -> OwnRecords:
        """The records of ``parts`` that say which files are its data: the record and the
        pending record (a commit that stopped after its data step left that version's files),
        those that can be read and name this artifact, and whether the record is there but
        damaged. A record or pending record that is missing, damaged or names another artifact
        is left out. Two small reads; nothing is changed."""
        name = "/".join(parts)
        found: list[Record] = []
        damaged = False
        for where in (record_parts(parts), intent_parts(parts)):
            try:
                rec = decode_record(self.backend.read_small(where))
            except NotFoundError:
                continue
            except (CommitStoreError, RecordFormatError):
                damaged = damaged or where == record_parts(parts)
                continue
            if rec.name == name:
                found.append(rec)
        return OwnRecords(tuple(found), damaged)

    def check_place(self, parts: Parts) -> None:
        """The name hierarchy, before a new artifact is staged at ``parts``: not inside a
        committed artifact (AlreadyExistsError) and not over a folder path that holds committed
        artifacts (NameConflictError), whatever ``overwrite`` says."""
        self.check_outside_folders(parts)
        self.check_nothing_below(parts, "committing an artifact there")

    def check_outside_folders(self, parts: Parts) -> None:
        """Raise AlreadyExistsError if a leading part of ``parts`` is a committed artifact (a
        folder or a file): a new artifact inside a committed folder artifact would change that
        folder's files under its record, and one below a committed file cannot be a file of
        its own on a file system (one record read per leading part)."""
        outer = self.outer_artifact(parts)
        if outer is not None:
            name = "/".join(parts)
            raise AlreadyExistsError(
                f"{name} would be inside the committed artifact {outer}; commit the folder "
                "again with the file in it (stage_dir(..., overwrite=True)) instead",
                name=name,
            )

    def outer_artifact(self, parts: Parts) -> str | None:
        """The committed artifact (a folder or a file) that ``parts`` lies inside, None if no
        leading part of ``parts`` has a record (one record stat per leading part)."""
        for i in range(1, len(parts)):
            try:
                if self.backend.stat(record_parts(parts[:i])) is None:
                    continue
            except CommitStoreError:
                continue
            return "/".join(parts[:i])
        return None

    def check_not_inside(self, parts: Parts, name: str) -> None:
        """Raise NameConflictError if ``parts``, which has no record of its own, lies inside a
        committed artifact (a file of a folder artifact): deleting it would change that
        artifact's files under its record."""
        try:
            self.check_outside_folders(parts)
        except AlreadyExistsError as exc:
            raise NameConflictError(
                f"{name} is inside a committed artifact and is not one of its own; delete or "
                f"replace that artifact as a whole ({exc})",
                name=name,
            ) from exc
