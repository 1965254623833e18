"""Bridge: commit on the FUSE passthrough vs a plain write + fsync through the same mount."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tests.helpers.fusemount import FaultMount

from ._harness import MiB, pair, report


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 256) * MiB
    with tempfile.TemporaryDirectory(prefix="cs-bench-bridge-") as tmp:
        mount = FaultMount(Path(tmp))
        try:
            target = str(mount.mnt / "bench" / "artifact.bin")

            def clear() -> None:  # through the mount, so its caches stay truthful
                shutil.rmtree(mount.mnt / "bench", ignore_errors=True)
                (mount.mnt / "bench").mkdir()

            results = {
                "bridge_commit_vs_write_fsync": pair(
                    "naive_write", "stage_commit", target, size, args.repeat, clear=clear
                ),
                "bridge_commit_without_readback_vs_write_fsync": pair(
                    "naive_write",
                    "bridge_commit_no_readback",
                    target,
                    size,
                    args.repeat,
                    clear=clear,
                ),
            }
        finally:
            mount.stop()
    report(
        f"bridge (FUSE passthrough, Python), {size // MiB} MiB, {args.repeat} runs a side "
        "(shuffled, each from the quiet state), medians",
        results,
        {},
        suite="bridge",
    )
