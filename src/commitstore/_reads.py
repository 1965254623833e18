"""The reading half of :class:`CommitStore`: records, listing, verification, resume and reads.

Every method here reads; none writes. Bad artifacts are reported (``verify``), skipped with a
warning (``latest``) or refused with IntegrityError (reads), never handed out.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from commitstore import _read
from commitstore._check import check, check_level, read_record, scan_records, sort_key, unrecorded
from commitstore.errors import IntegrityError, InvalidNameError, NotFoundError
from commitstore.layout import validate_name
from commitstore.mirrors.sync import latest_any
from commitstore.records import Record, RecordFormatError, VerifyReport, VerifyResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from commitstore.backends import Backend
    from commitstore.store import CommitStore

log = logging.getLogger("commitstore")


class Reads:
    """Mixed into :class:`CommitStore`."""

    backend: Backend
    url: str

    @property
    def mirrors(self) -> list[CommitStore]:
        """The mirror stores (defined by CommitStore)."""
        raise NotImplementedError

    def record(self, name: str) -> Record:
        """The committed record of ``name``.

        Raises:
            NotFoundError: no record. IntegrityError: the record is unreadable (``bad_record``).
        """
        parts = validate_name(name)
        try:
            rec = read_record(self.backend, parts)
        except RecordFormatError as exc:
            raise IntegrityError(
                f"{name}: bad record: {exc}", name=name, status="bad_record"
            ) from exc
        if rec is None:
            raise NotFoundError(f"{name} is not committed in {self.url}", name=name)
        return rec

    def list(self) -> list[Record]:
        """Committed artifacts (valid records only), oldest to newest by step."""
        records, _bad = scan_records(self.backend)
        return sorted(records, key=sort_key)

    def verify(self, name: str | None = None, *, level: str = "full") -> VerifyReport:
        """Check one artifact or all against their records; never raises for a bad artifact.

        ``level="size"`` compares sizes; ``"full"`` also recomputes digests. Unrecorded files
        under the root are reported as ``no_record`` (they do not make the report fail).
        """
        check_level(level)
        if name is not None:
            parts = validate_name(name)
            try:
                rec = read_record(self.backend, parts)
            except RecordFormatError as exc:
                return VerifyReport((VerifyResult(name, "bad_record", str(exc)),))
            if rec is None:
                if self.backend.stat(parts) is not None:
                    return VerifyReport((VerifyResult(name, "no_record", "data without a record"),))
                return VerifyReport((VerifyResult(name, "missing", "nothing under this name"),))
            return VerifyReport((check(self.backend, rec, level),))
        records, bad = scan_records(self.backend)
        results = [check(self.backend, r, level) for r in records] + bad
        results += [
            VerifyResult(n, "no_record", "data without a record")
            for n in unrecorded(self.backend, records, bad)
        ]
        return VerifyReport(tuple(sorted(results, key=lambda r: r.name)))

    def latest(self, *, level: str = "full", source: str = "primary") -> Record | None:
        """The newest artifact that passes :meth:`verify` at ``level``; each one skipped is logged
        as a warning. None if there is none. ``source="any"`` also considers the mirrors (the
        newest artifact whole on any store; ``restore`` brings it back to the primary)."""
        check_level(level)
        if source not in ("primary", "any"):
            raise InvalidNameError(f"source must be 'primary' or 'any', not {source!r}")
        if source == "any":
            return latest_any([self, *self.mirrors], level)
        records, bad = scan_records(self.backend)
        for b in bad:
            log.warning("latest: skipping %s: bad_record (%s)", b.name, b.detail)
        for rec in sorted(records, key=sort_key, reverse=True):
            result = check(self.backend, rec, level)
            if result.status == "ok":
                return rec
            log.warning("latest: skipping %s: %s (%s)", rec.name, result.status, result.detail)
        return None

    def open(self, name: str, *, verify: str = "full") -> _read.VerifiedFile:
        """A readable, seekable binary file of ``name`` whose bytes passed the check first.

        Raises:
            NotFoundError: not committed. IntegrityError: the bytes fail the check.
        """
        check_level(verify, allow_none=True)
        return _read.open_verified(self, name, verify)

    def read_bytes(self, name: str, *, verify: str = "full") -> bytes:
        """All bytes of ``name``, read once and checked before they are returned."""
        check_level(verify, allow_none=True)
        return _read.read_verified(self, name, verify)

    def get_file(
        self,
        name: str,
        local_path: str | os.PathLike[str],
        *,
        verify: str = "full",
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Copy ``name`` to ``local_path`` with the local commit protocol; the local file appears
        only if the bytes matched the record (folder artifacts: the whole folder)."""
        check_level(verify, allow_none=True)
        _read.get_verified(self, name, Path(local_path), verify, progress)
