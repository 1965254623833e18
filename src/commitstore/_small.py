"""Small in-memory files (records, pending records, the record cache), published whole."""

from __future__ import annotations

from commitstore._sinkwrite import write_bytes, write_sink
from commitstore.backends import Backend, CommitInfo, PutMode
from commitstore.layout import Parts


def put_small(backend: Backend, parts: Parts, body: bytes, mode: PutMode) -> CommitInfo:
    """Publish a small in-memory file (a record, the record cache) with the backend's own commit
    primitive: whole or absent under ``parts``. Raises what the backend's sink raises."""
    info = write_sink(backend, parts, mode, write_bytes(body)).info
    assert info is not None  # no check: always published
    return info
