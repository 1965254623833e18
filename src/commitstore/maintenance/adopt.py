"""Adoption of artifacts written before commitstore (no records): structural checks, then records.

A torch ``.pt`` (a zip) is whole when its end-of-central-directory record is intact and every
member's local header and data fit in the file; a ``.safetensors`` file when its JSON header parses
and every tensor's data offsets fit in the file; a ``.json`` file when it parses. Truncated files
are reported, never adopted. Unknown formats are adopted only with ``trust=True``.

Folders (a Hugging Face ``checkpoint-N``, a DCP folder) are adopted as one folder artifact: every
file in it passes its check (a single failing or unknown-format file rejects the whole folder,
with its path in the reason), and the listing must be the same after hashing as before. With
``name=None``, unrecorded files below a folder named ``checkpoint-N`` are adopted as that folder.
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

from commitstore._commit import Committer
from commitstore._hierarchy import shown
from commitstore._scan import scan_records, unrecorded
from commitstore._slots import read_slots, uses_slots
from commitstore._small import put_small
from commitstore._verify import check_exact
from commitstore.backends import Backend, FileInfo, PutMode
from commitstore.digest import hash_stream, manifest_digest
from commitstore.errors import (
    AlreadyExistsError,
    CommitStoreError,
    IntegrityError,
    InvalidNameError,
    NameConflictError,
    NotFoundError,
)
from commitstore.layout import (
    FOLDERS_DIR,
    META_DIR,
    PENDING_DIR,
    RECORDS_DIR,
    Parts,
    infer_step,
    is_aside_part,
    is_intent_leaf,
    is_slot_leaf,
    is_staging_part,
    name_from_record_parts,
    record_of_intent,
    record_parts,
    validate_name,
)
from commitstore.records import FileRecord, Record, RecordFormatError, decode_record, encode_record

ZIP_SUFFIXES = (".pt", ".pth", ".ckpt", ".zip", ".bin")
EOCD = b"PK\x05\x06"
EOCD_MIN = 22
MAX_COMMENT = 65535
MAX_CENTRAL_DIRECTORY = 64 * 1024 * 1024
"""A zip whose central directory is larger is not checked (about 600,000 members)."""
MAX_SAFETENSORS_HEADER = 100 * 1000 * 1000
"""The safetensors format's own limit on its JSON header."""
MAX_JSON_CHECK = 64 * 1024 * 1024
"""A ``.json`` file larger than this is not parsed (adopted only with ``trust=True``)."""


@dataclass(frozen=True, slots=True)
class AdoptReport:
    """Result of :meth:`CommitStore.adopt`."""

    adopted: tuple[str, ...]
    """Records written for these."""
    rejected: dict[str, str] = field(default_factory=dict)
    """Not adopted, with the reason (truncated, damaged, unknown format without ``trust``)."""


def _size(f: BinaryIO) -> int:
    return f.seek(0, 2)


def check_zip(f: BinaryIO) -> str | None:
    """None if the zip (torch checkpoint) is structurally whole, else what is wrong."""
    size = _size(f)
    if size < EOCD_MIN:
        return "too short for a zip"
    tail_len = min(size, EOCD_MIN + MAX_COMMENT)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    at = tail.rfind(EOCD)
    if at < 0 or len(tail) - at < EOCD_MIN:
        return "no end-of-central-directory record (truncated?)"
    fields = struct.unpack("<4s4H2LH", tail[at : at + EOCD_MIN])
    entries, cd_size, cd_offset = fields[4], fields[5], fields[6]
    if entries == 0xFFFF or cd_offset == 0xFFFFFFFF:
        return _check_zip64(f, size, size - tail_len + at)
    return _check_members(f, size, entries, cd_offset, cd_size)


def _check_zip64(f: BinaryIO, size: int, eocd_at: int) -> str | None:
    if eocd_at < 20:
        return "zip64 locator missing"
    f.seek(eocd_at - 20)
    loc = f.read(20)
    if len(loc) < 20 or loc[:4] != b"PK\x06\x07":
        return "zip64 locator missing"
    (rec_off,) = struct.unpack("<Q", loc[8:16])
    if rec_off + 56 > size:
        return "zip64 end record outside the file"
    f.seek(rec_off)
    rec = f.read(56)
    if rec[:4] != b"PK\x06\x06":
        return "zip64 end record damaged"
    entries, cd_size, cd_offset = struct.unpack("<QQQ", rec[32:56])
    return _check_members(f, size, entries, cd_offset, cd_size)


