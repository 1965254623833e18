"""Scale: prune planning and ``latest(level="size")`` on a store with many artifacts.

Reports wall time and the number of backend calls (and, on S3, S3 requests): the listing must cost
requests proportional to pages, not one per artifact. Targets: under 1 s locally for 10,000
(a store filled by commits, scanned again), under 3 s for the first scan of a local store of
ten times as many (100,000, written straight as commits leave them), under 5 s for the first
scan on moto. Also writes ``scale-folder.json`` (``scalefolder.py``: one folder artifact of
as many files as the local store has artifacts, mirrored to moto vs ``s3fs.put``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash
from tests.helpers.s3servers import BUCKET, MotoServer

from commitstore import CommitStore, _recordcache, open_store
from commitstore.layout import record_parts, validate_name
from commitstore.records import Record, encode_record

from . import scalefolder
from ._harness import write_results

BIG = 10
"""The first-scan local store holds ``BIG`` times as many artifacts as the others."""

TARGET_S = {"moto, first scan": 5.0, "local": 1.0, "local, first scan": 3.0}
"""Wall-time targets per measurement (each of the prune plan and ``latest``)."""

ROUNDS = 3
"""Rounds of the local, first-scan and warm measurements and of the records' bare listing,
taken in turn (each a fresh store object); the medians are reported, every run kept."""

COUNTED = ("walk", "open_read", "read_small", "stat")


def _count(store: CommitStore) -> dict[str, int]:
    counts = dict.fromkeys((*COUNTED, "s3_requests"), 0)
    backend: Any = store._backend
    for name in COUNTED:
        original = getattr(backend, name)

        def wrapped(*a: Any, _o: Any = original, _n: str = name, **k: Any) -> Any:
            counts[_n] += 1
            return _o(*a, **k)

        setattr(backend, name, wrapped)
    fs = getattr(backend, "fs", None)
    if fs is not None and hasattr(fs, "call_s3"):
        original_call = fs.call_s3

        def counted(*a: Any, **k: Any) -> Any:
            counts["s3_requests"] += 1
            return original_call(*a, **k)

        fs.call_s3 = counted
        original_async = fs._call_s3

        async def counted_async(*a: Any, **k: Any) -> Any:
            counts["s3_requests"] += 1
            return await original_async(*a, **k)

        fs._call_s3 = counted_async
    return counts


def _name(i: int) -> str:
    return f"ckpt/step_{i:06d}.pt"


DATA = b"x" * 64


def _fill(store: CommitStore, n: int) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.put_bytes(_name(i), DATA), range(n)))


def _seed_local(root: Path, n: int) -> None:
    """Untimed: what ``put_bytes`` leaves on a local store (each artifact's file and its record),
    written straight, without fsyncs."""
    digest = f"xxh3_128:{xxhash.xxh3_128_hexdigest(DATA)}"
    created = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    for i in range(n):
        name = _name(i)
        record = Record(name=name, step=i, size=len(DATA), digest=digest, created=created)
        for rel, body in ((name, DATA), ("/".join(record_parts(validate_name(name))), None)):
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body if body is not None else encode_record(record))


def _seed_s3(server: MotoServer, url: str, prefix: str, n: int) -> None:
    """Untimed: what ``put_bytes`` leaves on the bucket, without its checks: each artifact's data
    object and its record written straight with boto3, eight at a time, and the record cache's
    shards holding every record with the tag its put returned (a commit adds its own record to
    its shard; here the shards are written once, by the same code, instead of 10,000 times)."""
    client = server.client()
    digest = f"xxh3_128:{xxhash.xxh3_128_hexdigest(DATA)}"
    created = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)

    def one(i: int) -> tuple[str, str, bytes]:
        name = _name(i)
        record = Record(name=name, step=i, size=len(DATA), digest=digest, created=created)
        parts = record_parts(validate_name(name))
        raw = encode_record(record)
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=DATA)
        got = client.put_object(Bucket=BUCKET, Key="/".join((prefix, *parts)), Body=raw)
        return "/".join(parts[2:]), str(got["ETag"]), raw

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        written = list(pool.map(one, range(n)))
    shards: dict[int, _recordcache.Entries] = {}
    for key, tag, raw in written:
        shards.setdefault(_recordcache.shard_of(key), {})[key] = (str(_recordcache.norm(tag)), raw)
    backend = open_store(url, **server.options())._backend
    for shard, entries in shards.items():
        _recordcache.save(backend, shard, entries)


def _bare_listing(server: MotoServer, prefix: str) -> dict[str, Any]:
    """The floor no scan can go under: one boto3 listing of ``prefix`` (1,000 keys a page)."""
    client = server.client()
    t0 = time.perf_counter()
    pages = keys = 0
    kwargs: dict[str, Any] = {"Bucket": BUCKET, "Prefix": prefix}
    while True:
        page = client.list_objects_v2(**kwargs)
        pages += 1
        keys += len(page.get("Contents", []))
        if not page.get("IsTruncated"):
            break
        kwargs["ContinuationToken"] = page["NextContinuationToken"]
    return {"prefix": prefix, "keys": keys, "pages": pages, "s": time.perf_counter() - t0}


def _measure(
    label: str, store: CommitStore, n: int, reset: Callable[[], None] | None = None
) -> dict[str, Any]:
    """The prune plan, then ``latest``; ``reset`` (untimed) runs between them."""
    counts = _count(store)
    t0 = time.perf_counter()
    report = store.prune(keep_last=12, keep_every=1000, min_age=0, dry_run=True)
    t_prune = time.perf_counter() - t0
    prune_counts = dict(counts)
    if reset is not None:
        reset()
    for k in counts:
        counts[k] = 0
    t0 = time.perf_counter()
    latest = store.latest(level="size")
    t_latest = time.perf_counter() - t0
    assert latest is not None
    print(
        f"  {label}: {n} artifacts: prune plan {t_prune:.2f} s, "
        f"{len(report.deleted)} would go; calls {prune_counts}; "
        f"latest(size) {t_latest:.2f} s, calls {counts}"
    )
    return {
        "artifacts": n,
        "prune_plan_s": t_prune,
        "prune_calls": prune_counts,
        "latest_size_s": t_latest,
        "latest_calls": dict(counts),
        "target_s": TARGET_S.get(label),
    }


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement from ``runs`` of it: the median of each time, every run's time kept (the
    calls are the same in every run; the first run's are reported)."""
    out = dict(runs[0])
    for key in ("prune_plan_s", "latest_size_s"):
        values = [r[key] for r in runs]
        out[key] = statistics.median(values)
        out[key.removesuffix("_s") + "_runs_s"] = values
    return out


def _floor_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(runs[0])
    out["s"] = statistics.median(r["s"] for r in runs)
    out["runs_s"] = [r["s"] for r in runs]
    return out


def _measure_s3(server: MotoServer, url: str, n: int) -> dict[str, Any]:
    """Each measurement in a fresh store object (a new S3 filesystem, no listing cache), as a new
    process would see it: the first scan of a store written by commits (its record cache as the
    commits left it), a later one, and one with the cache deleted (untimed) before each scan
    (every record one GET: a store written by another tool)."""
    options = server.options()
    prefix = url.split("/", 3)[3]
    cache_prefix = "/".join((prefix, *_recordcache.CACHE_DIR)) + "/"
    client = server.client()

    def drop_cache() -> None:
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix=cache_prefix).get("Contents", [])
        for o in listed:
            client.delete_object(Bucket=BUCKET, Key=o["Key"])

    first, warm, floor = [], [], []
    for _ in range(ROUNDS):
        floor.append(_bare_listing(server, f"{prefix}/.commitstore/records/"))
        first.append(_measure("moto, first scan", open_store(url, **options), n))
        warm.append(_measure("moto, warm", open_store(url, **options), n))
    out = {
        "moto, first scan": _median_of(first),
        "moto, warm": _median_of(warm),
        "records floor": _floor_of(floor),
    }
    drop_cache()
    out["moto, no cache"] = _measure("moto, no cache", open_store(url, **options), n, drop_cache)
    drop_cache()
    return out


