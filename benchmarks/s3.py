"""S3: commitstore put_file vs s3fs.put_file and rclone copyto, same servers, same run.

Each baseline runs at its defaults and at its best: ``s3fs_put_file_like_ours`` is s3fs given
commitstore's own client settings (no SHA-256 payload signing, no CRC32 where the operation does
not require it: on a plain-HTTP local server the defaults pay both, ours does not), and
``rclone_copyto_fast`` is rclone with its documented upload options (``worker.RCLONE_FAST``).
The target is against the fastest baseline per server, by median.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.helpers.s3servers import (
    ACCESS_KEY,
    BUCKET,
    SECRET_KEY,
    MotoServer,
    RcloneS3,
    S3Server,
)

from ._harness import MiB, pair, report

SERVERS: tuple[type[S3Server], ...] = (MotoServer, RcloneS3)
"""The S3 servers the S3 suites measure against, in this order."""


def write_source(path: Path, size: int) -> Path:
    """``path`` filled with ``size`` random bytes (written 4 MiB at a time; ``size`` a multiple
    of 4 MiB)."""
    with open(path, "wb") as f:
        for _ in range(size // (4 * MiB)):
            f.write(os.urandom(4 * MiB))
    return path


@contextlib.contextmanager
def running(cls: type[S3Server], tmp: Path) -> Iterator[S3Server]:
    """A ``cls`` server in its own folder under ``tmp``, stopped on the way out."""
    base = tmp / cls.name
    base.mkdir()
    server = cls(base)
    try:
        yield server
    finally:
        server.stop()


def _emptier(server: S3Server) -> Callable[[], None]:
    """Empty the bucket before every timed run: ``rclone copyto`` skips a file whose copy with the
    same size and modification time is already there, which once made it look 5x faster."""
    client = server.client()

    def clear() -> None:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=BUCKET, Key=obj["Key"])

    return clear


BASELINES = ("s3fs_put_file", "s3fs_put_file_like_ours", "rclone_copyto", "rclone_copyto_fast")


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 1024) * MiB
    results: dict[str, dict[str, Any]] = {}
    targets: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="cs-bench-s3-") as tmp:
        source = write_source(Path(tmp) / "source.bin", size)
        for cls in SERVERS:
            with running(cls, Path(tmp)) as server:
                env = {
                    "BENCH_SOURCE": str(source),
                    "BENCH_S3_ENDPOINT": server.endpoint,
                    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                    "AWS_DEFAULT_REGION": "us-east-1",
                }
                url = f"s3://{BUCKET}/bench/artifact.bin"
                clear = _emptier(server)
                for baseline in BASELINES:
                    name = f"{cls.name}: put_file vs {baseline}"
                    results[name] = pair(
                        baseline, "s3_put_file", url, size, args.repeat, clear=clear, env=env
                    )
                fastest = min(
                    (r for k, r in results.items() if k.startswith(cls.name)),
                    key=lambda r: r["baseline_s"],
                )
                targets[f"{cls.name}: put_file vs {fastest['baseline']}"] = 1.0
    report(
        f"s3, {size // MiB} MiB, {args.repeat} runs a side (shuffled, each from the quiet state, "
        "the bucket emptied), medians (target against the fastest baseline per server)",
        results,
        targets,
        suite="s3",
    )
