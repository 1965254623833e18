"""The rules a record must follow (``docs/format.md``), checked on new records before any I/O and
on every record read from storage (untrusted input): counts, metadata, folder entries, the whole
record. The JSON codec is in :mod:`commitstore.records`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from commitstore.digest import is_valid_digest, manifest_digest
from commitstore.errors import ConfigurationError, InvalidNameError
from commitstore.layout import validate_name


class FileEntry(Protocol):
    """A folder record's file entry (``records.FileRecord``), as the checks read it."""

    @property
    def path(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def digest(self) -> str: ...


class RecordFields(Protocol):
    """A record (``records.Record``), as the checks read it."""

    @property
    def name(self) -> str: ...

    @property
    def step(self) -> int | None: ...

    @property
    def size(self) -> int: ...

    @property
    def digest(self) -> str: ...

    @property
    def files(self) -> Sequence[FileEntry]: ...

    @property
    def created(self) -> datetime: ...

    @property
    def metadata(self) -> dict[str, Any]: ...

    @property
    def kind(self) -> str: ...

    @property
    def alias(self) -> bool: ...


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
    if type(value) is dict and not value:
        return {}  # the usual case, without the walk
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


def check_files(files: Sequence[FileEntry]) -> None:
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


def check_record(record: RecordFields) -> None:
    """Everything the decoder requires of a record, on a ``records.Record`` (the encoder refuses
    what the decoder would reject).

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
    if not isinstance(record.alias, bool):
        raise RecordFormatError("record 'alias' must be a bool")
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
