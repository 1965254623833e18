"""Shared benchmark harness: fair runs from one quiet state, shuffled order, median ratios with a
bootstrap interval.

Each run is a fresh worker process (so its peak RSS is its own) that times the operation alone
with ``time.perf_counter`` (see ``benchmarks.worker``). :func:`report` prints the results and
writes ``<results dir>/<suite>.json`` (``benchmarks/results`` unless ``--results-dir`` or
``BENCH_RESULTS_DIR`` names another): the commit, the machine (CPU count, memory, load at the
start and at the end), the quiet state each run started from, and for each measurement every
run's seconds (in the order they ran), the medians, the ratio, its interval, its target and its
verdict.

Fairness (:func:`pair`): every timed run of either side starts from the same quiet state
(:func:`quiet`: the pair's untimed ``clear``, ``sync``, the page cache dropped through
``/proc/sys/vm/drop_caches`` where this process may write it, else a flag in the result file says
it was not, and a settle of :data:`QUIET` ``settle_s``), then the pair's untimed ``prepare`` (a
warm-cache pair reads its file back in). The two sides' runs are interleaved in a shuffled order
(seeded, recorded in ``run_order``), so neither side always follows the other.

Statistics (:func:`interval`, :func:`verdict`): the headline ``ratio`` is median(ours) /
median(baseline); ``ratio_interval_95`` is its 95% percentile bootstrap interval (each side's runs
resampled with replacement, 2,000 draws, seeded: the same runs always give the same interval).
A measurement with a target ``meets`` it only when the interval's upper bound is within the
target, is ``within noise`` when the median is within it and the upper bound is not, and
``misses`` otherwise. Each side also gets its interquartile range and a 20% trimmed mean. Every
run is kept. ``docs/benchmarks.md`` shows tables rendered from those files
(``python -m benchmarks.render``), and the docs check fails when a table differs from its file or
a file's ratio contradicts its runs.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import random
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
"""Where result files go by default (the ones ``docs/benchmarks.md`` is rendered from)."""

LOCAL_MIN_RUNS = 8
"""Runs a side that the suites on local storage take by default (at least)."""

BOOTSTRAP_DRAWS = 2000
VERDICTS = ("meets", "within noise", "misses")

QUIET: dict[str, Any] = {"drop_caches": True, "settle_s": 1.0}
"""How :func:`quiet` settles the machine before each timed run (``python -m benchmarks``
``--settle`` and ``--no-drop-caches`` change it; the result file records what was done)."""
_DROPPED: dict[str, int] = {}


def results_dir() -> Path:
    """The folder result files are written to: ``BENCH_RESULTS_DIR`` if set, else
    :data:`RESULTS`."""
    given = os.environ.get("BENCH_RESULTS_DIR")
    return Path(given) if given else RESULTS


def drop_caches() -> str:
    """``sync`` and, where permitted, drop the page cache, dentries and inodes; what happened
    (``dropped``, ``off``, or ``not permitted: ...``)."""
    os.sync()
    if not QUIET["drop_caches"]:
        return "off"
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"not permitted: {exc.strerror or exc}"
    return "dropped"


def quiet() -> None:
    """Bring the machine to the quiet state every timed run starts from: ``sync``, caches dropped
    where permitted (the outcome is counted for the result file), a settle of
    ``QUIET["settle_s"]`` seconds."""
    outcome = drop_caches()
    _DROPPED[outcome] = _DROPPED.get(outcome, 0) + 1
    time.sleep(float(QUIET["settle_s"]))


def count_quiet(outcomes: dict[str, int]) -> None:
    """Add the drop-caches outcomes another process counted (a spawned rank) to this suite's."""
    for outcome, n in outcomes.items():
        _DROPPED[outcome] = _DROPPED.get(outcome, 0) + int(n)


def quiet_state() -> dict[str, Any]:
    """What :func:`quiet` did in this suite: sync, each drop-caches outcome with its count, the
    settle time."""
    return {"sync": True, "drop_caches": dict(_DROPPED), "settle_s": QUIET["settle_s"]}


def bootstrap(ours: list[float], base: list[float], n: int = BOOTSTRAP_DRAWS) -> list[float]:
    """95% percentile interval of median(ours) / median(base), resampling each side's runs with
    replacement (seeded, so the same runs always give the same interval)."""
    rng = random.Random(0)
    ratios = []
    for _ in range(n):
        o = [rng.choice(ours) for _ in ours]
        b = [rng.choice(base) for _ in base]
        ratios.append(statistics.median(o) / statistics.median(b))
    ratios.sort()
    return [ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]]


def interval(ours: list[float], base: list[float]) -> list[float]:
    """The 95% bootstrap interval of the median ratio (:func:`bootstrap`)."""
    return bootstrap(ours, base)


def verdict(ratio: float, bounds: list[float], target: float | None) -> str | None:
    """``meets`` when the interval's upper bound is within ``target``, ``within noise`` when only
    the median ``ratio`` is, ``misses`` otherwise; None without a target."""
    if target is None:
        return None
    if bounds[1] <= target:
        return "meets"
    return "within noise" if ratio <= target else "misses"


