"""Run the local benchmarks and print ratios against same-run baselines.

Targets (issue 2): commit via ``stage()`` <= 1.05x a naive write+fsync of the final name;
``verify(level="full")`` <= 1.15x a plain read (warm cache); peak RSS < 128 MiB for both.
Machines here are noisy: each pair is measured ``--repeat`` times, alternating, median kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MiB = 1024 * 1024


def run(op: str, path: Path, size: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", op, str(path), str(size)],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def _clear(path: Path) -> None:
    path.unlink(missing_ok=True)
    shutil.rmtree(path.parent / ".commitstore", ignore_errors=True)
    os.sync()


def pair(base: str, ours: str, path: Path, size: int, repeat: int) -> dict[str, float]:
    bt: list[float] = []
    ot: list[float] = []
    rss: list[float] = []
    writes = base.startswith(("naive", "stage"))
    for i in range(repeat):
        order = (base, ours) if i % 2 == 0 else (ours, base)
        for op in order:
            if writes:
                _clear(path)  # every write creates a new file; deletion is not timed
            r = run(op, path, size)
            (bt if op == base else ot).append(r["seconds"])
            if op == ours:
                rss.append(r["maxrss_kib"])
    b, o = statistics.median(bt), statistics.median(ot)
    return {
        "baseline_s": b,
        "ours_s": o,
        "ratio": o / b,
        "baseline_gib_s": size / b / 1024**3,
        "ours_gib_s": size / o / 1024**3,
        "peak_rss_mib": max(rss) / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--dir", default=None, help="folder on the disk to measure (default: a temp dir)"
    )
    args = p.parse_args()
    size = args.size_mib * MiB
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cs-bench-") as tmp:
        target = Path(tmp) / "artifact.bin"
        run("naive_write", target, size)  # warm-up: the first big write after boot is slow
        run("stage_commit", target, size)
        results = {
            "commit_vs_naive_write_fsync": pair(
                "naive_write", "stage_commit", target, size, args.repeat
            ),
        }
        results["commit_vs_commit_without_writeback"] = pair(
            "stage_commit_no_writeback", "stage_commit", target, size, args.repeat
        )
        _clear(target)
        run("stage_commit", target, size)  # the file verify reads must carry a record
        run("plain_read", target, size)  # warm the cache
        results["verify_full_vs_plain_read"] = pair(
            "plain_read", "verify_full", target, size, args.repeat
        )
    targets = {
        "commit_vs_naive_write_fsync": 1.05,
        "commit_vs_commit_without_writeback": 1.0,
        "verify_full_vs_plain_read": 1.15,
    }
    print(f"size {args.size_mib} MiB, {args.repeat} runs each, medians")
    for name, r in results.items():
        verdict = "meets" if r["ratio"] <= targets[name] and r["peak_rss_mib"] < 128 else "MISSES"
        print(
            f"{name:32s} ratio {r['ratio']:.3f} (target <= {targets[name]}) "
            f"baseline {r['baseline_gib_s']:.2f} GiB/s ours {r['ours_gib_s']:.2f} GiB/s "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB -> {verdict}"
        )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
