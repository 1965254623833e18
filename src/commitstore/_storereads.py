"""The reading and checking methods of the facade (``CommitStore``): records, listings, verify,
latest, and reads that never hand out a byte failing its check (``_read``, ``_fetch``,
``_foldermembers``), each argument checked before any I/O."""

from __future__ import annotations

import builtins
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from commitstore import _destination, _fetch, _foldermembers, _newest, _read, _scan, _verify
from commitstore._commit import check_flag
from commitstore._order import arrange_records
from commitstore._storebase import Progress, StoreBase
from commitstore.errors import ConfigurationError
from commitstore.layout import validate_name
from commitstore.mirrors.sync import latest_any
from commitstore.options import Level, ReadLevel, Source
from commitstore.records import Record, VerifyReport, VerifyResult

log = logging.getLogger("commitstore")


class StoreReads(StoreBase):
    """Reading and checking, for :class:`~commitstore.CommitStore`."""

    def _nothing_found(self) -> None:
        """After a read found nothing: warn (``UserWarning`` and log) when the store's root does
        not exist, so a mistyped URL is never taken for an empty store. Creates nothing.
        Quiet where the caller has its own answer for "not there" (the ``commit://`` file
        system probes folders as stores and answers FileNotFoundError)."""
        if not self.warn_missing or self._backend.root_exists():
            return
        msg = (
            f"no store at {self.url}: its root does not exist (nothing was created; "
            "open_store(url, create=False) raises NotFoundError instead)"
        )
        log.warning("%s", msg)
        warnings.warn(msg, UserWarning, stacklevel=3)

    def record(self, name: str, *, level: Level | None = None) -> Record:
        """The committed record of ``name``, as stored (one record read).

        With ``level`` (``"size"`` or ``"full"``): the version ``name`` verifies as at that
        level instead, checked now: the record, or the new version of a commit that stopped
        after its data step (its pending record, which every reader serves and gc makes the
        record). Use it before reading members of a folder artifact with :meth:`read_member` /
        :meth:`open_member`, which check against exactly the record they are given.

        Raises:
            NotFoundError: no record. IntegrityError: the record is unreadable (``bad_record``),
                or (with ``level``) the artifact matches neither its record nor a pending
                version (``missing``, ``size_mismatch``, ``hash_mismatch``).
            ConfigurationError: an unknown ``level``, before any I/O.
        """
        if level is None:
            return _verify.record_of(self._backend, self.url, name).record
        _verify.check_level(level)
        return _verify.verified_record(self._backend, self.url, name, level)

    def list(self) -> list[Record]:
        """Committed artifacts (valid records only), oldest to newest: by step; artifacts without
        one by commit time, placed among the stepped ones by it (``docs/format.md``). Empty
        where the store's root does not exist, with a ``UserWarning`` saying so."""
        records = _scan.list_records(self._backend)
        if not records:
            self._nothing_found()
        return records

    def verify(self, name: str | None = None, *, level: Level = "full") -> VerifyReport:
        """Check one artifact or all against their records; never raises for a bad artifact.

        ``level="size"`` compares sizes; ``"full"`` also recomputes digests. Unrecorded files
        under the root are reported as ``no_record`` (they do not make the report fail).
        Where the store's root does not exist, the (empty) report comes with a ``UserWarning``.
        """
        _verify.check_level(level)
        report = _verify.verify(self._backend, name, level)
        if not report.results or all(r.status == "missing" for r in report.results):
            self._nothing_found()
        return report

    def latest(self, *, level: Level = "full", source: Source = "primary") -> Record | None:
        """The newest artifact that passes :meth:`verify` at ``level``; each one skipped is logged
        as a warning. None if there is none. ``source="any"`` also considers the mirrors (the
        newest artifact whole on any store; ``restore`` brings it back to the primary). None
        with a ``UserWarning`` where the store's root does not exist."""
        _verify.check_level(level)
        if source not in ("primary", "any"):
            raise ConfigurationError(f"source must be 'primary' or 'any', not {source!r}")
        if source == "any":
            found = latest_any([self._committer, *(m._committer for m in self._mirrors)], level)
        else:
            found = _newest.latest(self._backend, level)
        if found is None:
            self._nothing_found()
        return found

    def newest(self, *, level: Level = "size") -> Iterator[Record]:
        """The artifacts that pass :meth:`verify` at ``level``, newest first, each as the
        record of the version its name verifies as (a name a commit stopped after its data
        step ranks by that new version, with its step; see :meth:`latest`); each name is
        checked when it is reached, and one that fails is logged and skipped. The resume
        order of the integrations: take the first that loads, fall back to the next. Like
        :meth:`list`, never an in-flight commit's name that has no record yet.

        Raises:
            ConfigurationError: an unknown ``level``, before any I/O.
        """
        _verify.check_level(level)
        return self._newest(level)

    def _newest(self, level: str) -> Iterator[Record]:
        found = False
        for result, version in _newest.newest(self._backend, level):
            if result.status == "ok":
                found = True
                yield version
            else:
                log.warning(
                    "newest: skipping %s: %s (%s)", version.name, result.status, result.detail
                )
        if not found:
            self._nothing_found()

    def open(self, name: str, *, verify: ReadLevel = "full") -> _read.VerifiedFile:
        """A readable, seekable binary file of ``name`` whose bytes passed the check first.

        Raises:
            NotFoundError: not committed. IntegrityError: the bytes fail the check.
        """
        _verify.check_level(verify, allow_none=True)
        return _read.open_verified(self._backend, self.url, name, verify)

    def read_bytes(self, name: str, *, verify: ReadLevel = "full") -> bytes:
        """All bytes of ``name``, read once and checked before they are returned."""
        _verify.check_level(verify, allow_none=True)
        return _read.read_verified(self._backend, self.url, name, verify)

    def get_file(
        self,
        name: str,
        local_path: str | os.PathLike[str],
        *,
        verify: ReadLevel = "full",
        progress: Progress | None = None,
    ) -> None:
        """Copy ``name`` to ``local_path`` with the local commit protocol; the local file appears
        only if the bytes matched the record (folder artifacts: the whole folder).

        Raises:
            InvalidNameError: a bad name, before any I/O.
            ConfigurationError: ``local_path`` is empty, holds a NUL or is not a path, before
                any I/O.
            NameConflictError: ``local_path`` lies inside this store's own folder (a local
                store; checked before any I/O), is an existing local folder's name for the
                copy, a FIFO, socket or device (never replaced nor written into), or a file a
                folder artifact would replace: nothing was changed.
        """
        validate_name(name)
        dest = _destination.local_path_argument(local_path)
        _verify.check_level(verify, allow_none=True)
        _read.get_verified(
            self._backend, self.url, name, dest=dest, level=verify, progress=progress
        )

    def fetch(
        self, name: str, cache_dir: str | os.PathLike[str] | None = None, *, rehash: bool = False
    ) -> Path:
        """A verified local copy of ``name`` (a file artifact), cached by digest in ``cache_dir``
        (default ``$COMMITSTORE_CACHE_DIR`` or ``~/.cache/commitstore/fetch``): one read of
        the artifact, hashed on the way, published with the local commit protocol only if it
        matches the record (or the pending version the name verifies as, after a commit that
        stopped between its data and record steps: that version is cached). A cached copy of
        the same version (name from the digest, regular file, recorded size) is returned
        without reading the artifact; ``rehash=True`` hashes it again. Map it with
        ``torch.load(path, mmap=True)``.

        Raises:
            InvalidNameError: a bad name, before any I/O.
            ConfigurationError: a bad ``cache_dir`` (also one inside this store's own
                folder, before any I/O) or ``rehash``, or a folder artifact.
            NotFoundError: ``name`` is not committed.
            IntegrityError: the bytes fail their record (nothing is cached).
        """
        validate_name(name)
        folder = _fetch.check_cache_dir(cache_dir)
        check_flag(rehash, "rehash")
        return _fetch.fetch(self._backend, self.url, name, folder, rehash=rehash)[0]

    # -- reads that also return the version read (for integrations) ---------------------------
    def read_with_record(self, name: str, *, verify: Level = "full") -> tuple[bytes, Record]:
        """:meth:`read_bytes` (``verify`` ``"size"`` or ``"full"``), and the record of the
        version the bytes are: the name's record, or the pending version they match (a commit
        stopped after its data step), with its own step and metadata.

        Raises:
            InvalidNameError, ConfigurationError: a bad name or level, before any I/O.
            NotFoundError: not committed. IntegrityError: the bytes fail the check.
            ConfigurationError: a folder artifact.
        """
        validate_name(name)
        _verify.check_level(verify)
        return _read.read_with_record(self._backend, self.url, name, verify)

    def fetch_with_record(
        self, name: str, cache_dir: str | os.PathLike[str] | None = None, *, rehash: bool = False
    ) -> tuple[Path, Record]:
        """:meth:`fetch`, and the record of the version the cached copy holds (the name's
        record, or the pending version it verifies as). Same checks and errors as
        :meth:`fetch`."""
        validate_name(name)
        folder = _fetch.check_cache_dir(cache_dir)
        check_flag(rehash, "rehash")
        return _fetch.fetch(self._backend, self.url, name, folder, rehash=rehash)

    def read_member(self, record: Record, path: str) -> bytes:
        """All bytes of the file ``path`` (relative, ``/``-separated) of the committed folder
        artifact ``record`` (from :meth:`record` or :meth:`list`), read once and checked
        against its entry in that record (size and full digest).

        Raises:
            NotFoundError: the record lists no such file. IntegrityError: missing, truncated
                or changed bytes.
        """
        return _foldermembers.read_member(self._committer, record, path)

    def scan(self) -> tuple[builtins.list[Record], builtins.list[VerifyResult]]:
        """Every committed record, oldest to newest (as :meth:`list`), and a ``bad_record``
        :class:`~commitstore.VerifyResult` for every record file that cannot be read (which
        :meth:`list` leaves out). No warning where the store's root does not exist: both lists
        are empty."""
        good, bad = _scan.scan_records(self._backend)
        return arrange_records(good), bad

    def open_member(self, record: Record, path: str) -> BinaryIO:
        """The file ``path`` of the committed folder artifact ``record``, as a readable,
        seekable binary file: hashed whole and checked against its entry in that record (size
        and full digest) before any byte is handed out, then rewound.

        Raises:
            NotFoundError: the record lists no such file. IntegrityError: missing, truncated
                or changed bytes.
        """
        return _foldermembers.open_member(self._committer, record, path)