def judge(r: dict[str, Any], target: float | None) -> None:
    """Set ``target``, ``verdict``, ``meets`` and ``within_noise`` of a measurement from its
    ratio and interval (an interval of one point where it has no runs, as for counted bytes)."""
    bounds = r.get("ratio_interval_95") or [r["ratio"], r["ratio"]]
    word = verdict(r["ratio"], bounds, target)
    r["target"] = target
    r["verdict"] = word
    r["meets"] = None if word is None else word == "meets"
    r["within_noise"] = None if word is None else word == "within noise"


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
    "median of each side's runs (ratio = median ours / median baseline) with a 95% bootstrap "
    "interval (runs resampled, seeded); 'meets' only when the interval's upper bound meets the "
    "target, 'within noise' when only the median does; IQR and 20% trimmed mean also kept"
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


def entry(
    baseline: str, ours: str, base_runs: list[float], ours_runs: list[float], size: int
) -> dict[str, Any]:
    """The statistics of one measurement from each side's runs (seconds): medians, the ratio and
    its 95% interval, IQRs, trimmed means, throughputs."""
    sb, so = summary(base_runs), summary(ours_runs)
    b, o = sb["median"], so["median"]
    return {
        "statistic": "median",
        "baseline": baseline,
        "ours": ours,
        "size_bytes": size,
        "baseline_runs_s": base_runs,
        "ours_runs_s": ours_runs,
        "baseline_s": b,
        "ours_s": o,
        "ratio": o / b,
        "ratio_interval_95": interval(ours_runs, base_runs),
        "ratio_trimmed_mean": so["trimmed_mean"] / sb["trimmed_mean"],
        "baseline_iqr_s": [sb["q1"], sb["q3"]],
        "ours_iqr_s": [so["q1"], so["q3"]],
        "baseline_mib_s": size / b / MiB,
        "ours_mib_s": size / o / MiB,
    }


def shuffled(labels: list[str], repeat: int, seed: int = 0) -> list[str]:
    """Each label ``repeat`` times, in a seeded shuffled order."""
    order = [label for label in labels for _ in range(repeat)]
    random.Random(seed).shuffle(order)
    return order


def pair(
    base: str,
    ours: str,
    target: str,
    size: int,
    repeat: int,
    *,
    clear: Callable[[], None] | None = None,
    prepare: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Time ``base`` and ``ours`` ``repeat`` times each, in a shuffled order (:func:`shuffled`);
    before every run of either side, untimed: ``clear``, then :func:`quiet`, then ``prepare``.
    The statistics of :func:`entry`, the run order and both sides' peak RSS."""
    if base == ours:
        raise ValueError("a pair needs two different ops")
    times: dict[str, list[float]] = {base: [], ours: []}
    rss: dict[str, list[float]] = {base: [], ours: []}
    order = shuffled([base, ours], repeat, seed)
    for op in order:
        if clear is not None:
            clear()  # every run starts from the same state
        quiet()
        if prepare is not None:
            prepare()
        r = run(op, target, size, env)
        times[op].append(r["seconds"])
        rss[op].append(r["maxrss_kib"])
    return {
        **entry(base, ours, times[base], times[ours], size),
        "run_order": ["ours" if op == ours else "baseline" for op in order],
        "env": dict(env or {}),
        "peak_rss_mib": max(rss[ours]) / 1024,
        "baseline_peak_rss_mib": max(rss[base]) / 1024,
    }


def sweep(
    op: str,
    target: str,
    size: int,
    variants: dict[str, dict[str, str]],
    repeat: int,
    *,
    prepare: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run ``op`` under each environment of ``variants`` ``repeat`` times, in a shuffled order,
    each run from the quiet state (then ``prepare``); every run, each variant's median, and the
    fastest variant by median (``best``), so a baseline is measured at its best setting."""
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for name in shuffled(list(variants), repeat):
        quiet()
        if prepare is not None:
            prepare()
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
    at its start and end, and the suite's wall time); the quiet-state counts start again."""
    LOAD_AT_START[:] = [round(x, 2) for x in os.getloadavg()]
    _STARTED[:] = [time.monotonic()]
    _DROPPED.clear()


def write_results(
    suite: str,
    title: str,
    measurements: dict[str, dict[str, Any]],
    *,
    notes: str = "",
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``<results dir>/<suite>.json`` (what ``docs/benchmarks.md`` is rendered from)."""
    out_dir = results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "suite": suite,
        "title": title,
        "notes": notes,
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {**machine(), "load_average_at_start": LOAD_AT_START or None},
        "suite_wall_s": round(time.monotonic() - _STARTED[0], 1) if _STARTED else None,
        "quiet_state": quiet_state(),
        "statistic": STATISTIC,
        "measurements": measurements,
        **(extra or {}),
    }
    out = out_dir / f"{suite}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
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
    """Judge each result against its target (:func:`judge`), print one line per result (time
    ratio ours/baseline: lower is better, with its interval and verdict) and, with ``suite``,
    write ``<results dir>/<suite>.json`` (see the module docstring)."""
    for name, r in results.items():
        judge(r, targets.get(name))
    if suite is not None:
        write_results(suite, title, results, notes=notes, extra=extra)
    print(title)
    for name, r in results.items():
        limit = r["target"]
        shown = f"<= {limit}" if limit is not None else "reported"
        lo, hi = r.get("ratio_interval_95") or [r["ratio"], r["ratio"]]
        print(
            f"  {name:40s} time ratio {r['ratio']:.3f} [95%: {lo:.3f}-{hi:.3f}] (target {shown})"
            f" {r['verdict'] or ''}"
        )
