"""Checks of stored bytes against their records: the one comparison, and ``verify`` / ``latest``
over a store's records (read and scanned by ``_scan``).

Nothing here raises for a bad artifact: every problem becomes a :class:`VerifyResult` (or, for
reads, a :class:`Mismatch` the caller turns into an IntegrityError).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from commitstore._scan import (
    NOT_REGULAR,
    StoredRecord,
    folder_records,
    read_intent,
    read_record,
    scan_records,
    unrecorded,
)
from commitstore._slotorder import staged_order
from commitstore._slots import read_slots
from commitstore.backends import Backend, FileInfo
from commitstore.digest import hash_opened
from commitstore.errors import (
    CommitStoreError,
    ConfigurationError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
)
from commitstore.layout import Parts, aside_parts, staged_parts, validate_name
from commitstore.records import (
    Record,
    RecordFormatError,
    VerifyReport,
    VerifyResult,
    encode_record,
)

log = logging.getLogger("commitstore")

LEVELS = ("size", "full")


def check_level(level: str, *, allow_none: bool = False) -> None:
    """Raise ConfigurationError for an unknown verify level, before any I/O."""
    allowed = (*LEVELS, "none") if allow_none else LEVELS
    if level not in allowed:
        raise ConfigurationError(f"verify level must be one of {allowed}, not {level!r}")


# -- the one comparison ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Mismatch:
    """How observed bytes differ from what a record says."""

    status: Literal["size_mismatch", "hash_mismatch"]
    expected_size: int
    actual_size: int
    expected_digest: str
    actual_digest: str | None
    """None when only sizes were compared."""

    @property
    def detail(self) -> str:
        """``expected ..., found ...``, as shown in reports and errors."""
        if self.status == "size_mismatch":
            return f"expected {self.expected_size} bytes, found {self.actual_size}"
        return f"expected {self.expected_digest}, found {self.actual_digest}"

    def error(
        self, name: str, where: str = "", cls: type[IntegrityError] = IntegrityError
    ) -> IntegrityError:
        """The IntegrityError (or subclass ``cls``) for artifact ``name``; ``where`` names the
        file inside a folder artifact."""
        return cls(
            f"{name}{'/' + where if where else ''}: {self.detail}",
            name=name,
            status=self.status,
            expected_size=self.expected_size,
            actual_size=self.actual_size,
            expected_digest=self.expected_digest,
            actual_digest=self.actual_digest,
        )


def compare(
    size: int, digest: str, *, found_size: int, found_digest: str | None, level: str
) -> Mismatch | None:
    """Compare what was observed with what was recorded (``size``, ``digest``) at ``level``:
    ``"none"`` accepts anything, ``"size"`` compares sizes, ``"full"`` sizes then digests.
    A digest is compared only when one was observed."""
    if level == "none":
        return None
    if found_size != size:
        return Mismatch("size_mismatch", size, found_size, digest, found_digest)
    if level == "full" and found_digest is not None and found_digest != digest:
        return Mismatch("hash_mismatch", size, found_size, digest, found_digest)
    return None


def pending_stored(backend: Backend, record: Record) -> list[StoredRecord]:
    """The versions commits in flight (or interrupted after their data step) are publishing
    over ``record``, as stored (their exact bytes): the name's pending record, then on object
    stores each writer's (``_slots``, in listing order), those that differ from ``record``.
    This order is the one every reader resolves in (:func:`served_version`, :func:`locate`)."""
    parts = tuple(record.name.split("/"))
    found = read_intent(backend, parts)
    out = [] if found is None or found.record == record else [found]
    for slot in read_slots(backend, parts):
        if slot.stored.record != record and all(s.record != slot.stored.record for s in out):
            out.append(slot.stored)
    return out


def pending_versions(backend: Backend, record: Record) -> list[Record]:
    """The records of :func:`pending_stored`: the one place readers find pending versions."""
    return [stored.record for stored in pending_stored(backend, record)]


def pending_version(backend: Backend, record: Record) -> Record | None:
    """The first of :func:`pending_versions` (None if there is none)."""
    versions = pending_versions(backend, record)
    return versions[0] if versions else None


def served_version(
    backend: Backend,
    record: Record,
    level: str,
    *,
    size: int,
    digest: str | None,
    rehash: Callable[[], str] | None = None,
) -> Record:
    """The one resolution, for bytes a reader read (``size``, and ``digest`` when hashed):
    ``record`` if they match it at ``level``, else the first of :func:`pending_versions` (a
    file version) they match, which is then the version served, with its own step and
    metadata. :func:`locate` resolves bytes left in storage the same way.

    Below ``"full"``, bytes of the record's size while a pending version has that size too (a
    same-size overwrite that stopped after its data step) cannot be told apart by size: they
    are compared by digest then (``digest``, else ``rehash()`` of the bytes read, when given),
    so the version served is the one the bytes are, never the old record for new bytes.

    Raises:
        IntegrityError: the bytes match neither (the mismatch against ``record``).
    """
    if (
        level != "full"
        and record.kind == "file"
        and size == record.size
        and any(p.kind == "file" and p.size == size for p in pending_versions(backend, record))
    ):
        if digest is None and rehash is not None:
            digest = rehash()
        if digest is not None:
            level = "full"
    found = compare(record.size, record.digest, found_size=size, found_digest=digest, level=level)
    if found is None:
        return record
    for pending in pending_versions(backend, record):
        if pending.kind == "file" and (
            compare(pending.size, pending.digest, found_size=size, found_digest=digest, level=level)
            is None
        ):
            return pending
    raise found.error(record.name)


def stored_version(backend: Backend, stored: StoredRecord, version: Record) -> StoredRecord:
    """``version`` (one :func:`locate` or :func:`served_version` returned for ``stored``'s
    record) as stored: ``stored`` itself, or the pending record it came from (its exact bytes,
    which a copy writes as the record elsewhere), or the record as read again (the name's
    record moved on while it was checked); encoded afresh only if it is gone meanwhile."""
    if version == stored.record:
        return stored
    for pending in pending_stored(backend, stored.record):
        if pending.record == version:
            return pending
    with contextlib.suppress(RecordFormatError, CommitStoreError):
        fresh = read_record(backend, tuple(version.name.split("/")))
        if fresh is not None and fresh.record == version:
            return fresh
    return StoredRecord(encode_record(version), version)


def record_of(backend: Backend, url: str, name: str) -> StoredRecord:
    """The committed record of ``name``, for callers that need one.

    Raises:
        NotFoundError: no record. IntegrityError: the record is unreadable (``bad_record``).
    """
    parts = validate_name(name)
    try:
        found = read_record(backend, parts)
    except RecordFormatError as exc:
        raise IntegrityError(f"{name}: bad record: {exc}", name=name, status="bad_record") from exc
    if found is None:
        raise NotFoundError(f"{name} is not committed in {url}", name=name)
    return found


def verified_record(backend: Backend, url: str, name: str, level: str) -> Record:
    """The version ``name`` verifies as at ``level``: its record, or the new version of a
    commit that stopped after its data step (its pending record; a folder replace stopped among
    its copies, from its staged copy), the version every reader serves (:func:`resolve`, the one
    resolution). A folder's version is decided for the folder as a whole, never file by file.

    Raises:
        NotFoundError: no record. IntegrityError: the record is unreadable (``bad_record``), or
            the stored artifact matches neither its record nor a pending version (its status).
    """
    rec = record_of(backend, url, name).record
    result, version = resolve(backend, rec, level)
    if result.status != "ok":
        raise IntegrityError(
            f"{name}: {result.detail or result.status}", name=name, status=result.status
        )
    return version


# -- checks of one artifact ------------------------------------------------------------------
def check(backend: Backend, record: Record, level: str) -> VerifyResult:
    """Compare the stored artifact with ``record`` at ``level`` (``"size"`` or ``"full"``).

    When it does not match, a pending record of the same name (a commit whose data was
    published but whose record was not, see ``_commit``) is tried too: the name then verifies
    as that new version (the detail says so). Never both a mismatch and a match: old or new.
    """
    return resolve(backend, record, level, settle=False)[0]


def resolve(
    backend: Backend, record: Record, level: str, *, settle: bool = True
) -> tuple[VerifyResult, Record]:
    """:func:`check`, plus the version that passed it: ``record``, or the pending version.
    ``settle``: as :func:`locate`."""
    result, version, _where = locate(backend, record, level, settle=settle)
    return result, version


def same_shape(a: Record, b: Record) -> bool:
    """Whether a size-level check cannot tell ``a`` from ``b``: the same kind, and the same size
    (a file) or the same files with the same sizes (a folder). A same-size overwrite of one
    model's checkpoint is the usual case."""
    if a.kind != b.kind:
        return False
    if a.kind == "file":
        return a.size == b.size
    return sorted((f.path, f.size) for f in a.files) == sorted((f.path, f.size) for f in b.files)


