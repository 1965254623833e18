"""Value types: integrity records and verification reports, and the record's JSON codec.

The on-disk format is documented in ``docs/format.md`` (schema ``commitstore.record/1``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, final

from commitstore._recordrules import (
    MAX_DEPTH,
    MAX_INT,
    MAX_RECORD_BYTES,
    RecordFormatError,
    check_metadata,
    check_record,
    new_fields,
)
from commitstore.layout import validate_name

__all__ = [
    "MAX_DEPTH",
    "MAX_RECORD_BYTES",
    "CommitOutcome",
    "FileRecord",
    "Record",
    "RecordFormatError",
    "VerifyReport",
    "VerifyResult",
    "new_fields",
]
"""The rules (``new_fields``, the bounds, ``RecordFormatError``) live in ``_recordrules``; these
names stay importable from here."""

SCHEMA = "commitstore.record/1"

_INT_DIGITS = 20
"""The decoder refuses longer integer literals before converting them (Python's int-string
limit would otherwise raise a bare ValueError, and a long one costs quadratic time)."""


Status = Literal["ok", "missing", "size_mismatch", "hash_mismatch", "no_record", "bad_record"]
STATUSES: tuple[str, ...] = (
    "ok",
    "missing",
    "size_mismatch",
    "hash_mismatch",
    "no_record",
    "bad_record",
)


@final
@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file of a folder artifact."""

    path: str
    """Relative to the artifact's folder, ``/``-separated."""
    size: int
    """Size in bytes at commit time."""
    digest: str
    """``"xxh3_128:<32 hex>"`` of the file's bytes."""


@final
@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """How the commit call that returned a record went: carried by that record only
    (:attr:`Record.outcome`), never stored.

    A write call's outcome is binary: if it raises, the name holds what it held before; if it
    returns, the name verifies as the new version. What the commit could not confirm after the
    new data was published under the name (a folder sync the storage refused or that failed, a
    record write that failed while the pending record makes the name verify as the new version,
    a pending record that could not be removed) makes ``durable`` False, is said in ``notes``
    and logged as a warning; it never turns the call into an exception.
    """

    durable: bool
    """False when a step after the data's publish failed or could not be confirmed: the new
    version stands and is served (a missing record is completed by ``gc``), but the commit may
    not survive a power loss as it is, or left something for ``gc`` to settle."""
    notes: tuple[str, ...] = ()
    """What the commit had to work around, one entry per step (``"record: ..."``)."""
    target: str = ""
    """The URL of the store committed to (without credentials)."""
    bytes: int = 0
    """Bytes of the artifact (the record's ``size``)."""
    seconds: float = 0.0
    """Wall time of the commit call: from the start of the write (``stage()``, ``put_*``,
    ``stage_dir()`` entered, ``FolderWrite.commit``; a mirror copy's publish) to its return."""


@final
@dataclass(frozen=True, slots=True)
class Record:
    """What was committed under ``name``: the reference every check compares against."""

    name: str
    """The artifact's name, relative to the store root."""
    step: int | None
    """Training step: explicit, else a framework's step pattern in the name (``step=N``,
    ``step_N``, ``stepN``, ``global_stepN``, ``checkpoint-N``, ``epoch=E-step=S``: see
    ``layout.infer_step``), else None (ordered by ``created``)."""
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
    alias: bool = False
    """A moving name (``last.ckpt``) committed again and again with ``overwrite=True``: never
    pruned and not counted by ``keep_last``. Stored as ``"alias": true`` only when set, so other
    records keep their bytes (and older readers, which ignore unknown keys, read it)."""
    outcome: CommitOutcome | None = field(default=None, compare=False, repr=False)
    """On a record a write call returned: how that commit went (:class:`CommitOutcome`:
    durability, notes, target, bytes, seconds). None on records read from storage; never
    encoded into the stored record, and not compared."""


