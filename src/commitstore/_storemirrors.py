"""The mirror methods of :class:`commitstore.CommitStore` (waiting for replication, status,
sync, restore): each hands the call to ``mirrors/`` with the committers of the store and of its
mirrors. The facade inherits them; they use only its committer, mirrors and replicator."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from commitstore._commit import check_flag
from commitstore.layout import validate_name
from commitstore.mirrors.replicator import MirrorState, Replicator
from commitstore.mirrors.sync import SyncReport, restore, sync_mirrors
from commitstore.records import Record

if TYPE_CHECKING:
    from commitstore._background import BackgroundCommits
    from commitstore._commit import Committer
    from commitstore.store import CommitStore


class MirrorMethods:
    """The mirror half of the facade (set by ``CommitStore.__init__``)."""

    committer: Committer
    replicator: Replicator | None
    _background: BackgroundCommits | None
    _mirrors: Sequence[CommitStore]

    def close(self) -> None:
        """Wait for asynchronous commits (``commit_async``), then for background replication,
        then stop both. Idempotent. Replication is stopped even if a commit failed.

        Raises:
            CommitStoreError: an asynchronous commit failed and the failure was not observed.
            MirrorError: under ``mirror_policy="required"``, if a mirror failed.
        """
        try:
            if self._background is not None:
                self._background.close()
        finally:
            if self.replicator is not None:
                self.replicator.close()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every asynchronous commit ended, then until every queued artifact reached
        every mirror (or failed there); ``timeout`` bounds the whole wait.

        Raises:
            CommitStoreError: an asynchronous commit failed and the failure was not observed.
            MirrorError: under ``mirror_policy="required"``, if a mirror failed.
            TimeoutError: ``timeout`` seconds passed first.
        """
        end = None if timeout is None else time.monotonic() + timeout
        if self._background is not None:
            self._background.flush(timeout)
        if self.replicator is not None:
            self.replicator.flush(None if end is None else max(0.0, end - time.monotonic()))

    @property
    def mirrors(self) -> list[CommitStore]:
        """The mirror stores, in the order given."""
        return list(self._mirrors)

    def mirror_status(self) -> list[MirrorState]:
        """Per mirror, in the order given: whether it could be listed now (``reachable``), the
        last error (the listing's when it could not be), pending and failed replications, the
        primary artifacts it lacks, and the copies it is owed (count, bytes, oldest age).

        Never raises for a mirror's state: a mirror that is down, refuses or times out is
        reported ``reachable=False``. Lists the primary once and every mirror once.

        Raises:
            BackendUnavailableError, StorageError: the primary itself could not be listed.
        """
        return self.replicator.status() if self.replicator else []

    def sync(self, *, repair: bool = True) -> SyncReport:
        """Copy to every mirror what it lacks and, with ``repair``, replace copies that fail
        verification. Never deletes on a mirror; artifacts only the mirror has are reported.
        A primary artifact that fails its own check is never copied. Idempotent."""
        self.flush()
        repair = check_flag(repair, "repair")
        report = sync_mirrors(self.committer, [m.committer for m in self._mirrors], repair=repair)
        if self.replicator is not None:  # what sync made whole is no longer owed
            for m in report.mirrors:
                self.replicator.settled(m.url, {*m.copied, *m.repaired, *m.ok})
        return report

    def restore(
        self, name: str, *, source: CommitStore | None = None, overwrite: bool = False
    ) -> Record:
        """Copy a verified mirror copy of ``name`` (from ``source``, or the first mirror that
        has a whole one) back to the primary, through the primary's commit protocol.

        Copies only where nothing is lost: the primary's copy is missing or fails its full
        check, or verifies as a version whose record is byte-identical to the mirror's. A mirror
        copy that verifies as a pending version (a commit stopped after its data step) is
        restored as that version, its pending record written as the primary's record. A
        different primary version that verifies is kept unless ``overwrite=True``.

        Raises:
            NotFoundError: no mirror holds a whole copy.
            AlreadyExistsError: the primary holds a different version that verifies (the message
                says which is newer by record ``created``), or one was committed meanwhile.
        """
        validate_name(name)
        sources = [source] if source is not None else self._mirrors
        return restore(self.committer, [m.committer for m in sources], name, overwrite=overwrite)