PENDING_NOTE = "the new version of a commit whose record is pending"

STAGED_NOTE = (
    "the new version, from its staged copy: a folder replace stopped while copying it "
    "(gc completes it)"
)


RECHECKS = 3
"""How often a mismatch is checked again against a fresh read of the record when the record
changed meanwhile (another process overwrote the artifact during the scan); the last time under
the publish lock, so a busy writer cannot keep a check losing (where the storage has a lock)."""


PLACES = 3
"""How many (version, place) pairs one attempt of a folder's ``get_file`` (or a mirror's copy)
reads at most: the name, the staged copy of a replace, the name again once that replace deleted
its staged copy. A name overwritten faster than that is left to the caller's attempts (the last
one under the publish lock, where the storage has one)."""


def locate(
    backend: Backend, record: Record, level: str, *, settle: bool = True
) -> tuple[VerifyResult, Record, Parts]:
    """:func:`resolve`, plus where the bytes of that version are: the name itself, or the
    staged copy of an object-store folder replace that stopped while copying it
    (``backends/object/dirsink``), which then verifies as the pending version.

    ``settle`` (the version matters, not only the status): below ``"full"``, a name that
    passes as ``record`` while a pending version has the same sizes (:func:`same_shape`: a
    same-size overwrite stopped after its data step) is checked in full, so the version
    returned is the one the bytes are (one more read of the pending records at size level).

    A mismatch is an answer only if the record did not change meanwhile: a scan reads a record,
    then the data, and a concurrent overwrite may publish its data and record (and drop its
    pending record) in between. The check then runs again against the fresh record.
    """
    found = _locate_once(backend, record, level, settle)
    for attempt in range(1, RECHECKS):
        if found[0].status == "ok":
            return found
        with backend.read_lock() if attempt + 1 == RECHECKS else contextlib.nullcontext():
            try:
                fresh = read_record(backend, tuple(record.name.split("/")))
            except (RecordFormatError, CommitStoreError):
                return found
            if fresh is None or fresh.record == record:
                return found  # the record stands: so does the mismatch
            record = fresh.record
            found = _locate_once(backend, record, level, settle)
    return found


