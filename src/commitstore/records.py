"""Value types: integrity records and verification reports, and the record's JSON codec.

The on-disk format is documented in ``docs/format.md`` (schema ``commitstore.record/1``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from commitstore.digest import is_valid_digest, manifest_digest
from commitstore.errors import ConfigurationError, InvalidNameError
from commitstore.layout import validate_name

__all__ = ["FileRecord", "Record", "VerifyReport", "VerifyResult"]

SCHEMA = "commitstore.record/1"

Status = Literal["ok", "missing", "size_mismatch", "hash_mismatch", "no_record", "bad_record"]
STATUSES: tuple[str, ...] = (
    "ok",
    "missing",
    "size_mismatch",
    "hash_mismatch",
    "no_record",
    "bad_record",
)


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file of a folder artifact."""

    path: str
    """Relative to the artifact's folder, ``/``-separated."""
    size: int
    """Size in bytes at commit time."""
    digest: str
    """``"xxh3_128:<32 hex>"`` of the file's bytes."""


@dataclass(frozen=True, slots=True)
class Record:
    """What was committed under ``name``: the reference every check compares against."""

    name: str
    """The artifact's name, relative to the store root."""
    step: int | None
    """Training step: explicit, else the last integer in the name, else None."""
    size: int
    """Bytes of the file, or the sum of the files' sizes for a folder artifact."""
    digest: str
    """``"xxh3_128:<32 hex>"`` of the bytes, or of the folder's manifest (``docs/format.md``)."""
    files: tuple[FileRecord, ...] = ()
    """For folder artifacts: one entry per file, sorted by path; empty for a single file."""
    created: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    """When the commit happened (UTC), per the writer's clock."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Caller-supplied JSON values."""
    kind: Literal["file", "dir"] = "file"
    """``"file"`` for a single file at ``<root>/<name>``, ``"dir"`` for a folder there."""


class RecordFormatError(ValueError):
    """A record file is not valid JSON or does not follow the schema."""


MAX_RECORD_BYTES = 16 * 1024 * 1024
"""A record file larger than this is bad (``docs/format.md``)."""
MAX_DEPTH = 32
"""Deepest nesting of ``metadata`` values: the object itself is depth 1."""
MAX_INT = 2**63
"""Sizes and steps are ``0 <= n < MAX_INT``."""
METADATA_INT = (-(2**63), 2**64)
"""Integers inside ``metadata``: ``lo <= n < hi`` (int64 and uint64 values)."""
_INT_DIGITS = 20
"""The decoder refuses longer integer literals before converting them (Python's int-string
limit would otherwise raise a bare ValueError, and a long one costs quadratic time)."""


