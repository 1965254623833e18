"""GCS: commitstore put_file vs gcsfs put_file to the same fake-gcs-server, same run."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tests.helpers.gcsserver import BUCKET, FakeGcs

from ._harness import MiB, pair, report


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
            results = {
                "gcs: put_file vs gcsfs_put_file": pair(
                    "gcsfs_put_file", "gcs_put_file", url, size, args.repeat, env=env
                )
            }
        finally:
            server.stop()
    report(
        f"gcs (fake-gcs-server), {size // MiB} MiB, {args.repeat} runs each, medians",
        results,
        {"gcs: put_file vs gcsfs_put_file": 1.0},
        suite="gcs",
    )