def main(args: argparse.Namespace) -> None:
    n_local = args.size_mib or 10_000  # reused as a count here
    print(f"scale: prune planning and latest(level='size'), {n_local} local artifacts")
    with tempfile.TemporaryDirectory(prefix="cs-bench-scale-") as tmp:
        local = open_store(Path(tmp) / "store")
        _fill(local, n_local)
        results = {"local": _median_of([_measure("local", local, n_local) for _ in range(ROUNDS)])}
        n_big = BIG * n_local
        _seed_local(Path(tmp) / "big", n_big)
        results["local, first scan"] = _median_of(
            [
                _measure("local, first scan", open_store(Path(tmp) / "big"), n_big)
                for _ in range(ROUNDS)
            ]
        )
        if getattr(args, "local_only", False):
            print(f"  local only: results not written; load average {os.getloadavg()}")
            return
        moto = MotoServer(Path(tmp) / "moto")
        try:
            n_s3 = n_local
            _seed_s3(moto, f"s3://{BUCKET}/scale", "scale", n_s3)
            whole = _bare_listing(moto, "scale/")
            results.update(_measure_s3(moto, f"s3://{BUCKET}/scale", n_s3))
            floors = {"records": results.pop("records floor"), "whole store": whole}
            results["moto, one bare listing (floor)"] = {"artifacts": n_s3, **floors}
            scalefolder.run_folder(Path(tmp) / "folder", moto, n_local, ROUNDS)
        finally:
            moto.stop()
    write_results(
        "scale",
        f"scale: prune plan and latest(level='size'), {n_local} artifacts ({n_big} for the "
        f"local first scan), medians of {ROUNDS} runs (taken in turn; no cache and the whole "
        "store's listing: one run)",
        results,
    )
