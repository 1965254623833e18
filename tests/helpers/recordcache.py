"""Shared check of the object-store record cache (``commitstore._recordcache``), run against each
object-store server by its own test module. Cache contents are read and planted through the
backdoor."""

from __future__ import annotations

import gzip
import json
from typing import Any

from commitstore import CommitStore
from commitstore._recordcache import DIRECT_MAX, SCHEMA, shard_of
from commitstore.testing import Target, record_path

CACHE = ".commitstore/cache/records/"
RECORDS = ".commitstore/records/"
RECORDS_PARTS = (".commitstore", "records")


def _count_fetches(store: CommitStore) -> list[int]:
    """Count record GETs (``read_small_tagged``) made by ``store`` from now on."""
    calls = [0]
    backend: Any = store._backend
    original = backend.read_small_tagged

    def counted(parts: tuple[str, ...]) -> Any:
        if parts[:2] == (".commitstore", "records"):
            calls[0] += 1
        return original(parts)

    backend.read_small_tagged = counted
    return calls


def _shards(t: Target) -> list[str]:
    return sorted(f for f in t.door.files() if f.startswith(CACHE))


def _entries(t: Target, shard_file: str) -> dict[str, list[str]]:
    blob = t.door.read(shard_file)
    assert blob is not None
    doc = json.loads(gzip.decompress(blob))
    assert doc["schema"] == SCHEMA
    entries: dict[str, list[str]] = doc["entries"]
    return entries


def _plant(t: Target, key: str, tag: str, text: str, *, shard: int | None = None) -> None:
    where = shard_of(key) if shard is None else shard
    doc = {"schema": SCHEMA, "entries": {key: [tag, text]}}
    t.door.write(f"{CACHE}{where:02x}.json.gz", gzip.compress(json.dumps(doc).encode()))


def check_record_cache(t: Target) -> None:
    """Commits keep the cache, so a fresh process's first scan fetches no record; a record
    replaced behind the cache's back, a garbage shard, an entry with a stale tag and an entry
    filed in the wrong shard are all read fresh; a scan that had to fetch rewrites the cache."""
    n = DIRECT_MAX + 6
    names = [f"c/step_{i:04d}.pt" for i in range(n)]
    for i, name in enumerate(names):
        t.store.put_bytes(name, bytes([i]) * (i + 1))
    cached = {k for f in _shards(t) for k in _entries(t, f)}
    assert cached == {record_path(name)[len(RECORDS) :] for name in names}, (
        "every commit added its record to the cache"
    )

    other = t.reopen()
    fetches = _count_fetches(other)
    first = {r.name: r for r in other.list()}
    assert sorted(first) == names
    assert fetches[0] == 0, "a fresh process's first scan took every record from the cache"

    other.put_bytes(names[3], b"replaced", overwrite=True)
    fetches[0] = 0
    again = {r.name: r for r in other.list()}
    assert again[names[3]].size == len(b"replaced")
    assert fetches[0] == 0, "the overwrite's commit updated its cache entry"

    # another tool rewrites a record (same fields, other layout): new tag, the cache is stale
    victim = record_path(names[5])
    t.door.write(victim, json.dumps(json.loads(t.door.read(victim) or b"{}"), indent=1).encode())
    fresh = t.reopen()
    fetches = _count_fetches(fresh)
    assert {r.name: r.digest for r in fresh.list()} == {k: r.digest for k, r in again.items()}
    assert fetches[0] == 1, "only the record whose tag changed was fetched"
    fetches[0] = 0
    fresh.list()
    assert fetches[0] == 0, "that scan rewrote the shard it had to fetch for"

    for f in _shards(t):
        t.door.write(f, b"not gzip at all")
    assert {r.name: r.digest for r in t.reopen().list()} == {k: r.digest for k, r in again.items()}

    # entries that would lie: a valid record of the same name with another size, filed with a
    # stale tag in its shard, then with the right tag but in another shard
    key = record_path(names[7])[len(RECORDS) :]
    tags = {"/".join(rel): info.tag for rel, info in t.store._backend.walk(RECORDS_PARTS)}
    lie = json.loads(t.door.read(record_path(names[7])) or b"{}")
    lie["size"] += 1000
    # the other shard is one a scan reads (it holds another listed record)
    other_shard = next(shard_of(k) for k in tags if shard_of(k) != shard_of(key))
    for tag, shard in (("a-tag-that-no-version-has", None), (tags[key], other_shard)):
        for f in _shards(t):
            t.door.remove(f)
        _plant(t, key, str(tag).strip('"'), json.dumps(lie), shard=shard)
        probe = t.reopen()
        fetches = _count_fetches(probe)
        got = {r.name: r for r in probe.list()}
        assert got[names[7]].size == again[names[7]].size, "a lying entry was used"
        assert fetches[0] == n, "no entry was used"

    for f in _shards(t):
        t.door.remove(f)
    rebuilt = t.reopen()
    fetches = _count_fetches(rebuilt)
    rebuilt.list()
    assert fetches[0] == n, "without a cache every record is fetched"
    last = t.reopen()
    fetches = _count_fetches(last)
    last.list()
    assert fetches[0] == 0, "and the scan that fetched them wrote the cache back"
