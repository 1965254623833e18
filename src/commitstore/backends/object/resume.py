"""The state of an upload that a later process may resume: what every store's state shares
(:class:`UploadState`, :class:`StateFile`), and S3's (:class:`ResumeState`).

A sink offered a local file it can read again (``ObjectFileSink.reread_from``) on a store whose
sessions resume keeps, at ``layout.resume_parts(name)`` on the target, the upload's state: the
name, the object key, the part size, the source's identity (:func:`source_identity`: size,
mtime, inode, and the xxh3_128 of its first and last MiB), and what each store needs to find
its upload again (S3, here: the upload id and the MD5 of each part the server took; GCS:
``gcs/resume.py``; Azure: ``azure/resume.py``). The next attempt at the same name from the same
unchanged source finds it and sends only the parts the server lacks.

Nothing in the state is trusted on its own (anyone may edit it): a state that is not there, does
not parse (not JSON, another schema, a field of the wrong type: :meth:`UploadState.parse`), or
names another name, key, part size or source (:meth:`UploadState.names`), is no state to
resume: it is dropped (:meth:`StateFile.start_over`, its upload cancelled first when the server
shows it is this key's) and the upload starts over. For S3, a part the server holds is reused
only when its ETag and size are the MD5 and length of the very bytes written this time (and
agree with the state's MD5, when it has one); every other part is sent again. The record's size
and digest are always those of the bytes written, and the completion stays the commit.

An upload a state names that may be live (another writer's, still running: its last activity,
its writer's marker included, younger than a few heartbeats; ``s3/upload.S3Upload._live``) is
never joined nor aborted, whatever the state says: the writer that found it starts its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import xxhash

from commitstore._recordrules import RecordFormatError
from commitstore.backends.base import Rereadable
from commitstore.errors import CommitStoreError, NotFoundError
from commitstore.layout import Parts, resume_parts

SCHEMA = "commitstore.resume/1"
IDENTITY_SPAN = 1024 * 1024
"""The bytes at each end of the source whose digests are part of its identity."""
_MD5_HEX = re.compile(r"[0-9a-f]{32}")
_MAX_PART = 10_000

log = logging.getLogger("commitstore")


def source_identity(source: Rereadable, size: int) -> dict[str, Any] | None:
    """The identity of a local source file: size, mtime (ns), inode, device, and the xxh3_128 of
    its first and last MiB; None when the source is not a file with a descriptor (it is then
    never resumed) or its size is not ``size``."""
    fileno = getattr(source, "fileno", None)
    if not callable(fileno):
        return None
    try:
        st = os.fstat(fileno())
    except (OSError, ValueError):
        return None
    if st.st_size != size:
        return None
    head = source.pread(0, IDENTITY_SPAN)
    tail = source.pread(max(0, size - IDENTITY_SPAN), IDENTITY_SPAN)
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "device": st.st_dev,
        "head": xxhash.xxh3_128_hexdigest(head),
        "tail": xxhash.xxh3_128_hexdigest(tail),
    }


S = TypeVar("S", bound="UploadState")


class UploadState:
    """What every store's state holds: the name, the object's key, the part size and the
    source's identity, stored under the field names a store's schema gives them
    (:attr:`key_field`, :attr:`size_field`), next to the store's own fields (:meth:`fields`,
    :meth:`from_doc`). Each store's state is a dataclass of this."""

    schema: ClassVar[str]
    key_field: ClassVar[str] = "key"
    size_field: ClassVar[str] = "part_size"
    name: str
    key: str
    part_size: int
    source: dict[str, Any]

    def fields(self) -> dict[str, Any]:
        """The store's own fields, as stored."""
        raise NotImplementedError

    @classmethod
    def from_doc(
        cls, doc: dict[str, Any], name: str, key: str, part_size: int, source: dict[str, Any]
    ) -> UploadState | None:
        """The state of a stored document whose common fields are well formed; None when the
        store's own fields are not."""
        raise NotImplementedError

    def to_bytes(self) -> bytes:
        doc = {
            "schema": self.schema,
            "name": self.name,
            self.key_field: self.key,
            self.size_field: self.part_size,
            "source": self.source,
            **self.fields(),
        }
        return json.dumps(doc, sort_keys=True).encode("utf-8")

    @classmethod
    def parse(cls: type[S], data: bytes) -> S | None:
        """The state in ``data``, or None when it is not a well-formed state (garbage, another
        schema, a field of the wrong type, a store's field out of range)."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(doc, dict) or doc.get("schema") != cls.schema:
            return None
        name, key = doc.get("name"), doc.get(cls.key_field)
        size, source = doc.get(cls.size_field), doc.get("source")
        if not (isinstance(name, str) and name and isinstance(key, str) and key):
            return None
        if type(size) is not int or size <= 0 or not isinstance(source, dict):
            return None
        found = cls.from_doc(doc, name, key, size, source)
        return found if isinstance(found, cls) else None

    def names(self, name: str, key: str, part_size: int, identity: dict[str, Any]) -> bool:
        """Whether this is the state of an upload of ``name`` to ``key`` in parts of
        ``part_size`` from a source of this very ``identity`` (the one check every store makes
        before it resumes)."""
        return (
            self.name == name
            and self.key == key
            and self.part_size == part_size
            and self.source == identity
        )


def numbered(listed: Any, valid: Callable[[int, str], bool]) -> dict[int, str] | None:
    """A stored map of part numbers to strings (``{"1": ...}``) as ints; None when it is not a
    map, a number is not decimal digits, a value is not a string, or ``valid(number, value)``
    says no."""
    if not isinstance(listed, dict):
        return None
    out: dict[int, str] = {}
    for number, value in listed.items():
        if not (isinstance(number, str) and number.isdigit() and isinstance(value, str)):
            return None
        if not valid(int(number), value):
            return None
        out[int(number)] = value
    return out


@dataclass
class ResumeState(UploadState):
    """One S3 upload's state, as stored (``to_bytes``) and as parsed (``parse``)."""

    schema: ClassVar[str] = SCHEMA
    name: str
    key: str
    upload_id: str
    part_size: int
    source: dict[str, Any]
    parts: dict[int, str] = field(default_factory=dict)
    """Part number -> MD5 (hex) of the part the server took."""

    def fields(self) -> dict[str, Any]:
        return {
            "upload_id": self.upload_id,
            "parts": {str(n): md5 for n, md5 in sorted(self.parts.items())},
        }

    @classmethod
    def from_doc(
        cls, doc: dict[str, Any], name: str, key: str, part_size: int, source: dict[str, Any]
    ) -> ResumeState | None:
        upload_id = doc.get("upload_id")
        if not (isinstance(upload_id, str) and upload_id):
            return None
        parts = numbered(
            doc.get("parts"), lambda n, md5: 1 <= n <= _MAX_PART and bool(_MD5_HEX.fullmatch(md5))
        )
        if parts is None:
            return None
        return cls(name, key, upload_id, part_size, source, parts)