def _locate_once(
    backend: Backend, record: Record, level: str, settle: bool
) -> tuple[VerifyResult, Record, Parts]:
    parts = tuple(record.name.split("/"))
    result = check_exact(backend, record, level)
    if result.status == "ok":
        if not settle or level == "full":
            return result, record, parts
        pendings = pending_versions(backend, record)
        if not any(same_shape(p, record) for p in pendings):
            return result, record, parts
        return _locate_once(backend, record, "full", False)  # sizes cannot tell them apart
    pendings = pending_versions(backend, record)
    if result.status == "missing" and (moved := _aside(backend, record, pendings, level)):
        return moved
    for pending in pendings:
        if check_exact(backend, pending, level).status == "ok":
            return VerifyResult(record.name, "ok", PENDING_NOTE), pending, parts
    # the record itself too: a replace that stopped among its copies after the staged copy
    # was whole returns its record and leaves its slot (equal to the record) naming the copy
    for version in staged_order(backend, record, pendings):
        if version.kind == "dir" and version.files:
            staged = staged_parts(parts, version.digest)
            if _check_dir(backend, staged, version, level).status == "ok":
                return VerifyResult(record.name, "ok", STAGED_NOTE), version, staged
            # a replace going on deletes its staged copy only once the final keys hold that
            # version: gone since the name was checked, the name may hold it now
            if (
                version is not record
                and backend.stat(staged) is None
                and check_exact(backend, version, level).status == "ok"
            ):
                return VerifyResult(record.name, "ok", PENDING_NOTE), version, parts
    return result, record, parts


ASIDE_NOTE = (
    "the {} version, moved aside by a replace that stopped before the new one was in "
    "(gc or the next replace moves it back)"
)