def check_count(value: object, what: str) -> int:
    """``value`` as a size or step: an int (not a bool), ``0 <= value < 2**63``.

    Raises:
        RecordFormatError: otherwise.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordFormatError(f"{what} must be an integer, not {type(value).__name__}")
    if not 0 <= value < MAX_INT:
        raise RecordFormatError(f"{what} must be in [0, 2**63), got {_short(value)}")
    return value


def _short(value: int) -> str:
    return str(value) if abs(value) < 10**30 else f"a {value.bit_length()}-bit integer"


def check_metadata(value: object) -> dict[str, Any]:
    """A deep copy of ``value`` as record metadata: a JSON object with str keys, finite floats,
    integers in :data:`METADATA_INT`, UTF-8-encodable strings, lists (tuples become lists), at
    most :data:`MAX_DEPTH` levels deep. Iterative: no recursion, whatever the input.

    Raises:
        RecordFormatError: with the first problem found.
    """
    if not isinstance(value, Mapping):
        raise RecordFormatError(f"metadata must be a mapping, not {type(value).__name__}")
    root: dict[str, Any] = {}
    # (source container, its copy, depth of the container)
    stack: list[tuple[Any, Any, int]] = [(value, root, 1)]
    while stack:
        src, dst, depth = stack.pop()
        items = src.items() if isinstance(src, Mapping) else enumerate(src)
        for key, item in items:
            if isinstance(src, Mapping):
                if not isinstance(key, str):
                    raise RecordFormatError(
                        f"metadata keys must be str, not {type(key).__name__} ({key!r})"
                    )
                _check_text(key)
            copied: Any = item
            if isinstance(item, (Mapping, list, tuple)):
                if depth + 1 > MAX_DEPTH:
                    raise RecordFormatError(f"metadata is nested more than {MAX_DEPTH} levels")
                copied = {} if isinstance(item, Mapping) else []
                stack.append((item, copied, depth + 1))
            else:
                _check_scalar(item)
            if isinstance(dst, dict):
                dst[key] = copied
            else:
                dst.append(copied)
    return root


def _check_scalar(item: object) -> None:
    if item is None or isinstance(item, bool):
        return
    if isinstance(item, int):
        lo, hi = METADATA_INT
        if not lo <= item < hi:
            raise RecordFormatError(f"metadata integer out of range: {_short(item)}")
    elif isinstance(item, float):
        if not math.isfinite(item):
            raise RecordFormatError(f"metadata float must be finite, not {item!r}")
    elif isinstance(item, str):
        _check_text(item)
    else:
        raise RecordFormatError(f"metadata value of type {type(item).__name__} is not JSON")


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordFormatError(f"metadata text is not valid Unicode: {text[:40]!r}") from exc


def check_files(files: tuple[FileRecord, ...]) -> None:
    """Folder entries: each path a relative ``/``-separated name valid by the artifact-name rules
    (``layout.validate_name``), strictly increasing (sorted, unique), no path also a folder of
    another; sizes in range; digests well-formed.

    Raises:
        RecordFormatError: with the first problem found.
    """
    previous: str | None = None
    paths = set()
    for f in files:
        if not isinstance(f.path, str):
            raise RecordFormatError("record file entry path is not a string")
        try:
            validate_name(f.path, inside_folder=True)
        except InvalidNameError as exc:
            raise RecordFormatError(f"record file entry path is not allowed: {exc}") from exc
        if previous is not None and f.path <= previous:
            raise RecordFormatError(
                f"record file entries are not sorted and unique: {f.path!r} after {previous!r}"
            )
        previous = f.path
        check_count(f.size, f"size of {f.path!r}")
        if not is_valid_digest(f.digest):
            raise RecordFormatError(f"digest of {f.path!r} is malformed")
        paths.add(f.path)
    for path in paths:
        head = path
        while "/" in head:
            head = head.rsplit("/", 1)[0]
            if head in paths:
                raise RecordFormatError(f"{head!r} is recorded both as a file and as a folder")


def check_record(record: Record) -> None:
    """Everything the decoder requires of a record, on a :class:`Record` (the encoder refuses what
    the decoder would reject).

    Raises:
        RecordFormatError: with the first problem found.
    """
    try:
        validate_name(record.name)
    except InvalidNameError as exc:
        raise RecordFormatError(f"record name is not allowed: {exc}") from exc
    if record.kind not in ("file", "dir"):
        raise RecordFormatError(f"record kind {record.kind!r} is neither 'file' nor 'dir'")
    if record.step is not None:
        check_count(record.step, "step")
    check_count(record.size, "size")
    if not is_valid_digest(record.digest):
        raise RecordFormatError("record digest is malformed")
    if not isinstance(record.created, datetime) or record.created.tzinfo is None:
        raise RecordFormatError("record 'created' must be an aware datetime")
    check_files(record.files)
    if record.kind == "file" and record.files:
        raise RecordFormatError("a file record lists files")
    if record.kind == "dir":
        total = sum(f.size for f in record.files)
        if record.size != total:
            raise RecordFormatError(
                f"folder record size {record.size} is not the sum of its files' sizes ({total})"
            )
        expected = manifest_digest((f.path, f.size, f.digest) for f in record.files)
        if record.digest != expected:
            raise RecordFormatError("folder record digest is not the manifest digest of its files")
    check_metadata(record.metadata)


def new_fields(step: object, metadata: object) -> tuple[int | None, dict[str, Any]]:
    """Check a caller's ``step`` and ``metadata`` for a new record, before any I/O; return the
    step and a deep copy of the metadata (later changes by the caller do not reach the record).

    Raises:
        ConfigurationError: (a ValueError) with the problem.
    """
    try:
        checked = None if step is None else check_count(step, "step")
        meta = check_metadata({} if metadata is None else metadata)
        size = len(json.dumps(meta, ensure_ascii=False, allow_nan=False).encode())
    except RecordFormatError as exc:
        raise ConfigurationError(str(exc)) from exc
    if size > MAX_RECORD_BYTES - 64 * 1024:
        raise ConfigurationError(
            f"metadata is {size} bytes as JSON; a record holds at most {MAX_RECORD_BYTES}"
        )
    return checked, meta


def _fmt_time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode_record(record: Record) -> bytes:
    """Serialise ``record`` deterministically (sorted keys, UTF-8, trailing newline).

    Raises:
        RecordFormatError: ``record`` breaks a rule the decoder checks (nothing is encoded).
    """
    check_record(record)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "name": record.name,
        "kind": record.kind,
        "step": record.step,
        "size": record.size,
        "digest": record.digest,
        "files": [{"path": f.path, "size": f.size, "digest": f.digest} for f in record.files],
        "created": _fmt_time(record.created),
        "metadata": record.metadata,
    }
    raw = (json.dumps(doc, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordFormatError(f"record is {len(raw)} bytes, more than {MAX_RECORD_BYTES}")
    return raw


def _need(doc: dict[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
    if key not in doc:
        raise RecordFormatError(f"record has no {key!r}")
    value = doc[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise RecordFormatError(f"record field {key!r} has the wrong type")
    return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _INT_DIGITS:
        raise RecordFormatError(f"integer literal of {len(text)} characters")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RecordFormatError(f"number {text[:40]!r} is out of range")
    return value


def _parse_constant(text: str) -> Any:
    raise RecordFormatError(f"{text} is not JSON")


def decode_record(data: bytes) -> Record:
    """Parse and validate a record file (untrusted input: any exception becomes a
    RecordFormatError).

    Raises:
        RecordFormatError: not JSON, wrong schema, a field of the wrong type or value, a bound
            exceeded (``docs/format.md``).
    """
    try:
        return _decode(data)
    except RecordFormatError:
        raise
    except Exception as exc:  # RecursionError, MemoryError, ValueError...: all untrusted input
        raise RecordFormatError(f"record is unreadable: {type(exc).__name__}: {exc}") from exc


def _decode(data: bytes) -> Record:
    if len(data) > MAX_RECORD_BYTES:
        raise RecordFormatError(f"record is {len(data)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        doc = json.loads(
            data.decode("utf-8"),
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordFormatError(f"record is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RecordFormatError("record is not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise RecordFormatError(f"unknown record schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    name = _need(doc, "name", str)
    kind = _need(doc, "kind", str)
    if kind not in ("file", "dir"):
        raise RecordFormatError(f"record kind {kind!r} is neither 'file' nor 'dir'")
    step = doc.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise RecordFormatError("record field 'step' has the wrong type")
    size = _need(doc, "size", int)
    digest = _need(doc, "digest", str)
    raw_files = _need(doc, "files", list)
    files = []
    for entry in raw_files:
        if not isinstance(entry, dict):
            raise RecordFormatError("record file entry is not an object")
        files.append(
            FileRecord(
                _need(entry, "path", str), _need(entry, "size", int), _need(entry, "digest", str)
            )
        )
    created_raw = _need(doc, "created", str)
    try:
        created = datetime.strptime(created_raw, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=timezone.utc
        )
    except ValueError as exc:
        raise RecordFormatError(
            f"record 'created' is not a UTC timestamp: {created_raw[:40]!r}"
        ) from exc
    metadata = _need(doc, "metadata", dict)
    record = Record(
        name=name,
        step=step,
        size=size,
        digest=digest,
        files=tuple(files),
        created=created,
        metadata=metadata,
        kind="dir" if kind == "dir" else "file",
    )
    check_record(record)
    return record


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The check of one artifact."""

    name: str
    """Artifact name (for an unreadable record whose name cannot be recovered: its path)."""
    status: Status
    """One of ``ok``, ``missing``, ``size_mismatch``, ``hash_mismatch``, ``no_record``,
    ``bad_record``."""
    detail: str = ""
    """Human-readable explanation: expected vs actual, the file concerned."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Results of :meth:`CommitStore.verify`, one per artifact."""

    results: tuple[VerifyResult, ...]
    """In name order."""

    @property
    def ok(self) -> bool:
        """True when every result is ``ok`` or ``no_record``."""
        return all(r.status in ("ok", "no_record") for r in self.results)

    def by_status(self, status: str) -> list[VerifyResult]:
        """The results with that status."""
        return [r for r in self.results if r.status == status]
