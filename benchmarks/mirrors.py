"""Mirrors: what background replication costs the training thread, and mirror throughput."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.helpers.s3servers import ACCESS_KEY, BUCKET, SECRET_KEY, MotoServer

from ._harness import MiB, pair, report, run

TRAIN_SECONDS = 2.0
"""Training time between two checkpoints in the blocking measurement. A 64 MiB checkpoint every
2 s is a 2 GiB one every minute: far more often than real runs checkpoint, and enough for the
mirrors to keep up on this machine, which is what background replication is designed for."""
BLOCKING = (
    f"blocking: commit with 2 background mirrors vs none, {TRAIN_SECONDS:g} s training between"
)
BACK_TO_BACK = "blocking, no training between commits (stress: mirrors fall behind, back-pressure)"
SYNC = "throughput: sync to local + moto vs rclone copy --checksum to each in turn"
SYNC_PARALLEL = "throughput: sync to local + moto vs both rclone copy --checksum at once"


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 1280) * MiB  # 20 artifacts of size/20 (64 MiB by default)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cs-bench-mirrors-") as tmp:
        base = Path(tmp)
        moto = MotoServer(base / "moto")
        try:
            mirror_dir = base / "mirror"
            s3_mirror = f"s3://{BUCKET}/mirror"
            env = {
                "BENCH_MIRROR_DIR": str(mirror_dir),
                "BENCH_S3_ENDPOINT": moto.endpoint,
                "BENCH_S3_MIRROR": s3_mirror,
                "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1",
            }
            primary = base / "primary"

            def clear() -> None:
                shutil.rmtree(primary, ignore_errors=True)
                shutil.rmtree(mirror_dir, ignore_errors=True)
                moto.reset()
                os.sync()

            for label, train in ((BLOCKING, TRAIN_SECONDS), (BACK_TO_BACK, 0.0)):
                results[label] = pair(
                    "commit_set_without_mirrors",
                    "commit_set_with_mirrors",
                    str(primary),
                    size,
                    args.repeat,
                    clear=clear,
                    env={**env, "BENCH_TRAIN_SECONDS": str(train)},
                )
            clear()
            source = base / "source"
            run("commit_set_without_mirrors", str(source), size)
            env["BENCH_SOURCE_STORE"] = str(source)

            def clear_mirrors() -> None:
                shutil.rmtree(mirror_dir, ignore_errors=True)
                moto.reset()

            # sync copies to its mirrors side by side: the second baseline runs both rclone
            # copies at once (the first, one after the other, is how a script would run them).
            for label, baseline in (
                (SYNC, "rclone_copy_checksum"),
                (SYNC_PARALLEL, "rclone_copy_checksum_parallel"),
            ):
                results[label] = pair(
                    baseline,
                    "sync_to_mirrors",
                    str(source),
                    size,
                    args.repeat,
                    clear=clear_mirrors,
                    env=env,
                )
        finally:
            moto.stop()
    report(
        f"mirrors, 20 x {size // 20 // MiB} MiB, {args.repeat} runs a side "
        "(shuffled, each from the quiet state), medians",
        results,
        {BLOCKING: 1.10, SYNC: 1.0, SYNC_PARALLEL: 0.95},
        suite="mirrors",
    )
