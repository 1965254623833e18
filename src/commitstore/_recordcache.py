"""A cache of record bytes that lets one listing replace one GET per record on object stores.

Object-store listings return each object's version tag (S3/Azure ETag, GCS generation) but not its
content. The cache keeps, for each record, the tag and the exact bytes of that version, in
``SHARDS`` small files ``.commitstore/cache/records/<xx>.json.gz`` (a record's shard is a hash of
its key), so that a commit updates one small shard rather than the whole cache.

Who writes it:
- Every commit to an object store adds its own record (the tag its upload returned) to its shard,
  right after the record is published: a read and a rewrite of one shard, best effort. A fresh
  process's first scan of a store written by commits therefore fetches no record.
- A scan rewrites a shard when it had to fetch records of that shard (a commit whose update was
  lost in a race, a store written by another tool or an older version) or when at least
  ``REWRITE_DROPS`` of its entries are gone (pruned records).

A cached entry is used only when the current listing shows that record with the same tag, so the
cache can be stale, partial, written by any process, raced by two writers or lost without ever
changing what a scan returns: a tag mismatch or a missing entry is a fresh GET. It holds no data of
its own, only copies of records, and is never consulted for data files.

Guarantees:
- A scan returns exactly the records a GET of every record would return at the listing's moment.
- Writing the cache is best effort (a read-only credential, a failing endpoint): a failure is
  logged at debug level and never fails the scan or the commit that tried.
- A scan that needs at most ``DIRECT_MAX`` records reads them directly and leaves the cache alone.
- A shard costs a bounded read: at most ``MAX_RECORD_BYTES`` read (``Backend.read_small``) and
  ``MAX_SHARD_BYTES`` inflated; a larger, truncated or otherwise damaged shard is ignored (its
  records are fetched, and the shard rewritten).
"""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import logging
import threading
import zlib
from collections.abc import Collection
from typing import TYPE_CHECKING

import xxhash

from commitstore._small import put_small
from commitstore.backends import PutMode
from commitstore.errors import CommitStoreError, NotFoundError
from commitstore.layout import META_DIR, Parts

if TYPE_CHECKING:
    from commitstore.backends import Backend

log = logging.getLogger("commitstore")

CACHE_DIR: Parts = (META_DIR, "cache", "records")
SCHEMA = "commitstore.record-cache/2"
SHARDS = 16
DIRECT_MAX = 16
REWRITE_DROPS = 8

Entries = dict[str, tuple[str, bytes]]
"""Record key (relative to the records folder) -> (tag, record bytes)."""

_NOTE_LOCKS = [threading.Lock() for _ in range(SHARDS)]


def shard_of(key: str) -> int:
    """The shard that holds ``key`` (stable across processes and versions of Python)."""
    return xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass")) % SHARDS


def shard_parts(shard: int) -> Parts:
    return (*CACHE_DIR, f"{shard:02x}.json.gz")


MAX_SHARD_BYTES = 32 * 1024 * 1024
"""The most a shard may expand to (about 60,000 entries of typical records); one that expands
further (a gzip bomb) is damaged: ignored, never inflated past this, and rewritten by the next
scan that fetches its records."""


class ShardError(ValueError):
    """A shard that is not one whole gzip member of at most :data:`MAX_SHARD_BYTES`."""


def inflate(blob: bytes) -> bytes:
    """The decompressed bytes of one shard, inflating at most ``MAX_SHARD_BYTES + 1`` bytes.

    Raises:
        ShardError: it expands beyond :data:`MAX_SHARD_BYTES`, is truncated, or has bytes after
            its gzip member. zlib.error: it is not gzip.
    """
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header and trailer, checked
    out = inflater.decompress(blob, MAX_SHARD_BYTES + 1)
    if len(out) > MAX_SHARD_BYTES or inflater.unconsumed_tail:
        raise ShardError(f"expands to more than {MAX_SHARD_BYTES} bytes")
    if not inflater.eof:
        raise ShardError("truncated")
    if inflater.unused_data:
        raise ShardError("bytes after its end")
    return out


def _decode(blob: bytes, shard: int) -> Entries:
    doc = json.loads(inflate(blob))
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return {}
    entries = doc["entries"]
    if not isinstance(entries, dict):
        return {}
    out: Entries = {}
    for key, value in entries.items():
        if not (isinstance(value, list) and len(value) == 2):
            continue
        tag, text = value
        # an entry filed under another shard is not where a commit would have put it: ignored
        if isinstance(tag, str) and isinstance(text, str) and shard_of(key) == shard:
            out[key] = (tag, text.encode("utf-8"))
    return out


_DECODE_LOCK = threading.Lock()
"""Shards are read concurrently but inflated and parsed one at a time: JSON parsing holds the
interpreter anyway, and the memory a scan's shards cost stays that of one
(:data:`MAX_SHARD_BYTES` and its parse), however many are read at once."""


def load_shard(backend: Backend, shard: int) -> Entries:
    """One shard's entries; empty when it is missing or cannot be read or parsed (a shard over
    the bounds is damaged, see :func:`inflate`)."""
    try:
        blob = backend.read_small(shard_parts(shard))
        with _DECODE_LOCK:
            return _decode(blob, shard)
    except NotFoundError:
        return {}
    except (
        CommitStoreError,
        OSError,
        EOFError,
        ValueError,  # a too large shard (read_small, inflate), bad JSON or UTF-8
        KeyError,
        TypeError,
        RecursionError,  # JSON nested too deep
        MemoryError,  # a shard within the bounds whose parse still does not fit
        zlib.error,
    ) as exc:
        log.debug("record cache shard %02x unreadable, ignored: %s", shard, exc)
        return {}


def load(backend: Backend, shards: Collection[int]) -> Entries:
    """The entries of ``shards``, read concurrently (``capabilities.read_concurrency`` at a
    time)."""
    out: Entries = {}
    if not shards:
        return out
    workers = max(1, min(backend.capabilities.read_concurrency, len(shards)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for entries in pool.map(lambda s: load_shard(backend, s), sorted(shards)):
            out.update(entries)
    return out


def save(backend: Backend, shard: int, entries: Entries) -> None:
    """Replace one shard with ``entries`` (one small object write); failures only log."""
    doc = {
        "schema": SCHEMA,
        "entries": {k: [tag, raw.decode("utf-8")] for k, (tag, raw) in sorted(entries.items())},
    }
    text = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    if len(text) > MAX_SHARD_BYTES:  # a reader would ignore it: its records are fetched
        log.debug("record cache shard %02x not written: %d bytes", shard, len(text))
        return
    body = gzip.compress(text, mtime=0)
    try:
        put_small(backend, shard_parts(shard), body, PutMode.REPLACE)
    except (CommitStoreError, OSError) as exc:
        log.debug("record cache shard %02x not written: %s", shard, exc)


def note(backend: Backend, key: str, tag: str | None, raw: bytes) -> None:
    """A commit's update: ``key``'s record is now ``raw`` with version ``tag`` (what the upload
    returned). Reads and rewrites one shard, one commit of this process at a time per shard;
    never raises (an update lost when two processes race on a shard only costs a later scan one
    GET)."""
    tag = norm(tag)
    if tag is None or not cacheable(raw):
        return
    shard = shard_of(key)
    with _NOTE_LOCKS[shard]:  # commits of one process never lose each other's updates
        entries = load_shard(backend, shard)
        entries[key] = (tag, raw)
        save(backend, shard, entries)


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
