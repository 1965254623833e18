"""GCS: commitstore put_file vs gcsfs put_file to the same fake-gcs-server, same run.

gcsfs runs at its default chunk size and with its documented larger ``chunksize``
(``worker.GCSFS_FAST_CHUNK``); the bucket is emptied before every run of either side, so no run
finds the previous one's object. The target is against the faster baseline, by median.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from tests.helpers.gcsserver import BUCKET, FakeGcs

from ._harness import MiB, pair, report

BASELINES = ("gcsfs_put_file", "gcsfs_put_file_fast")


def _emptier(server: FakeGcs) -> Callable[[], None]:
    """Delete every object of the bucket (untimed, before every run)."""

    def clear() -> None:
        listing = json.loads(server.request("GET", f"/storage/v1/b/{BUCKET}/o"))
        for item in listing.get("items", []):
            server.request("DELETE", f"/storage/v1/b/{BUCKET}/o/{quote(item['name'], safe='')}")

    return clear


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
        finally:
            server.stop()
    fastest = min(results, key=lambda name: results[name]["baseline_s"])
    report(
        f"gcs (fake-gcs-server), {size // MiB} MiB, {args.repeat} runs a side (shuffled, each from "
        "the quiet state, the bucket emptied), medians (target against the faster baseline)",
        results,
        {fastest: 1.0},
        suite="gcs",
    )
