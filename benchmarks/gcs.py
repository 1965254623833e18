"""GCS: commitstore put_file vs gcsfs put_file to the same fake-gcs-server, same run.

gcsfs runs at its default chunk size and with its documented larger ``chunksize``
(``worker.GCSFS_FAST_CHUNK``); the bucket is emptied before every run of either side, so no run
finds the previous one's object. The target is against the faster baseline, by median, with our
default ``chunk_size``. A third pair, reported, matches the configuration: ours with
``chunk_size`` equal to the larger-chunk baseline's ``chunksize`` (:func:`side`), since
fake-gcs-server's cost per chunk is not the same at every chunk size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.helpers.gcsserver import BUCKET, FakeGcs

from ._harness import ROOT, MiB, entry, pair, quiet, report, run, shuffled
from .worker import GCSFS_FAST_CHUNK

BASELINES = ("gcsfs_put_file", "gcsfs_put_file_fast")
MATCHED = f"gcs_put_file, chunk_size {GCSFS_FAST_CHUNK // MiB} MiB"
"""Ours in the matched pair: ``put_file`` with ``chunk_size`` = ``GCSFS_FAST_CHUNK``."""


def _emptier(server: FakeGcs) -> Callable[[], None]:
    """Delete every object of the bucket (untimed, before every run)."""

    def clear() -> None:
        listing = json.loads(server.request("GET", f"/storage/v1/b/{BUCKET}/o"))
        for item in listing.get("items", []):
            server.request("DELETE", f"/storage/v1/b/{BUCKET}/o/{quote(item['name'], safe='')}")

    return clear


def side(url: str, endpoint: str, source: str, chunk_size: int) -> None:
    """Ours in the matched pair, in this (fresh) process: ``put_file`` of ``source`` at
    ``chunk_size``; prints its seconds and peak RSS as JSON (as ``benchmarks.worker`` does)."""
    import resource

    from commitstore import open_store

    parent, name = url.rsplit("/", 1)
    store = open_store(
        parent, endpoint_url=endpoint, token="anon", project="test", chunk_size=chunk_size
    )
    t0 = time.perf_counter()
    store.put_file(name, source, overwrite=True)
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "maxrss_kib": rss}))


def _run_matched(url: str, env: dict[str, str]) -> dict[str, float]:
    code = "import sys; from benchmarks.gcs import side; side(*sys.argv[1:4], int(sys.argv[4]))"
    args = [url, env["BENCH_GCS_ENDPOINT"], env["BENCH_SOURCE"], str(GCSFS_FAST_CHUNK)]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd=ROOT
    )
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def _matched(
    url: str, size: int, repeat: int, clear: Callable[[], None], env: dict[str, str]
) -> dict[str, Any]:
    """Ours at the larger-chunk baseline's chunk size against it, as :func:`_harness.pair`
    measures a pair (shuffled, every run from an emptied bucket and the quiet state)."""
    base = "gcsfs_put_file_fast"
    times: dict[str, list[float]] = {base: [], MATCHED: []}
    rss: dict[str, list[float]] = {base: [], MATCHED: []}
    order = shuffled([base, MATCHED], repeat, seed=1)
    for which in order:
        clear()
        quiet()
        r = run(base, url, size, env) if which == base else _run_matched(url, env)
        times[which].append(r["seconds"])
        rss[which].append(r["maxrss_kib"])
    return {
        **entry(base, MATCHED, times[base], times[MATCHED], size),
        "run_order": ["ours" if w == MATCHED else "baseline" for w in order],
        "env": {},
        "peak_rss_mib": max(rss[MATCHED]) / 1024,
        "baseline_peak_rss_mib": max(rss[base]) / 1024,
    }


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 1024) * MiB
    with tempfile.TemporaryDirectory(prefix="cs-bench-gcs-") as tmp:
        source = Path(tmp) / "source.bin"
        with open(source, "wb") as f:
            for _ in range(size // (4 * MiB)):
                f.write(os.urandom(4 * MiB))
        server = FakeGcs(Path(tmp))
        try:
            env = {"BENCH_SOURCE": str(source), "BENCH_GCS_ENDPOINT": server.endpoint}
            url = f"gs://{BUCKET}/bench/artifact.bin"
            clear = _emptier(server)
            results = {
                f"gcs: put_file vs {baseline}": pair(
                    baseline, "gcs_put_file", url, size, args.repeat, clear=clear, env=env
                )
                for baseline in BASELINES
            }
            results[
                f"gcs: put_file at {GCSFS_FAST_CHUNK // MiB} MiB chunks vs gcsfs_put_file_fast"
            ] = _matched(url, size, args.repeat, clear, env)
        finally:
            server.stop()
    fastest = min(BASELINES, key=lambda b: results[f"gcs: put_file vs {b}"]["baseline_s"])
    report(
        f"gcs (fake-gcs-server), {size // MiB} MiB, {args.repeat} runs a side (shuffled, each from "
        "the quiet state, the bucket emptied), medians (target against the faster baseline, ours "
        "at its default chunk size; the matched pair reported)",
        results,
        {f"gcs: put_file vs {fastest}": 1.0},
        suite="gcs",
    )