def _aside(
    backend: Backend, record: Record, pendings: list[Record], level: str
) -> tuple[VerifyResult, Record, Parts] | None:
    """The name is missing: the version a stopped move-aside replace (``backends/rename/
    aside.py``) left under the name's aside entry, if it verifies as ``record`` (the old
    version) or one of ``pendings`` (in order). Only rename-family storage has aside entries."""
    parts = tuple(record.name.split("/"))
    if not backend.capabilities.staging_names or backend.stat(parts) is not None:
        return None
    where = aside_parts(parts)
    for version, which in ((record, "old"), *((p, "new") for p in pendings)):
        if check_at(backend, version, where, level).status == "ok":
            return VerifyResult(record.name, "ok", ASIDE_NOTE.format(which)), version, where
    return None


def check_exact(backend: Backend, record: Record, level: str) -> VerifyResult:
    """:func:`check` against ``record`` alone (no pending version considered)."""
    return check_at(backend, record, tuple(record.name.split("/")), level)


def check_at(backend: Backend, record: Record, parts: Parts, level: str) -> VerifyResult:
    """:func:`check_exact` of the bytes stored at ``parts`` (the name, or where a stopped
    replace left that version: its aside entry)."""
    if record.kind == "dir":
        return _check_dir(backend, parts, record, level)
    info = backend.stat(parts)
    if info is None:
        return VerifyResult(record.name, "missing", "no data under this name")
    if info.is_dir:
        return VerifyResult(
            record.name, "size_mismatch", "a folder stands where a file was recorded"
        )
    if not info.regular:
        return VerifyResult(record.name, "size_mismatch", NOT_REGULAR)
    problem = _compare_file(backend, parts, (record.size, record.digest), info, level)
    if problem == MISSING:
        return VerifyResult(record.name, "missing", "no data under this name")
    if problem == NOT_A_FILE:
        return VerifyResult(record.name, "size_mismatch", NOT_REGULAR)
    if isinstance(problem, Mismatch):
        return VerifyResult(record.name, problem.status, problem.detail)
    return VerifyResult(record.name, "ok")


MISSING, NOT_A_FILE = "missing", "not a file"
"""What :func:`_compare_file` returns when the bytes could not be read: gone since the listing,
or replaced by a symlink or special file since then."""


def _compare_file(
    backend: Backend, parts: Parts, expected: tuple[int, str], info: FileInfo, level: str
) -> Mismatch | str | None:
    """Sizes from ``info`` first; at ``"full"`` the bytes are read and hashed. A str: MISSING
    or NOT_A_FILE."""
    size, digest = expected
    problem = compare(size, digest, found_size=info.size, found_digest=None, level=level)
    if problem is not None or level != "full":
        return problem
    try:
        with backend.open_read(parts) as f:
            found_size, found_digest = hash_opened(f)
    except NotFoundError:
        return MISSING
    except (IntegrityError, InvalidNameError):  # replaced by a symlink or FIFO since the stat
        return NOT_A_FILE
    return compare(size, digest, found_size=found_size, found_digest=found_digest, level=level)


def folder_problem(backend: Backend, parts: Parts, record: Record) -> VerifyResult | None:
    """Whether folder version ``record``, stored at ``parts``, has a folder there at all: the
    failing result (``missing``: nothing there; ``size_mismatch``: a file or something else
    stands there), or None. The one check of the folder itself that ``verify`` makes and that
    every reader of a folder artifact (``get_file``, a mirror's copy) makes before its files:
    an empty folder artifact has no file whose absence would tell."""
    if not record.files and not backend.capabilities.empty_folders:
        return None  # nothing to check: the storage has no folders
    info = backend.stat(parts)
    if info is None:
        return VerifyResult(record.name, "missing", "no folder under this name")
    if not info.is_dir:
        return VerifyResult(
            record.name,
            "size_mismatch",
            NOT_REGULAR if not info.regular else "a file stands where a folder was recorded",
        )
    return None


