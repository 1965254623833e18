"""Local disk: commit vs naive write + fsync, verify vs plain read."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from ._harness import MiB, pair, report, run


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 1024) * MiB
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cs-bench-") as tmp:
        target = Path(tmp) / "artifact.bin"

        def clear() -> None:
            target.unlink(missing_ok=True)
            shutil.rmtree(target.parent / ".commitstore", ignore_errors=True)
            os.sync()

        run("naive_write", str(target), size)  # warm-up: the first big write after boot is slow
        results = {
            "commit_vs_naive_write_fsync": pair(
                "naive_write", "stage_commit", str(target), size, args.repeat, clear=clear
            ),
        }
        try:
            results["commit_vs_commit_without_writeback"] = pair(
                "stage_commit_no_writeback",
                "stage_commit",
                str(target),
                size,
                args.repeat,
                clear=clear,
            )
        except RuntimeError as exc:  # the worker op cannot reach the writeback knob
            print(f"commit_vs_commit_without_writeback skipped: {str(exc).splitlines()[-1]}")
        clear()
        run("stage_commit", str(target), size)  # the file verify reads must carry a record
        run("plain_read", str(target), size)  # warm the cache
        results["verify_full_vs_plain_read"] = pair(
            "plain_read", "verify_full", str(target), size, args.repeat
        )
    report(
        f"local, {size // MiB} MiB, {args.repeat} runs each, medians",
        results,
        {"commit_vs_naive_write_fsync": 1.05, "verify_full_vs_plain_read": 1.15},
    )
