"""A cache of record bytes that lets one listing replace one GET per record on object stores.

Object-store listings return each object's version tag (S3/Azure ETag, GCS generation) but not its
content. The cache, ``.commitstore/cache/records.json.gz``, maps each record's key to the tag and
the exact bytes of the version that was read. A cached entry is used only when the current listing
shows that record with the same tag, so the cache can be stale, partial, written by any process or
lost without ever changing what a scan returns: a tag mismatch or a missing entry is a fresh GET.
It holds no data of its own, only copies of records, and is never consulted for data files.

Guarantees:
- A scan returns exactly the records a GET of every record would return at the listing's moment.
- Writing the cache is best effort (a read-only credential, a failing endpoint): a failure is
  logged at debug level and never fails the scan that tried.
- The cache is rewritten only when at least ``REWRITE_AFTER`` records had to be fetched or
  dropped, so a training loop that prunes after every commit rewrites it rarely.
"""

from __future__ import annotations

import gzip
import json
import logging
from typing import TYPE_CHECKING

from commitstore._small import put_small
from commitstore.backends import PutMode
from commitstore.errors import CommitStoreError, NotFoundError
from commitstore.layout import META_DIR, Parts

if TYPE_CHECKING:
    from commitstore.backends import Backend

log = logging.getLogger("commitstore")

CACHE_PARTS: Parts = (META_DIR, "cache", "records.json.gz")
SCHEMA = "commitstore.record-cache/1"
REWRITE_AFTER = 64

Entries = dict[str, tuple[str, bytes]]
"""Record key (relative to the records folder) -> (tag, record bytes)."""


def load(backend: Backend) -> Entries:
    """The cached entries; empty when there is no cache or it cannot be read or parsed."""
    try:
        doc = json.loads(gzip.decompress(backend.read_small(CACHE_PARTS)))
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            return {}
        entries = doc["entries"]
        return {
            str(key): (str(tag), str(text).encode("utf-8"))
            for key, (tag, text) in entries.items()
            if isinstance(tag, str) and isinstance(text, str)
        }
    except NotFoundError:
        return {}
    except (CommitStoreError, OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        log.debug("record cache unreadable, ignored: %s", exc)
        return {}


def save(backend: Backend, entries: Entries) -> None:
    """Replace the cache with ``entries`` (one small object write); failures only log."""
    doc = {
        "schema": SCHEMA,
        "entries": {k: [tag, raw.decode("utf-8")] for k, (tag, raw) in sorted(entries.items())},
    }
    body = gzip.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8"), mtime=0)
    try:
        put_small(backend, CACHE_PARTS, body, PutMode.REPLACE)
    except (CommitStoreError, OSError) as exc:
        log.debug("record cache not written: %s", exc)


def norm(tag: str | None) -> str | None:
    """Tags compared without the quotes some services add in one response and not another."""
    if tag is None:
        return None
    tag = tag.strip().strip('"')
    return tag or None


def cacheable(raw: bytes) -> bool:
    """Records are UTF-8 JSON; anything else is left out of the cache (and fails decoding)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