def folder_files(
    backend: Backend, parts: Parts, record: Record
) -> VerifyResult | dict[str, FileInfo]:
    """Whether the folder at ``parts`` holds exactly the files of folder version ``record``:
    the failing result (:func:`folder_problem`; ``size_mismatch`` for a link or special file
    below it, or a file the record does not list; ``missing`` for a listed file that is not
    there), or each listed file's info, from one walk. Sizes and bytes are not compared here.
    The check of a folder's file set that ``verify`` makes and that every reader of a folder
    artifact (``get_file``, a mirror's copy) makes before it reads a byte: the files under a
    folder replace stopped among its copies are the old version's plus what the new one added,
    and only the unlisted file tells them from the old version, so a reader that checked only
    the listed files would serve the old version where ``verify`` and ``latest`` name the new
    one (from its staged copy)."""
    if not record.files and not backend.capabilities.empty_folders:
        return {}  # nothing to check: the storage has no folders
    not_a_folder = folder_problem(backend, parts, record)
    if not_a_folder is not None:
        return not_a_folder
    found = {"/".join(rel): fi for rel, fi in backend.walk(parts)}
    odd = sorted(path for path, fi in found.items() if not fi.regular)
    if odd:
        return VerifyResult(record.name, "size_mismatch", f"{odd[0]}: {NOT_REGULAR}")
    infos = {}
    for entry in record.files:
        fi = found.pop(entry.path, None)
        if fi is None:
            return VerifyResult(record.name, "missing", f"file {entry.path!r} is missing")
        infos[entry.path] = fi
    if found:
        extra = sorted(found)[0]
        return VerifyResult(
            record.name, "size_mismatch", f"unrecorded file {extra!r} in the folder"
        )
    return infos


def _check_dir(backend: Backend, parts: Parts, record: Record, level: str) -> VerifyResult:
    infos = folder_files(backend, parts, record)
    if isinstance(infos, VerifyResult):
        return infos
    for current in ("size", level) if level == "full" else ("size",):
        for entry in record.files:
            fparts = (*parts, *entry.path.split("/"))
            problem = _compare_file(
                backend, fparts, (entry.size, entry.digest), infos[entry.path], current
            )
            if problem == MISSING:
                return VerifyResult(record.name, "missing", f"file {entry.path!r} is missing")
            if problem == NOT_A_FILE:
                return VerifyResult(record.name, "size_mismatch", f"{entry.path}: {NOT_REGULAR}")
            if isinstance(problem, Mismatch):
                return VerifyResult(record.name, problem.status, f"{entry.path}: {problem.detail}")
    return VerifyResult(record.name, "ok")


# -- whole-store answers ---------------------------------------------------------------------
def verify(backend: Backend, name: str | None, level: str) -> VerifyReport:
    """Check one artifact or every artifact (plus ``no_record`` for unrecorded data)."""
    if name is not None:
        parts = validate_name(name)
        try:
            found = read_record(backend, parts)
        except RecordFormatError as exc:
            return VerifyReport((VerifyResult(name, "bad_record", str(exc)),))
        if found is None:
            if backend.stat(parts) is not None:
                return VerifyReport((VerifyResult(name, "no_record", _unrecorded(backend, name)),))
            return VerifyReport((VerifyResult(name, "missing", "nothing under this name"),))
        return VerifyReport((check(backend, found.record, level),))
    records, bad = scan_records(backend)
    named = {b.name for b in bad}
    bad += [b for b in folder_records(backend) if b.name not in named]
    results = [check(backend, r, level) for r in records] + bad
    results += [_unclaimed(backend, n) for n in unrecorded(backend, records, bad)]
    return VerifyReport(tuple(sorted(results, key=lambda r: r.name)))


def _unclaimed(backend: Backend, name: str) -> VerifyResult:
    """Data ``name`` that no scanned record claims: ``bad_record`` where a read of its record
    says so (the way to it is damaged: a folder of the records tree, or the records folder,
    replaced by a symlink or a file, which the scan cannot see past), else ``no_record``."""
    try:
        read_record(backend, validate_name(name))
    except RecordFormatError as exc:
        return VerifyResult(name, "bad_record", str(exc))
    except InvalidNameError:
        pass
    return VerifyResult(name, "no_record", _unrecorded(backend, name))


def _unrecorded(backend: Backend, name: str) -> str:
    try:
        pending = read_intent(backend, validate_name(name))
    except InvalidNameError:
        pending = None
    if pending is None:
        return "data without a record"
    return "data without a record; a commit of it stopped after its data step (gc completes it)"
