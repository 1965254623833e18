"""Value types: integrity records and verification reports, and the record's JSON codec.

The on-disk format is documented in ``docs/format.md`` (schema ``commitstore.record/1``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from commitstore.digest import is_valid_digest

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


def _fmt_time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode_record(record: Record) -> bytes:
    """Serialise ``record`` deterministically (sorted keys, UTF-8, trailing newline)."""
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
    return (json.dumps(doc, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()


def _need(doc: dict[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
    if key not in doc:
        raise RecordFormatError(f"record has no {key!r}")
    value = doc[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise RecordFormatError(f"record field {key!r} has the wrong type")
    return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def decode_record(data: bytes) -> Record:
    """Parse and validate a record file.

    Raises:
        RecordFormatError: not JSON, wrong schema, or a field of the wrong type or value.
    """
    try:
        doc = json.loads(data.decode("utf-8"))
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
    if size < 0 or not is_valid_digest(digest):
        raise RecordFormatError("record size or digest is malformed")
    raw_files = _need(doc, "files", list)
    files = []
    for entry in raw_files:
        if not isinstance(entry, dict):
            raise RecordFormatError("record file entry is not an object")
        fpath = _need(entry, "path", str)
        fsize = _need(entry, "size", int)
        fdigest = _need(entry, "digest", str)
        if fsize < 0 or not is_valid_digest(fdigest):
            raise RecordFormatError("record file entry size or digest is malformed")
        files.append(FileRecord(fpath, fsize, fdigest))
    if kind == "file" and files:
        raise RecordFormatError("a file record lists files")
    created_raw = _need(doc, "created", str)
    try:
        created = datetime.strptime(created_raw, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=timezone.utc
        )
    except ValueError as exc:
        raise RecordFormatError(
            f"record 'created' is not a UTC timestamp: {created_raw!r}"
        ) from exc
    metadata = _need(doc, "metadata", dict)
    return Record(
        name=name,
        step=step,
        size=size,
        digest=digest,
        files=tuple(files),
        created=created,
        metadata=metadata,
        kind="dir" if kind == "dir" else "file",
    )


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
