"""Deletes through the commit path: under the publish lock, the pending record first, then the
record, then exactly the files they name, never reaching into another artifact or a write in
progress (the checks of ``_namechecks``)."""

from __future__ import annotations

from collections.abc import Callable

from commitstore import _slots, _stagedcopies
from commitstore._hierarchy import remove_data
from commitstore._namechecks import NameChecks
from commitstore._slotorder import superseded_slots
from commitstore.errors import NotFoundError
from commitstore.layout import intent_parts, record_parts, validate_name


class Deletes(NameChecks):
    """The deletes of :class:`~commitstore._commit.Committer`: record first, then the data the
    records name."""

    def delete_if(self, name: str, still: Callable[[], str | None]) -> str | None:
        """Like :meth:`delete`, but only if ``still()``, called under the publish lock just
        before the removal, returns None; otherwise nothing is removed and its reason returned.
        (Where the backend's lock holds nothing, as on object stores, the re-check narrows the
        race to its own few requests but cannot close it.)

        Raises:
            NotFoundError: neither record nor data existed.
            NameConflictError: committed artifacts sit below ``name`` and it is not a file
                artifact of its own, or ``name`` has no record and lies inside a committed
                artifact (nothing removed).
        """
        parts = validate_name(name)
        with self.backend.publish_lock():
            reason = still()
            if reason is not None:
                return reason
            owns = list(self.own_records(parts).records)
            if not owns or any(r.kind == "dir" for r in owns):
                self.check_nothing_below(parts, f"deleting {name}")
            if not owns:
                self.check_not_inside(parts, name)
                self.check_no_staging_below(parts)
                self.check_no_folder_write(parts)
            # the pending record first: one left behind (an earlier commit stopped after its
            # record step, or a removal a power loss undid) matches the data, and with the
            # record gone it would make gc restore the artifact a delete stopped halfway through
            self.backend.remove(intent_parts(parts))
            folders = [r for r in owns if r.kind == "dir"]
            for rec in folders if _slots.uses_slots(self.backend) else ():
                # object stores: a replace that returned its record while its copies were
                # stopped is completed first (so the name holds exactly its files, no file of
                # the version before it left behind), and its writer's slot, like the slots of
                # writers dead before it, goes before the record: left, gc would roll a staged
                # copy forward over the deleted name and bring it back
                _stagedcopies.complete_recorded(self.backend, rec)
                for slot in superseded_slots(self.backend, rec):
                    self.backend.remove(slot)
            had_record = self.backend.remove(record_parts(parts))
            had_data = remove_data(self.backend, parts, owns)
        if not (had_record or had_data):
            raise NotFoundError(f"{name} does not exist", name=name)
        return None

    def delete(self, name: str) -> None:
        """Remove the record first, then the data: a crash between leaves nothing claiming to be
        whole. The data removed is exactly what the record names (a folder: its listed files,
        then the folders that leaves empty; ``_hierarchy.remove_data``). A folder path that holds
        other committed artifacts is refused (NameConflictError), nothing removed. Raises
        NotFoundError if neither record nor data exists."""
        self.delete_if(name, lambda: None)
