"""Shared benchmark harness: one operation per fresh process, alternating pairs, median ratios.

Each run is a fresh worker process (so its peak RSS is its own) that times the operation alone
with ``time.perf_counter`` (see ``benchmarks.worker``). :func:`report` prints the results and
writes ``benchmarks/results/<suite>.json``: the commit, the machine (CPU count, memory, load at
the start and at the end), and for each measurement every run's seconds, the medians, the ratio
and its target.

Statistics (:func:`summary`): the headline ``ratio`` is median(ours) / median(baseline) (the
file's ``statistic`` says so); each side also gets its interquartile range and a trimmed mean
(the fastest and slowest 20% of runs dropped), with ``ratio_trimmed_mean`` their ratio, and
``pair_ratio_median`` is the median of the per-pair ratios (each ours run over the baseline run
beside it, which cancels slow drifts of a shared machine). Every run is kept.
``docs/benchmarks.md`` shows tables rendered from those files (``python -m benchmarks.render``),
and the docs check fails when a table differs from its file.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


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


STATISTIC = (
    "median of each side's runs (ratio = median ours / median baseline); IQR, 20% trimmed mean "
    "and the median of per-pair ratios also kept"
)
TRIM = 0.2
"""The share of runs dropped at each end for the trimmed mean."""


def summary(xs: list[float]) -> dict[str, float]:
    """Median, interquartile range (q1, q3) and the 20% trimmed mean of ``xs``."""
    s = sorted(xs)
    k = int(len(s) * TRIM)
    kept = s[k : len(s) - k] or s
    q1, _, q3 = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else (s * 3)
    return {
        "median": statistics.median(s),
        "q1": q1,
        "q3": q3,
        "trimmed_mean": statistics.fmean(kept),
    }


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
    """Time ``base`` and ``ours`` ``repeat`` times each, alternating order (``clear``, untimed,
    before every run of either side); the statistics of :func:`summary` and the ratios."""
    if base == ours:
        raise ValueError("a pair needs two different ops")
    times: dict[str, list[float]] = {base: [], ours: []}
    rss: list[float] = []
    base_rss: list[float] = []
    for i in range(repeat):
        for op in (base, ours) if i % 2 == 0 else (ours, base):
            if clear is not None:
                clear()  # untimed: every write starts from the same state
            r = run(op, target, size, env)
            times[op].append(r["seconds"])
            (rss if op == ours else base_rss).append(r["maxrss_kib"])
    sb, so = summary(times[base]), summary(times[ours])
    b, o = sb["median"], so["median"]
    per_pair = [x / y for x, y in zip(times[ours], times[base], strict=True)]
    return {
        "statistic": "median",
        "baseline": base,
        "ours": ours,
        "size_bytes": size,
        "baseline_runs_s": times[base],
        "ours_runs_s": times[ours],
        "baseline_s": b,
        "ours_s": o,
        "ratio": o / b,
        "ratio_trimmed_mean": so["trimmed_mean"] / sb["trimmed_mean"],
        "pair_ratio_median": statistics.median(per_pair),
        "baseline_iqr_s": [sb["q1"], sb["q3"]],
        "ours_iqr_s": [so["q1"], so["q3"]],
        "env": dict(env or {}),
        "baseline_mib_s": size / b / MiB,
        "ours_mib_s": size / o / MiB,
        "peak_rss_mib": max(rss) / 1024,
        "baseline_peak_rss_mib": max(base_rss) / 1024,
    }


def sweep(
    op: str,
    target: str,
    size: int,
    variants: dict[str, dict[str, str]],
    repeat: int,
) -> dict[str, Any]:
    """Run ``op`` under each environment of ``variants`` ``repeat`` times, round-robin (the
    order rotates each round); every run, each variant's median, and the fastest variant by
    median (``best``), so a baseline can be measured at its best setting in the same run."""
    runs: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(repeat):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            runs[name].append(run(op, target, size, variants[name])["seconds"])
    medians = {name: statistics.median(xs) for name, xs in runs.items()}
    best = min(medians, key=medians.__getitem__)
    return {"op": op, "size_bytes": size, "runs_s": runs, "median_s": medians, "best": best}


def machine() -> dict[str, Any]:
    """What the numbers were measured on (they are only comparable within one run)."""
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def commit() -> str:
    """The measured commit, with ``+dirty`` when the work tree had uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    # the run's own result files (earlier suites of the same run) do not make the tree dirty
    changed = git("status", "--porcelain", "-uno", "--", ".", ":!benchmarks/results")
    return head + ("+dirty" if changed else "")


LOAD_AT_START: list[float] = []
"""The load average when the current suite started (see :func:`mark_start`)."""
_STARTED: list[float] = []


def mark_start() -> None:
    """Note the load average and the time as a suite starts (the result file records the load
    at its start and end, and the suite's wall time)."""
    LOAD_AT_START[:] = [round(x, 2) for x in os.getloadavg()]
    _STARTED[:] = [time.monotonic()]


def write_results(
    suite: str,
    title: str,
    measurements: dict[str, dict[str, Any]],
    *,
    notes: str = "",
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``benchmarks/results/<suite>.json`` (what ``docs/benchmarks.md`` is rendered from)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "suite": suite,
        "title": title,
        "notes": notes,
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "machine": {**machine(), "load_average_at_start": LOAD_AT_START or None},
        "suite_wall_s": round(time.monotonic() - _STARTED[0], 1) if _STARTED else None,
        "statistic": STATISTIC,
        "measurements": measurements,
        **(extra or {}),
    }
    out = RESULTS / f"{suite}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return out


def report(
    title: str,
    results: dict[str, dict[str, Any]],
    targets: dict[str, float],
    *,
    suite: str | None = None,
    notes: str = "",
    extra: dict[str, Any] | None = None,
) -> None:
    """Print one line per result (time ratio ours/baseline: lower is better) and the JSON; with
    ``suite``, also write ``benchmarks/results/<suite>.json`` (see the module docstring)."""
    for name, r in results.items():
        limit = targets.get(name)
        r["target"] = limit
        r["meets"] = None if limit is None else bool(r["ratio"] <= limit)
    if suite is not None:
        write_results(suite, title, results, notes=notes, extra=extra)
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