def _fmt_time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime(_TIME_FORMAT)


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
    if record.alias:
        doc["alias"] = True
    raw = (json.dumps(doc, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordFormatError(f"record is {len(raw)} bytes, more than {MAX_RECORD_BYTES}")
    return raw


def _need(doc: dict[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
    value = doc.get(key, _MISSING)
    if type(value) is types:  # the usual case: exactly the type asked for (never bool for int)
        return value
    if value is _MISSING:
        raise RecordFormatError(f"record has no {key!r}")
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise RecordFormatError(f"record field {key!r} has the wrong type")
    return value


_MISSING = object()


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


_DECODER = json.JSONDecoder(
    parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
)
"""One decoder for every record (``json.loads`` with hooks would build one per call); shared
across threads as ``json.loads``'s own default decoder is."""

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_CANONICAL_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")
"""The form the encoder writes (``_fmt_time``), which ``datetime.fromisoformat`` reads the same
way as ``strptime`` (a tenth of a scan's time otherwise); any other text goes to ``strptime``
with :data:`_TIME_FORMAT`, so what is accepted is unchanged."""


def _parse_time(text: str) -> datetime:
    """``created`` as an aware UTC datetime. Raises ValueError for text that is not one."""
    match = _CANONICAL_TIME.fullmatch(text)
    if match is None:
        return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=timezone.utc)
    return datetime.fromisoformat(f"{text[:-1]}+00:00")  # tzinfo: the timezone.utc singleton


def _decode(data: bytes) -> Record:
    if len(data) > MAX_RECORD_BYTES:
        raise RecordFormatError(f"record is {len(data)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordFormatError(f"record is not valid JSON: {exc}") from exc
    record = _decode_canonical(text)
    return _decode_json(text) if record is None else record


_CANONICAL_MAX = 4096
"""Records up to this many characters are first matched against the encoder's own layout."""

_CANONICAL = re.compile(
    r'\{(?P<alias>"alias": true, )?'
    r'"created": "(?P<created>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z)", '
    r'"digest": "(?P<digest>xxh3_128:[0-9a-f]{32})", "files": \[\], "kind": "file", '
    r'"metadata": (?P<metadata>\{.*\}), "name": "(?P<name>[^"\\\x00-\x1f]+)", '
    r'"schema": "commitstore\.record/1", "size": (?P<size>0|[1-9][0-9]{0,18}), '
    r'"step": (?P<step>null|0|[1-9][0-9]{0,18})\}\n?'
)
"""What :func:`encode_record` writes for a single-file record (sorted keys, no folder entries),
one pattern over the whole text: the name a JSON string without escapes, sizes and steps plain
JSON integers, the digest and time already in their only valid forms. ``metadata`` is the text
between its key and the name's; only records of :data:`_CANONICAL_MAX` characters or fewer are
matched (the split backtracks), longer ones go to :func:`_decode_json` directly."""


def _decode_canonical(text: str) -> Record | None:
    """The record ``text`` holds if it is in the encoder's layout (:data:`_CANONICAL`) and
    passes every check; None otherwise, for :func:`_decode_json` to decide (and to word the
    error): never accepts what that one rejects, and decodes what it accepts to an equal
    record. The checks :func:`check_record` makes that the pattern does not settle (name rules,
    the count bounds, a valid date, metadata values) are made here."""
    match = _CANONICAL.fullmatch(text) if len(text) <= _CANONICAL_MAX else None
    if match is None:
        return None
    alias, created_raw, digest, meta_raw, name, size_raw, step_raw = match.groups()
    size = int(size_raw)
    step = None if step_raw == "null" else int(step_raw)
    if size >= MAX_INT or (step is not None and step >= MAX_INT):
        return None
    try:
        validate_name(name)
        created = datetime.fromisoformat(f"{created_raw[:-1]}+00:00")
        if meta_raw == "{}":
            metadata: dict[str, Any] = {}
        else:
            metadata = _DECODER.decode(meta_raw)
            if type(metadata) is not dict:
                return None
            check_metadata(metadata)
    except Exception:  # anything wrong: the general decoder words the error
        return None
    return Record(
        name=name,
        step=step,
        size=size,
        digest=digest,
        files=(),
        created=created,
        metadata=metadata,
        kind="file",
        alias=alias is not None,
    )


def _decode_json(text: str) -> Record:
    """The general decoder: any JSON layout, every rule of :func:`check_record`."""
    try:
        doc = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
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
        created = _parse_time(created_raw)
    except ValueError as exc:
        raise RecordFormatError(
            f"record 'created' is not a UTC timestamp: {created_raw[:40]!r}"
        ) from exc
    metadata = _need(doc, "metadata", dict)
    alias = doc.get("alias", False)
    if not isinstance(alias, bool):
        raise RecordFormatError("record field 'alias' has the wrong type")
    record = Record(
        name=name,
        step=step,
        size=size,
        digest=digest,
        files=tuple(files),
        created=created,
        metadata=metadata,
        kind="dir" if kind == "dir" else "file",
        alias=alias,
    )
    check_record(record)
    return record


@final
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


@final
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