def upload_id_of(data: bytes) -> tuple[str, str] | None:
    """(key, upload id) of a stored state, or None when it does not parse (for gc)."""
    state = ResumeState.parse(data)
    return None if state is None else (state.key, state.upload_id)


class SmallReads(Protocol):
    """The store's small read (NotFoundError when absent, RecordFormatError when too large)."""

    def read_small(self, parts: Parts) -> bytes: ...


class StateFile:
    """The state object of one upload (at ``layout.resume_parts(parts)`` on the target), read
    (``store.read_small``), written (``write``) and removed (``remove``) through the store's own
    calls."""

    def __init__(
        self,
        parts: Parts,
        *,
        store: SmallReads,
        write: Callable[[Parts, bytes], object],
        remove: Callable[[Parts], object],
    ) -> None:
        self.where = resume_parts(parts)
        self.name = "/".join(parts)
        self._store, self._write, self._remove = store, write, remove

    def find(self, kind: type[S]) -> tuple[bool, S | None]:
        """(whether an object stands at the state's place, the state it holds when it parses
        as a ``kind``): one too large to be a state, or not one, is there but no state."""
        try:
            data = self._store.read_small(self.where)
        except NotFoundError:
            return False, None
        except RecordFormatError:
            data = b""
        return True, kind.parse(data)

    def write(self, data: bytes) -> bool:
        """Write the state; a failure is logged (the upload goes on: a later resume finds an
        older state, or none) and answered False."""
        try:
            self._write(self.where, data)
        except CommitStoreError as exc:
            log.warning("%s", exc)
            return False
        return True

    def start_over(self, cancel: Callable[[], object] | None = None) -> None:
        """Drop a state found not to resume: ``cancel`` the upload it names first (given only
        when the server shows that upload is this key's: never another name's), then remove the
        state. Failures are ignored (the upload starts over anyway; gc removes what is left)."""
        if cancel is not None:
            with contextlib.suppress(CommitStoreError):
                cancel()
        with contextlib.suppress(CommitStoreError):
            self._remove(self.where)

    def drop(self) -> None:
        """Remove the state once its upload is committed or given up (a failure is logged: gc,
        or the next attempt, removes it)."""
        try:
            self._remove(self.where)
        except CommitStoreError as exc:
            log.debug("%s", exc)


class KeepsState(Generic[S]):
    """An upload session that keeps a state (``_state``, None while there is none to keep) in
    its :class:`StateFile` (``_file``)."""

    _state: S | None
    _file: StateFile

    def _drop_state(self) -> None:
        """Remove the state once the upload is committed or given up (gc, or the next attempt,
        removes it when that fails)."""
        if self._state is None:
            return
        self._state = None
        self._file.drop()
