"""Small in-memory files (records, pending records, the record cache), published whole."""

from __future__ import annotations

from commitstore.backends import Backend, CommitInfo, PutMode
from commitstore.digest import digest_bytes
from commitstore.layout import Parts


def put_small(backend: Backend, parts: Parts, body: bytes, mode: PutMode) -> CommitInfo:
    """Publish a small in-memory file (a record, the record cache) with the backend's own commit
    primitive: whole or absent under ``parts``. Raises what the backend's sink raises."""
    sink = backend.open_sink(parts, mode=mode)
    try:
        sink.write(memoryview(body))
    except BaseException:
        sink.abort()
        raise
    return sink.publish(size=len(body), digest=digest_bytes(body))
