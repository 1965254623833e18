"""S3 resume: the newest checkpoint found and downloaded hash-verified vs one ``s3fs.get_file``.

Ours (``benchmarks.worker.s3_resume``, a fresh process each run): ``latest(level="size")`` (the
records listing and record reads) then ``get_file`` of that artifact (hashed on the way, published
only if it matches its record). Baseline: one ``s3fs.get_file`` of the same object, its name known
beforehand. Both go through a counting proxy (``tests/helpers/faultproxy.py``), which also gives
the bytes the server sent for one more run of each: one copy of the artifact plus the records
and listings. Measured against moto and ``rclone serve s3``, 256 MiB by default: at 1 GiB a single
baseline run on moto (``s3fs.get_file`` downloads in 50 MiB ranges, ten at a time, from a server
that answers one request at a time) took over five minutes on a loaded machine. Target: time
ratio <= 1.05, bytes served <= 1.05x one download (the records and the listing come on top of the
one copy).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from tests.helpers.faultproxy import FaultProxy
from tests.helpers.s3servers import ACCESS_KEY, BUCKET, SECRET_KEY, MotoServer, RcloneS3

from commitstore import open_store

from ._harness import MiB, judge, pair, report, run, write_results

OLDER = 3
"""Older checkpoints in the store (1 MiB each), so ``latest`` has records to choose among."""
NEWEST = "ckpt/step_000100.pt"
TIME_TARGET = 1.05
BYTES_TARGET = 1.05


def _seed(url: str, options: dict[str, Any], source: Path) -> None:
    store = open_store(url, **options)
    for i in range(OLDER):
        store.put_bytes(f"ckpt/step_{i:06d}.pt", os.urandom(MiB))
    store.put_file(NEWEST, source)


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 256) * MiB
    times: dict[str, dict[str, Any]] = {}
    served: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cs-bench-s3resume-") as tmp:
        source = Path(tmp) / "source.bin"
        with open(source, "wb") as f:
            for _ in range(size // (4 * MiB)):
                f.write(os.urandom(4 * MiB))
        dest = Path(tmp) / "dest.bin"
        for cls in (MotoServer, RcloneS3):
            base = Path(tmp) / cls.name
            base.mkdir()
            server = cls(base)
            proxy = FaultProxy(server.port)
            try:
                url = f"s3://{BUCKET}/resume"
                _seed(url, server.options(), source)
                env = {
                    "BENCH_S3_ENDPOINT": proxy.endpoint,
                    "BENCH_S3_NAME": NEWEST,
                    "BENCH_DEST": str(dest),
                    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                    "AWS_DEFAULT_REGION": "us-east-1",
                }

                def clear() -> None:
                    dest.unlink(missing_ok=True)

                name = f"{cls.name}: resume vs one s3fs.get_file"
                times[name] = pair(
                    "s3fs_get_file", "s3_resume", url, size, args.repeat, clear=clear, env=env
                )
                counted = {}
                for op in ("s3fs_get_file", "s3_resume"):
                    clear()
                    before = proxy.served
                    run(op, url, size, env)
                    counted[op] = proxy.served - before
                served[f"{cls.name}: bytes served, resume vs one s3fs.get_file"] = {
                    "ours": "s3_resume",
                    "baseline": "s3fs_get_file",
                    "artifact_bytes": size,
                    "ours_bytes": counted["s3_resume"],
                    "baseline_bytes": counted["s3fs_get_file"],
                    "ratio": counted["s3_resume"] / counted["s3fs_get_file"],
                }
                judge(next(reversed(served.values())), BYTES_TARGET)
            finally:
                proxy.stop()
                server.stop()
    report(
        f"s3 resume, {size // MiB} MiB newest of {OLDER + 1} checkpoints, {args.repeat} "
        "runs a side (shuffled, each from the quiet state), medians, through a counting proxy",
        times,
        dict.fromkeys(times, TIME_TARGET),
        suite="s3resume",
    )
    write_results(
        "s3resume-bytes",
        f"s3 resume, {size // MiB} MiB: bytes the server sent (counted at the proxy), one run each",
        served,
    )
    for name, r in served.items():
        print(f"  {name}: {r['ours_bytes']} / {r['baseline_bytes']} bytes, ratio {r['ratio']:.4f}")