def _check_members(
    f: BinaryIO, size: int, entries: int, cd_offset: int, cd_size: int
) -> str | None:
    if cd_offset + cd_size > size:
        return "central directory lies beyond the end of the file"
    if cd_size > MAX_CENTRAL_DIRECTORY:
        return f"central directory larger than {MAX_CENTRAL_DIRECTORY} bytes (not checked)"
    f.seek(cd_offset)
    cd = f.read(cd_size)
    pos = 0
    for _ in range(entries):
        if cd[pos : pos + 4] != b"PK\x01\x02" or pos + 46 > len(cd):
            return "central directory damaged"
        comp, _unc = struct.unpack("<LL", cd[pos + 20 : pos + 28])
        name_len, extra_len, comment_len = struct.unpack("<HHH", cd[pos + 28 : pos + 34])
        (local_off,) = struct.unpack("<L", cd[pos + 42 : pos + 46])
        if pos + 46 + name_len + extra_len + comment_len > len(cd):
            return "central directory damaged"
        extra = cd[pos + 46 + name_len : pos + 46 + name_len + extra_len]
        found = _zip64_extra(extra, comp, _unc, local_off)
        if found is None:
            return "a member's zip64 extra field is damaged"
        comp, local_off = found
        if local_off + 30 > size:
            return "a member's local header lies beyond the end of the file"
        f.seek(local_off)
        header = f.read(30)
        if len(header) < 30 or header[:4] != b"PK\x03\x04":
            return "a member's local header is damaged"
        lname, lextra = struct.unpack("<HH", header[26:30])
        if local_off + 30 + lname + lextra + comp > size:
            return "a member's data runs past the end of the file"
        pos += 46 + name_len + extra_len + comment_len
    return None


def _zip64_extra(extra: bytes, comp: int, unc: int, off: int) -> tuple[int, int] | None:
    """The member's compressed size and local header offset, from its zip64 extra field where
    the central directory defers to it; None if that field is damaged."""
    i = 0
    while i + 4 <= len(extra):
        tag, length = struct.unpack("<HH", extra[i : i + 4])
        if tag == 1:
            fields = extra[i + 4 : i + 4 + length]
            if len(fields) != length or length % 8:
                return None
            vals = [struct.unpack("<Q", fields[j : j + 8])[0] for j in range(0, len(fields), 8)]
            it = iter(vals)
            if unc == 0xFFFFFFFF:
                next(it, None)
            if comp == 0xFFFFFFFF:
                comp = next(it, comp)
            if off == 0xFFFFFFFF:
                off = next(it, off)
        i += 4 + length
    return comp, off


