"""The state of an upload that a later process may resume (S3 multipart uploads of a local file).

A sink offered a local file it can read again (``ObjectFileSink.reread_from``) on a store whose
sessions resume keeps, at ``layout.resume_parts(name)`` on the target, the upload's state: the
object key, the upload id, the part size, the MD5 of each part the server took, and the source's
identity (:func:`source_identity`: size, mtime, inode, and the xxh3_128 of its first and last
MiB). The next attempt at the same name from the same unchanged source finds it and sends only
the parts the server lacks.

Nothing in the state is trusted on its own (anyone may edit it): a state that does not parse, or
names another key, part size or source, is dropped (and its upload aborted when the server shows
it is this key's); a part the server holds is reused only when its ETag and size are the MD5 and
length of the very bytes written this time (and agree with the state's MD5, when it has one);
every other part is sent again. The record's size and digest are always those of the bytes
written, and the completion stays the commit.

An upload a state names that may be live (another writer's, still running: its last activity,
its writer's marker included, younger than a few heartbeats; ``s3/upload.S3Upload._live``) is
never joined nor aborted, whatever the state says: the writer that found it starts its own.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import xxhash

from commitstore.backends.base import Rereadable

SCHEMA = "commitstore.resume/1"
IDENTITY_SPAN = 1024 * 1024
"""The bytes at each end of the source whose digests are part of its identity."""
_MD5_HEX = re.compile(r"[0-9a-f]{32}")
_MAX_PART = 10_000


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


@dataclass
class ResumeState:
    """One upload's state, as stored (``to_bytes``) and as parsed (``parse``)."""

    name: str
    key: str
    upload_id: str
    part_size: int
    source: dict[str, Any]
    parts: dict[int, str] = field(default_factory=dict)
    """Part number -> MD5 (hex) of the part the server took."""

    def to_bytes(self) -> bytes:
        doc = {
            "schema": SCHEMA,
            "name": self.name,
            "key": self.key,
            "upload_id": self.upload_id,
            "part_size": self.part_size,
            "source": self.source,
            "parts": {str(n): md5 for n, md5 in sorted(self.parts.items())},
        }
        return json.dumps(doc, sort_keys=True).encode("utf-8")


def parse(data: bytes) -> ResumeState | None:
    """The state in ``data``, or None when it is not a well-formed state (garbage, another
    schema, a field of the wrong type, a part number or MD5 out of range)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    name, key, upload_id = doc.get("name"), doc.get("key"), doc.get("upload_id")
    part_size, source, parts = doc.get("part_size"), doc.get("source"), doc.get("parts")
    if not all(isinstance(v, str) and v for v in (name, key, upload_id)):
        return None
    if type(part_size) is not int or part_size <= 0 or not isinstance(source, dict):
        return None
    if not isinstance(parts, dict):
        return None
    numbered: dict[int, str] = {}
    for number, md5 in parts.items():
        if not (isinstance(number, str) and number.isdigit() and isinstance(md5, str)):
            return None
        if not (1 <= int(number) <= _MAX_PART and _MD5_HEX.fullmatch(md5)):
            return None
        numbered[int(number)] = md5
    return ResumeState(str(name), str(key), str(upload_id), part_size, source, numbered)


def upload_id_of(data: bytes) -> tuple[str, str] | None:
    """(key, upload id) of a stored state, or None when it does not parse (for gc)."""
    state = parse(data)
    return None if state is None else (state.key, state.upload_id)
