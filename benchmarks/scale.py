"""Scale: prune planning and ``latest(level="size")`` on a store with many artifacts.

Reports wall time and the number of backend calls (and, on S3, S3 requests): the listing must cost
requests proportional to pages, not one per artifact. Target: under 1 s locally for 10,000.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.helpers.s3servers import MotoServer

from commitstore import CommitStore, open_store

from ._harness import write_results

TARGET_S = {"moto, cold": 5.0, "local": 1.0}
"""Wall-time targets per measurement (each of the prune plan and ``latest``)."""

COUNTED = ("walk", "open_read", "read_small", "stat")


def _count(store: CommitStore) -> dict[str, int]:
    counts = dict.fromkeys((*COUNTED, "s3_requests"), 0)
    backend: Any = store.backend
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
    return counts


def _fill(store: CommitStore, n: int) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.put_bytes(f"ckpt/step_{i:06d}.pt", b"x" * 64), range(n)))


def _measure(label: str, store: CommitStore, n: int) -> dict[str, Any]:
    counts = _count(store)
    t0 = time.perf_counter()
    report = store.prune(keep_last=12, keep_every=1000, min_age=0, dry_run=True)
    t_prune = time.perf_counter() - t0
    prune_counts = dict(counts)
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


def _measure_s3(store: CommitStore, n: int, options: dict[str, Any]) -> dict[str, Any]:
    """Cold (no record cache yet: the first scan fetches every record and writes the cache), then
    warm in a fresh store object, as a later process would see it."""
    return {
        "moto, cold": _measure("moto, cold", store, n),
        "moto, warm": _measure("moto, warm", open_store(store.url, **options), n),
    }


def main(args: argparse.Namespace) -> None:
    n_local = args.size_mib or 10_000  # reused as a count here
    print(f"scale: prune planning and latest(level='size'), {n_local} local artifacts")
    with tempfile.TemporaryDirectory(prefix="cs-bench-scale-") as tmp:
        local = open_store(Path(tmp) / "store")
        _fill(local, n_local)
        results = {"local": _measure("local", local, n_local)}
        moto = MotoServer(Path(tmp) / "moto")
        try:
            n_s3 = n_local
            s3 = open_store("s3://commitstore-test/scale", **moto.options())
            _fill(s3, n_s3)
            results.update(_measure_s3(s3, n_s3, moto.options()))
        finally:
            moto.stop()
    write_results(
        "scale",
        f"scale: prune plan and latest(level='size'), {n_local} artifacts, one run",
        results,
    )
