"""Shared check of the object-store record cache (``commitstore._recordcache``), run against each
object-store server by its own test module. Cache contents are planted through the backdoor."""

from __future__ import annotations

import gzip
import json
from typing import Any

from commitstore import CommitStore
from commitstore._recordcache import REWRITE_AFTER
from commitstore.testing import Target, record_path

CACHE = ".commitstore/cache/records.json.gz"
RECORDS = ".commitstore/records/"


def _count_fetches(store: CommitStore) -> list[int]:
    """Count record GETs (``read_small_tagged``) made by ``store`` from now on."""
    calls = [0]
    backend: Any = store.backend
    original = backend.read_small_tagged

    def counted(parts: tuple[str, ...]) -> Any:
        if parts[:2] == (".commitstore", "records"):
            calls[0] += 1
        return original(parts)

    backend.read_small_tagged = counted
    return calls


def _plant(t: Target, entries: dict[str, list[str]]) -> None:
    doc = {"schema": "commitstore.record-cache/1", "entries": entries}
    t.door.write(CACHE, gzip.compress(json.dumps(doc).encode()))


def check_record_cache(t: Target) -> None:
    """One scan of many records writes the cache; a fresh process's scan then fetches no record;
    a replaced record, a garbage cache and a cache entry with a stale tag are all read fresh."""
    n = REWRITE_AFTER + 6
    names = [f"c/step_{i:04d}.pt" for i in range(n)]
    for i, name in enumerate(names):
        t.store.put_bytes(name, bytes([i]) * (i + 1))
    assert t.door.read(CACHE) is None
    first = {r.name: r for r in t.store.list()}
    assert sorted(first) == names
    assert t.door.read(CACHE) is not None, "a scan that fetched every record writes the cache"

    other = t.reopen()
    fetches = _count_fetches(other)
    assert {r.name: r for r in other.list()} == first
    assert fetches[0] == 0, "every record came from the cache"

    other.put_bytes(names[3], b"replaced", overwrite=True)
    fetches[0] = 0  # the commit's own reads (an earlier pending record?) are not the scan's
    again = {r.name: r for r in other.list()}
    assert again[names[3]].size == len(b"replaced")
    assert fetches[0] == 1, "the replaced record (new tag) was fetched, the rest were not"

    t.door.write(CACHE, b"not gzip at all")
    assert {r.name: r.digest for r in t.reopen().list()} == {n: r.digest for n, r in again.items()}

    victim = record_path(names[5])[len(RECORDS) :]
    _plant(t, {victim: ["a-tag-that-no-version-has", '{"forged": true}']})
    fresh = t.reopen()
    fetches = _count_fetches(fresh)
    assert {r.name: r.digest for r in fresh.list()} == {n: r.digest for n, r in again.items()}
    assert fetches[0] == n, "an entry whose tag does not match the listing is never used"
