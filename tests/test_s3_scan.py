"""The request pattern of a scan over many artifacts on S3 (moto): what ``latest`` and a prune
plan cost in requests, cold (no record cache) and warm, and how many record reads are in flight.
Counts, never times: the figures at 10,000 artifacts come from ``benchmarks/scale.py``.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import threading
import time
from typing import Any

from commitstore import CommitStore, open_store
from commitstore._recordcache import SHARDS
from commitstore.layout import record_parts, validate_name
from commitstore.records import Record, encode_record
from commitstore.testing import xxh

from .helpers.s3servers import BUCKET, MotoServer

N = 80
DATA = b"d" * 32


def _seed(moto: MotoServer, prefix: str) -> None:
    """Each artifact's object and record written straight with boto3 (the reference client)."""
    client = moto.client()

    def one(i: int) -> None:
        name = f"ckpt/step_{i:04d}.pt"
        rec = Record(name=name, step=i, size=len(DATA), digest=xxh(DATA))
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=DATA)
        key = "/".join((prefix, *record_parts(validate_name(name))))
        client.put_object(Bucket=BUCKET, Key=key, Body=encode_record(rec))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(N)))


class Counter:
    """S3 calls by method, and the most record reads ever in flight at once."""

    def __init__(self, store: CommitStore) -> None:
        backend: Any = store._backend
        self.calls: dict[str, int] = {}
        self.record_reads = 0
        self.inflight = self.peak = 0
        lock = threading.Lock()
        call, read = backend.fs.call_s3, backend.read_small_tagged

        def counted(method: str, *a: Any, **k: Any) -> Any:
            with lock:
                self.calls[method] = self.calls.get(method, 0) + 1
            return call(method, *a, **k)

        def reading(parts: tuple[str, ...]) -> Any:
            with lock:
                self.inflight += 1
                self.peak = max(self.peak, self.inflight)
                self.record_reads += parts[:2] == (".commitstore", "records")
            try:
                return read(parts)
            finally:
                with lock:
                    self.inflight -= 1

        async_call = backend.fs._call_s3

        async def counted_async(method: str, *a: Any, **k: Any) -> Any:
            with lock:
                self.calls[method] = self.calls.get(method, 0) + 1
            return await async_call(method, *a, **k)

        backend.fs.call_s3, backend.read_small_tagged = counted, reading
        backend.fs._call_s3 = counted_async


def test_cold_scan_reads_each_record_once_with_bounded_overlap_then_none(
    moto: MotoServer,
) -> None:
    prefix = f"scan{time.monotonic_ns()}"
    _seed(moto, prefix)
    url = f"s3://{BUCKET}/{prefix}"

    cold = open_store(url, **moto.options())
    count = Counter(cold)
    newest = cold.latest(level="size")
    assert newest is not None and newest.name == f"ckpt/step_{N - 1:04d}.pt"
    limit = cold._backend.capabilities.read_concurrency
    assert count.record_reads == N, "a first scan reads every record exactly once"
    assert 1 < count.peak <= limit, f"record reads overlapped, at most {limit} at a time"
    # one listing page of the records, one of the writers' pending records (a name a commit
    # stopped after its data step ranks by that new version: ``_newest``)
    assert count.calls.get("list_objects_v2") == 2, count.calls

    warm = open_store(url, **moto.options())
    count = Counter(warm)
    plan = warm.prune(keep_last=5, min_age=0, dry_run=True)
    assert len(plan.deleted) == N - 5
    assert warm.latest(level="size") == newest
    assert count.record_reads == 0, "the cache the first scan wrote replaces every record GET"
    # each of the two scans: one listing page (of the records: the prune plan checks the data
    # of the 5 artifacts it keeps with a HEAD each) and the cache's shards; each also lists the
    # writers' pending records (commits in flight or stopped, ranked by their version); then
    # the data reads of the newest artifact's check
    assert count.calls.get("list_objects_v2") == 4, count.calls
    assert count.calls.get("get_object", 0) <= 2 * SHARDS + 2, count.calls
    assert sum(count.calls.values()) <= 2 * SHARDS + 8 + 5 + 2, count.calls


def test_concurrent_commits_of_one_process_keep_every_record_in_the_cache(
    moto: MotoServer,
) -> None:
    prefix = f"notes{time.monotonic_ns()}"
    store = open_store(f"s3://{BUCKET}/{prefix}", **moto.options())
    names = [f"p/{i:03d}.bin" for i in range(40)]
    lock = threading.Lock()
    state = {"inflight": 0, "peak": 0}

    def commit(name: str) -> None:
        with lock:
            state["inflight"] += 1
            state["peak"] = max(state["peak"], state["inflight"])
        try:
            store.put_bytes(name, name.encode())
        finally:
            with lock:
                state["inflight"] -= 1

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(commit, names))
    assert state["peak"] >= 2, "the commits overlapped"
    client = moto.client()
    cached: set[str] = set()
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/.commitstore/cache/records/")
    for o in listed.get("Contents", []):
        blob = client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
        cached |= set(json.loads(gzip.decompress(blob))["entries"])
    want = {"/".join(record_parts(validate_name(n))[2:]) for n in names}
    assert cached == want, f"{len(want - cached)} commits' cache updates were lost"
