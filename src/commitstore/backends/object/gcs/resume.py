"""The state a GCS resumable upload of a local file keeps so that a later process may resume it.

Same place (``layout.resume_parts(name)``), schema (``commitstore.resume/1``), reader and checks as
S3's (``backends/object/resume.py``: ``UploadState``): ``upload_id`` is the session URI, ``parts``
is empty, and the GCS-only fields sit under ``"gcs"``: ``sent`` (the bytes the server acknowledged,
in whole chunks), ``create_only`` (the session's ``ifGenerationMatch=0``) and ``crc32c`` (chunk
number -> CRC32C, 8 hex digits, of each chunk acknowledged, and of the one being sent when the state
was written: it is rewritten just before each chunk is sent, ``sent`` then one chunk short of the
list, and again once its answer came, ``sent`` then the end of the list: no chunk in flight, the
only state whose offset a resume without a status query takes). S3's parser reads it too (gc
finds the session it names with ``upload_id_of``).

Nothing in it is trusted on its own: a state that does not parse, names another name, key,
chunk size, session mode or source, or a session URI that is not an upload of this very key on
this very endpoint and bucket, is dropped; the chunks below the offset the upload resumes from
are reused only when their CRC32Cs are those of the same bytes of the source read now, and each
is checked again against the bytes written before it is skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import parse_qs, quote, urlsplit

from commitstore.backends.object.resume import SCHEMA, UploadState, numbered

_CRC_HEX = re.compile(r"[0-9a-f]{8}")
MAX_CHUNKS = 1_000_000


@dataclass
class GcsState(UploadState):
    """One GCS upload's state, as stored (:meth:`to_bytes`) and parsed (:meth:`parse`: None
    when it is not one: garbage, another schema, an S3 state, a field of the wrong type, a chunk
    number or CRC32C out of range, or ``sent`` that is not the chunks it lists)."""

    schema: ClassVar[str] = SCHEMA
    name: str
    key: str
    session: str
    """The resumable session URI ("" before the session is started)."""
    part_size: int
    """The chunk size."""
    source: dict[str, Any]
    create_only: bool
    sent: int = 0
    crc32c: dict[int, str] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        return {
            "upload_id": self.session,
            "parts": {},
            "gcs": {
                "sent": self.sent,
                "create_only": self.create_only,
                "crc32c": {str(n): crc for n, crc in sorted(self.crc32c.items())},
            },
        }

    @classmethod
    def from_doc(
        cls, doc: dict[str, Any], name: str, key: str, part_size: int, source: dict[str, Any]
    ) -> GcsState | None:
        session, gcs = doc.get("upload_id"), doc.get("gcs")
        if not (isinstance(session, str) and session) or doc.get("parts") != {}:
            return None  # S3's fields: a session URI, and no part
        if not isinstance(gcs, dict):
            return None
        sent, create_only = gcs.get("sent"), gcs.get("create_only")
        if type(sent) is not int or sent < 0 or type(create_only) is not bool:
            return None
        crcs = numbered(
            gcs.get("crc32c"), lambda n, crc: 1 <= n <= MAX_CHUNKS and bool(_CRC_HEX.fullmatch(crc))
        )
        if crcs is None or sorted(crcs) != list(range(1, len(crcs) + 1)):
            return None
        if sent not in (len(crcs) * part_size, (len(crcs) - 1) * part_size):
            return None  # every acknowledged chunk, and at most one more (sent when the state was)
        return cls(name, key, session, part_size, source, create_only, sent, crcs)


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
