"""Shared benchmark harness: one operation per fresh process, alternating pairs, median ratios."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent


def run(op: str, target: str, size: int, env: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``benchmarks.worker OP TARGET SIZE`` in a fresh process; its time and peak RSS."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", op, target, str(size)],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark op {op} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def pair(
    base: str,
    ours: str,
    target: str,
    size: int,
    repeat: int,
    *,
    clear: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Time ``base`` and ``ours`` ``repeat`` times each, alternating order; medians and ratio."""
    times: dict[str, list[float]] = {base: [], ours: []}
    rss: list[float] = []
    for i in range(repeat):
        for op in (base, ours) if i % 2 == 0 else (ours, base):
            if clear is not None:
                clear()  # untimed: every write starts from the same state
            r = run(op, target, size, env)
            times[op].append(r["seconds"])
            if op == ours:
                rss.append(r["maxrss_kib"])
    b, o = statistics.median(times[base]), statistics.median(times[ours])
    return {
        "baseline": base,
        "ours": ours,
        "baseline_s": b,
        "ours_s": o,
        "ratio": o / b,
        "baseline_mib_s": size / b / MiB,
        "ours_mib_s": size / o / MiB,
        "peak_rss_mib": max(rss) / 1024,
    }


def report(title: str, results: dict[str, dict[str, Any]], targets: dict[str, float]) -> None:
    """Print one line per result (time ratio ours/baseline: lower is better) and the JSON."""
    print(title)
    for name, r in results.items():
        limit = targets.get(name)
        verdict = "" if limit is None else (" meets" if r["ratio"] <= limit else " MISSES")
        shown = f"<= {limit}" if limit is not None else "reported"
        print(
            f"  {name:40s} time ratio {r['ratio']:.3f} (target {shown}){verdict}; "
            f"{r['baseline']} {r['baseline_mib_s']:.0f} MiB/s, {r['ours']} "
            f"{r['ours_mib_s']:.0f} MiB/s, peak RSS {r['peak_rss_mib']:.0f} MiB"
        )
    print(json.dumps(results, indent=2))