def check_safetensors(f: BinaryIO) -> str | None:
    """None if the safetensors header parses and every tensor's data fits in the file."""
    size = _size(f)
    f.seek(0)
    head = f.read(8)
    if len(head) < 8:
        return "too short for safetensors"
    (n,) = struct.unpack("<Q", head)
    if 8 + n > size:
        return "header runs past the end of the file"
    if n > MAX_SAFETENSORS_HEADER:
        return f"header larger than {MAX_SAFETENSORS_HEADER} bytes"
    problem, header = _parse_json(f.read(n))
    if problem is not None:
        return f"header is {problem}"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    data_len = size - 8 - n
    for key, spec in header.items():
        if key == "__metadata__":
            continue
        offsets = spec.get("data_offsets") if isinstance(spec, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            return f"tensor {key!r} has no data_offsets"
        if not all(type(o) is int and o >= 0 for o in offsets):
            return f"tensor {key!r} has data_offsets that are not byte offsets"
        if offsets[1] > data_len or offsets[0] > offsets[1]:
            return f"tensor {key!r} data runs past the end of the file (truncated)"
    return None


def _parse_json(data: bytes) -> tuple[str | None, object]:
    """``(None, value)`` for one JSON document, else ``(what is wrong, None)``: never raises."""
    try:
        return None, json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return "not valid JSON (truncated?)", None
    except RecursionError:
        return "JSON nested too deep to check", None


def check_json(f: BinaryIO, *, trust: bool = False) -> str | None:
    """None if the file is one JSON document (one larger than :data:`MAX_JSON_CHECK` is not
    read: refused, or passed unchecked with ``trust``)."""
    if _size(f) > MAX_JSON_CHECK:
        return None if trust else f"JSON larger than {MAX_JSON_CHECK} bytes (adopt with trust=True)"
    f.seek(0)
    return _parse_json(f.read())[0]


_PARSE_ERRORS = (struct.error, ValueError, TypeError, IndexError, KeyError, OverflowError)


def structure_problem(name: str, f: BinaryIO, *, trust: bool) -> str | None:
    """Why ``name`` must not be adopted (damaged, truncated, of an unknown format), or None.

    Files are untrusted input: whatever their bytes, the answer is one of these two, read with
    bounded memory. Raises only CommitStoreError, for a read the storage failed.
    """
    try:
        return _structure_problem(name, f, trust=trust)
    except CommitStoreError:
        raise
    except _PARSE_ERRORS as exc:  # a parser gap: still damaged input, never a crash
        return f"damaged ({type(exc).__name__}: {exc})"
    except RecursionError:
        return "damaged (nested too deep to check)"


def _structure_problem(name: str, f: BinaryIO, *, trust: bool) -> str | None:
    lower = name.lower()
    if lower.endswith(".safetensors"):
        return check_safetensors(f)
    if lower.endswith(".json"):
        return check_json(f, trust=trust)
    if lower.endswith(ZIP_SUFFIXES):
        f.seek(0)
        if f.read(4) == b"PK\x03\x04":
            return check_zip(f)
        if lower.endswith(".zip"):
            return "not a zip"
    return None if trust else "unknown format (adopt with trust=True)"


_CHECKPOINT_DIR = re.compile(r"checkpoint-\d+")


def _in_progress(
    store: Committer, listing: list[tuple[Parts, FileInfo]]
) -> tuple[set[str], set[str]]:
    """Names with a write in flight: multi-writer folder commits still running (their markers,
    object stores); and names with a pending record (beside its record, from ``listing``, the
    records folder's; and, on object stores, every writer's slot): a commit that has not
    published its record yet, whose data may already be in place."""
    backend = store.backend
    folders = set()
    for rel, _info in backend.walk((META_DIR, FOLDERS_DIR)):
        try:
            doc = json.loads(backend.read_small((META_DIR, FOLDERS_DIR, *rel)))
            folders.add(str(doc["name"]))
        except (CommitStoreError, ValueError, KeyError, TypeError):
            continue
    intents = [((META_DIR, RECORDS_DIR), rel) for rel, _info in listing if is_intent_leaf(rel[-1])]
    if uses_slots(backend):
        intents += [
            ((META_DIR, PENDING_DIR), rel[:-1])
            for rel, _info in backend.walk((META_DIR, PENDING_DIR))
            if len(rel) > 1 and is_intent_leaf(rel[-2]) and is_slot_leaf(rel[-1])
        ]
    pending = set()
    for base, rel in intents:
        name = name_from_record_parts(record_of_intent(rel))
        if name is None:  # a hashed leaf: the name is only known from inside
            name = _intent_name(backend, base, rel)
        if name is not None:
            pending.add(name)
    return folders, pending


def _in_flight(name: str, folders: set[str], pending: set[str]) -> str | None:
    """Why ``name`` must not be adopted now, None if no write in flight touches it: it is, lies
    in or holds a folder commit still running, or lies in or holds a name with a commit in
    flight (its own pending record is :func:`_own_record_restored`'s)."""
    for other in sorted(folders):
        if name == other or name.startswith(other + "/"):
            return "a folder commit is writing it (not adopted)"
        if other.startswith(name + "/"):
            return f"a folder commit is writing {other} inside it (not adopted)"
    for other in sorted(pending):
        if name != other and _related(name, other):
            return f"a commit of {other} is in flight or was interrupted (not adopted)"
    return None


def _intent_name(backend: Backend, base: Parts, rel: Parts) -> str | None:
    """The name a pending record with a hashed leaf (or a slot folder of one) names."""
    where = (*base, *rel)
    try:
        if base[-1] == PENDING_DIR:
            where = (*where, sorted(r for r, _i in backend.walk(where))[0][0])
        return decode_record(backend.read_small(where)).name
    except (CommitStoreError, RecordFormatError, IndexError):
        return None


def _related(a: str, b: str) -> bool:
    """True when one of the names is the other or lies inside it."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _nested_store(rel: Parts, base: Parts = ()) -> str | None:
    """The folder path holding a store of its own (its ``.commitstore/``) that the path
    ``base/rel`` lies in, None if it lies in none (the root's own ``.commitstore/`` is not
    one)."""
    full = (*base, *rel)
    at = next((i for i, p in enumerate(full) if i and p == META_DIR), None)
    return None if at is None else "/".join(full[:at])


def _refuse_nested(nested: list[str], what: str) -> None:
    """Raise NameConflictError (nothing adopted) when ``nested`` names folder paths that hold
    stores of their own."""
    if nested:
        raise NameConflictError(
            f"{shown(sorted(set(nested)))} holds a store of its own ({META_DIR}/ below the "
            f"store root): {what} would claim that store's files and records as artifacts of "
            "this one, so it is refused and nothing was adopted (open that store on its own)",
            name=nested[0],
        )


def _check_named(store: Committer, parts: Parts, name: str) -> None:
    """The early refusals of ``adopt(name)`` (before anything is written): ``name`` inside a
    committed artifact (a member of a committed folder, a key below a committed file on an
    object store), in a store of its own (a folder on its path holds ``.commitstore/``), or
    holding one."""
    outer = store.outer_artifact(parts)
    if outer is not None:
        raise NameConflictError(
            f"{name} lies inside the committed artifact {outer}: a part of a committed "
            "artifact is not an artifact of its own, so it is not adopted (nothing was changed)",
            name=name,
        )
    backend = store.backend
    nested = [
        "/".join(parts[:i])
        for i in range(1, len(parts) + 1)
        if backend.stat((*parts[:i], META_DIR)) is not None
    ]
    info = backend.stat(parts)
    if not nested and info is not None and info.is_dir:
        nested = [inner for rel, _i in backend.walk(parts) if (inner := _nested_store(rel, parts))]
    _refuse_nested(nested, f"adopting {name}")


def _group(names: list[str]) -> list[str]:
    """Unrecorded files, with those below a ``checkpoint-N`` folder replaced by that folder."""
    out: dict[str, None] = {}
    for n in names:
        parts = n.split("/")
        at = next((i for i, p in enumerate(parts[:-1]) if _CHECKPOINT_DIR.fullmatch(p)), None)
        out["/".join(parts[: at + 1]) if at is not None else n] = None
    return list(out)


def _folder_record(store: Committer, name: str, parts: Parts, *, trust: bool) -> Record | str:
    """The record of the folder ``name`` after every file passed its check, else why not."""
    backend = store.backend
    before = sorted(backend.walk(parts))
    if not before:
        return "empty folder"
    busy = next(
        (r for r, _i in before if any(map(is_staging_part, r)) or any(map(is_aside_part, r))), None
    )
    if busy is not None:
        return (
            f"{'/'.join(busy)}: a write in progress (or one a dead writer left, which gc removes) "
            "lies in it (not adopted)"
        )
    files = []
    for rel, info in before:
        path = "/".join(rel)
        if not info.regular:
            return f"{path}: not a regular file"
        with backend.open_read((*parts, *rel)) as f:
            problem = structure_problem(path, f, trust=trust)
            if problem is not None:
                return f"{path}: {problem}"
            f.seek(0)
            size, digest = hash_stream(f)
        if size != info.size:
            return f"{path}: changed while it was checked (not adopted)"
        files.append(FileRecord(path, size, digest))
    after = sorted(backend.walk(parts))
    if [(r, i.size, i.mtime) for r, i in after] != [(r, i.size, i.mtime) for r, i in before]:
        return "changed while it was checked (not adopted)"
    return Record(
        name=name,
        step=infer_step(name),
        size=sum(f.size for f in files),
        digest=manifest_digest((f.path, f.size, f.digest) for f in files),
        files=tuple(files),
        metadata={"adopted": True},
        kind="dir",
    )


def _own_record_restored(store: Committer, parts: Parts) -> bool:
    """True when ``parts`` has a record now because an interrupted commit of it (stopped
    between its data and its record) left a pending record that its data matches in full:
    that record, with its step, metadata and alias flag, is made the record, as gc would do,
    never one made up by adopt. Checks the name's pending record (under the publish lock) and,
    on object stores, every writer's slot."""
    backend = store.backend
    if backend.stat(record_parts(parts)) is not None:
        return False  # it has a record already (adopt says so)
    with backend.publish_lock():
        store.promote_earlier(parts)
    if backend.stat(record_parts(parts)) is not None:
        return True
    for slot in read_slots(backend, parts):
        if check_exact(backend, slot.stored.record, "full").status == "ok":
            with contextlib.suppress(AlreadyExistsError):
                put_small(backend, record_parts(parts), slot.stored.raw, PutMode.CREATE)
            return backend.stat(record_parts(parts)) is not None
    return False


def _plan(
    store: Committer, name: str | None, listing: list[tuple[Parts, FileInfo]]
) -> tuple[list[str], dict[str, str]]:
    """The names ``adopt`` tries, and those it refuses up front with the reason; raises
    (before anything is written) what refuses the whole call.

    Raises:
        InvalidNameError: ``name`` is not a valid name.
        NameConflictError: ``name`` lies inside a committed artifact; or a store of its own
            (a folder holding ``.commitstore/``) is on its path or below it (``name=None``:
            anywhere below the root).
    """
    if name is not None:
        parts = validate_name(name)
        _check_named(store, parts, name)
        return [name], {}
    records, bad = scan_records(store.backend, listing)
    found = unrecorded(store.backend, records, bad)
    _refuse_nested(
        [n for f in found if (n := _nested_store(tuple(f.split("/")))) is not None], "adopt()"
    )
    files = {r.name for r in records if r.kind == "file"}
    names: list[str] = []
    rejected: dict[str, str] = {}
    for n in found:
        split = n.split("/")
        outer = next(
            ("/".join(split[:i]) for i in range(1, len(split)) if "/".join(split[:i]) in files),
            None,
        )
        if outer is not None:
            rejected[n] = f"inside the committed file artifact {outer} (not adopted)"
            continue
        try:
            validate_name(n)
        except InvalidNameError as exc:
            rejected[n] = str(exc)
            continue
        names.append(n)
    return _group(names), rejected


def adopt(store: Committer, name: str | None, *, trust: bool) -> AdoptReport:
    """Write records for unrecorded files and folders that pass their structural check.

    Every refusal of the whole call comes before any record is written (:func:`_plan`): a
    name inside a committed artifact, a store of its own below the root. A name inside
    another (an unrecorded key below a committed file on an object store) is reported, never
    adopted; so is a name that is, holds or lies inside a write in flight (a folder commit, a
    pending record, a staging entry). A name whose data matches a pending record its own
    interrupted commit left gets that record (:func:`_own_record_restored`), never a made-up
    one. A name that cannot be read as a regular file (a symlink, FIFO or device: never
    followed) is rejected with the reason; the other names are still adopted."""
    listing = store.backend.walk((META_DIR, RECORDS_DIR))
    names, rejected = _plan(store, name, listing)
    folders, pending = _in_progress(store, listing)
    adopted: list[str] = []
    for n in names:
        parts = validate_name(n)
        busy = _in_flight(n, folders, pending)
        if busy is not None:
            rejected[n] = busy
            continue
        if _own_record_restored(store, parts):
            rejected[n] = (
                "an interrupted commit of it left its own record, which the data matches: that "
                "record was made the record (not adopted)"
            )
            continue
        seen = store.backend.stat(parts)  # compared again under the lock, before the record
        if seen is not None and seen.is_dir:
            found = _folder_record(store, n, parts, trust=trust)
            if isinstance(found, str):
                rejected[n] = found
                continue
            refused = store.add_record(parts, encode_record(found))
            if refused is not None:
                rejected[n] = refused
            else:
                adopted.append(n)
            continue
        try:
            with store.backend.open_read(parts) as f:
                problem = structure_problem(n, f, trust=trust)
                if problem is None:
                    f.seek(0)
                    size, digest = hash_stream(f)
        except (IntegrityError, NotFoundError) as exc:  # a symlink, FIFO...; or gone meanwhile
            problem = str(exc)
        if problem is not None:
            rejected[n] = problem
            continue
        rec = Record(
            name=n, step=infer_step(n), size=size, digest=digest, metadata={"adopted": True}
        )
        refused = (
            store.add_record(parts, encode_record(rec), seen=seen)
            if seen is not None
            else "changed while it was checked (not adopted)"
        )
        if refused is not None:
            rejected[n] = refused
            continue
        adopted.append(n)
    return AdoptReport(tuple(adopted), rejected)
