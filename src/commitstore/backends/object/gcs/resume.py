"""The state a GCS resumable upload of a local file keeps so that a later process may resume it.

Same place (``layout.resume_parts(name)``) and schema (``commitstore.resume/1``) as S3's
(``backends/object/resume.py``): ``upload_id`` is the session URI, ``parts`` is empty, and the
GCS-only fields sit under ``"gcs"``: ``sent`` (the bytes the server acknowledged, in whole
chunks), ``create_only`` (the session's ``ifGenerationMatch=0``) and ``crc32c`` (chunk number ->
CRC32C, 8 hex digits, of each chunk acknowledged, and of the one being sent when the state was
written: it is rewritten just before each chunk is sent). The common parser reads it too
(gc finds the session it names with ``upload_id_of``).

Nothing in it is trusted on its own: a state that does not parse, names another name, key,
chunk size, session mode or source, or a session URI that is not an upload of this very key on
this very endpoint and bucket, is dropped; the chunks below the offset the upload resumes from
are reused only when their CRC32Cs are those of the same bytes of the source read now, and each
is checked again against the bytes written before it is skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from commitstore.backends.object.resume import ResumeState, parse

_CRC_HEX = re.compile(r"[0-9a-f]{8}")
MAX_CHUNKS = 1_000_000


@dataclass
class GcsState:
    """One GCS upload's state, as stored (:meth:`to_bytes`) and parsed (:func:`parse_gcs`)."""

    name: str
    key: str
    session: str
    """The resumable session URI ("" before the session is started)."""
    chunk_size: int
    source: dict[str, Any]
    create_only: bool
    sent: int = 0
    crc32c: dict[int, str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        base = ResumeState(self.name, self.key, self.session, self.chunk_size, self.source)
        doc = json.loads(base.to_bytes())
        doc["gcs"] = {
            "sent": self.sent,
            "create_only": self.create_only,
            "crc32c": {str(n): crc for n, crc in sorted(self.crc32c.items())},
        }
        return json.dumps(doc, sort_keys=True).encode("utf-8")


def parse_gcs(data: bytes) -> GcsState | None:
    """The GCS state in ``data``; None when it is not one (garbage, another schema, an S3
    state, a field of the wrong type, a chunk number or CRC32C out of range, or ``sent`` that is
    not the chunks it lists)."""
    base = parse(data)
    if base is None or base.parts:
        return None
    gcs = json.loads(data).get("gcs")
    if not isinstance(gcs, dict):
        return None
    sent, create_only, crcs = gcs.get("sent"), gcs.get("create_only"), gcs.get("crc32c")
    if type(sent) is not int or sent < 0 or type(create_only) is not bool:
        return None
    if not isinstance(crcs, dict):
        return None
    numbered: dict[int, str] = {}
    for number, crc in crcs.items():
        if not (isinstance(number, str) and number.isdigit() and isinstance(crc, str)):
            return None
        if not (1 <= int(number) <= MAX_CHUNKS and _CRC_HEX.fullmatch(crc)):
            return None
        numbered[int(number)] = crc
    if sorted(numbered) != list(range(1, len(numbered) + 1)):
        return None
    if sent not in (len(numbered) * base.part_size, (len(numbered) - 1) * base.part_size):
        return None  # every acknowledged chunk, and at most one more (sent when the state was)
    name, key, session = base.name, base.key, base.upload_id
    return GcsState(name, key, session, base.part_size, base.source, create_only, sent, numbered)


def session_of(location: str, bucket: str, key: str, uri: str) -> bool:
    """Whether ``uri`` is a resumable upload session of object ``key`` in ``bucket`` at the
    endpoint ``location`` (scheme, host and port; the path and the ``name`` the server put in
    it): a state may name any URL, and bytes are never sent, nor a DELETE, to another."""
    try:
        got, base = urlsplit(uri), urlsplit(location)
    except ValueError:
        return False
    path = f"{base.path.rstrip('/')}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
    query = parse_qs(got.query)
    return (
        (got.scheme, got.netloc) == (base.scheme, base.netloc)
        and got.path == path
        and not got.fragment
        and query.get("uploadType") == ["resumable"]
        and query.get("name") == [key]
        and len(query.get("upload_id", [])) == 1
    )
