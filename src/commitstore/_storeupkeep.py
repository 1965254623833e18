"""The methods of the facade (``CommitStore``) that keep storage bounded: prune (on the primary and
every mirror), gc and adopt (``maintenance/``), each argument checked before any I/O."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from commitstore._commit import check_flag
from commitstore._storebase import StoreBase
from commitstore.layout import validate_name
from commitstore.maintenance.adopt import AdoptReport, adopt
from commitstore.maintenance.gc import GcReport, collect
from commitstore.maintenance.prune import PruneReport, prune
from commitstore.maintenance.retention import Retention, check_age, check_keep

log = logging.getLogger("commitstore")


class StoreUpkeep(StoreBase):
    """Keeping storage bounded, for :class:`~commitstore.CommitStore`."""

    def prune(
        self,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep: Sequence[str] = (),
        min_age: float = 300,
        dry_run: bool = False,
    ) -> PruneReport:
        """Delete committed artifacts outside the keep-set, on the primary and every mirror.

        The keep-set (``keep_last`` newest, every step multiple of ``keep_every``, names in
        ``keep``) is computed over the whole artifacts of all targets (the union of names) and
        applies to every target. Never deleted: anything modified less than ``min_age`` seconds
        ago, anything whose modification time is unknown or zero, the newest artifact that
        verifies fully (hashed, newest first) on each target and anything newer than it, anything
        whose replication to that target is pending, anything without a record. Each delete
        re-checks, under the publish lock, that the record is still the one planned and the age
        still ``>= min_age`` (else it is skipped, with the reason). Deletion removes the record
        first. Idempotent; safe to run from two processes at once. A mirror that cannot be
        reached is left out and reported (``report.errors``, ``TargetPrune.error``, a warning in
        the log); the primary and the reachable mirrors are pruned all the same.

        Raises:
            ConfigurationError: a negative count, a bad ``min_age``, or ``keep`` given as one
                string or holding a non-string. InvalidNameError: a bad name in ``keep``.
                StorageError, BackendUnavailableError: the primary failed.
        """
        policy = Retention(keep_last, keep_every, check_keep(keep), check_age(min_age))
        check_flag(dry_run, "dry_run")
        for name in keep:
            validate_name(name)
        return self._prune(policy, dry_run=dry_run)

    def _prune(self, policy: Retention, *, dry_run: bool) -> PruneReport:
        pending = self._replicator.pending() if self._replicator is not None else {}
        targets = [self._committer, *(m._committer for m in self._mirrors)]
        return prune(targets, policy, pending=pending, dry_run=dry_run)

    def adopt(self, name: str | None = None, *, trust: bool = False) -> AdoptReport:
        """Write records for files that have none (checkpoints written before commitstore), after
        a structural check: a torch ``.pt``/zip needs an intact end-of-central-directory with
        every member inside the file, a ``.safetensors`` a parseable header whose data offsets fit.
        Truncated files are reported, never adopted; unknown formats only with ``trust=True``."""
        if name is not None:
            validate_name(name)
        return adopt(self._committer, name, trust=check_flag(trust, "trust"))

    def gc(self, *, min_age: float = 3600, dry_run: bool = False) -> GcReport:
        """Remove what dead writers left: staging files and folders, and (object stores)
        unfinished multipart uploads, older than ``min_age`` seconds.

        Only entries whose own name is a staging name, outside every committed folder artifact;
        never a committed artifact, a record, or anything outside the store's root. A staging
        folder is aged by the newest mtime and ctime of everything in it (empty ones by their
        own); anything younger than ``min_age`` or of unknown age is kept and reported.
        Idempotent.
        With ``dry_run=True`` nothing is removed; ``removed`` lists what would be.
        """
        report = collect(
            self._backend, min_age=check_age(min_age), dry_run=check_flag(dry_run, "dry_run")
        )
        for item in report.removed:
            log.info(
                "gc: %s %s on %s (%s)",
                "would remove" if dry_run else "removed",
                item.path,
                self.url,
                item.kind,
            )
        if report.removed and not dry_run:  # deletions are seen at the default level
            log.warning("gc: removed %d staging entries from %s", len(report.removed), self.url)
        return report
