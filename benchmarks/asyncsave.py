"""Asynchronous saves: how long the training loop waits (in-process, ``time.perf_counter``).

- stall: time until ``commitstore.torch.save_async`` returns (the snapshot) / time of the
  synchronous ``commitstore.torch.save`` of the same 1 GiB state dict (16 tensors), alternating,
  medians (target <= 0.15); beside it, time until ``torch.distributed.checkpoint.async_save``
  with a ``FileSystemWriter`` returns (one rank, no process group) / ours (target <= 1.0:
  ours stalls no longer than theirs).
- loop: a training-shaped loop (compute steps, a checkpoint every k steps, k chosen so one
  synchronous save fits in k steps; after its last checkpoint the loop computes k more steps,
  as between any two, then waits for every save to land, which is timed): wall time with
  asynchronous checkpoints / without checkpoints (target <= 1.10); the same loop with
  synchronous commits, with DCP ``async_save`` and with the same snapshot and bytes written
  without the library (``barecheckpoint.py``: the I/O's own cost to the compute) reported
  beside it, and ours against that floor.
- peak RSS of a child process that makes 4 asynchronous saves with ``async_inflight=1``, minus
  the same child's peak before saving (the state alone): the overhead, in units of the state's
  size (the snapshot is one state; the bound is stated in the result).

Every ratio comes with a 95% bootstrap interval over the runs (pairs resampled). Results go to
``benchmarks/results/asyncsave.json``, rendered into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._harness import ROOT, MiB, write_results
from .barecheckpoint import BareCheckpointer

TARGETS = {"stall": 0.15, "stall_vs_dcp": 1.0, "loop": 1.10}


def _state(size: int) -> dict[str, Any]:
    import torch

    n = 16
    per = max(1, size // n // 4)
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(per, generator=g) for i in range(n)}


def bootstrap(ours: list[float], base: list[float], n: int = 2000) -> list[float]:
    """95% percentile interval of median(ours) / median(base), resampling runs (seeded)."""
    rng = random.Random(0)
    ratios = []
    for _ in range(n):
        o = [rng.choice(ours) for _ in ours]
        b = [rng.choice(base) for _ in base]
        ratios.append(statistics.median(o) / statistics.median(b))
    ratios.sort()
    return [ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]]


def _entry(label_o: str, o: list[float], label_b: str, b: list[float], size: int) -> dict[str, Any]:
    mo, mb = statistics.median(o), statistics.median(b)
    return {
        "statistic": "median",
        "ours": label_o,
        "baseline": label_b,
        "size_bytes": size,
        "ours_runs_s": o,
        "baseline_runs_s": b,
        "ours_s": mo,
        "baseline_s": mb,
        "ratio": mo / mb,
        "ratio_interval_95": bootstrap(o, b),
        "ours_mib_s": size / mo / MiB if mo else 0.0,
        "baseline_mib_s": size / mb / MiB if mb else 0.0,
        "peak_rss_mib": None,
        "baseline_peak_rss_mib": None,
    }


def _dcp_async(state: dict[str, Any], folder: Path) -> Any:
    import torch.distributed.checkpoint as dcp

    return dcp.async_save(state, storage_writer=dcp.FileSystemWriter(str(folder)))


def stall(size: int, repeat: int, where: Path) -> dict[str, dict[str, Any]]:
    import commitstore.torch as cs
    from commitstore import open_store

    state = _state(size)
    store = open_store(where / "store")
    times: dict[str, list[float]] = {"async": [], "sync": [], "dcp": []}
    for i in range(repeat):
        order = ["async", "sync", "dcp"]
        random.Random(i).shuffle(order)
        for which in order:
            name = f"{which}-{i}.pt"
            start = time.perf_counter()
            if which == "async":
                fut = cs.save_async(state, store, name)
                times[which].append(time.perf_counter() - start)
                fut.result()
            elif which == "sync":
                cs.save(state, store, name)
                times[which].append(time.perf_counter() - start)
            else:
                folder = where / name
                fut = _dcp_async(state, folder)
                times[which].append(time.perf_counter() - start)
                fut.result()
                shutil.rmtree(folder)
            if which != "dcp":
                store.delete(name)
    return {
        "stall": _entry("save_async returns", times["async"], "save", times["sync"], size),
        "stall_vs_dcp": _entry(
            "save_async returns", times["async"], "dcp.async_save returns", times["dcp"], size
        ),
    }


def _compute(steps: int) -> float:
    import torch

    torch.manual_seed(0)
    a = torch.randn(512, 512)
    acc = 0.0
    for _ in range(steps):
        for _ in range(8):
            a = torch.tanh(a @ a.T / 512.0)
        acc += float(a[0, 0])
    return acc


def loop(size: int, repeat: int, where: Path) -> dict[str, dict[str, Any]]:
    import torch

    import commitstore.torch as cs
    from commitstore import open_store

    torch.set_num_threads(1)  # one core computes; the other is the writer's
    state = _state(size)
    start = time.perf_counter()
    _compute(5)
    step_s = (time.perf_counter() - start) / 5
    start = time.perf_counter()
    cs.save(state, open_store(where / "probe"), "probe.pt")
    save_s = time.perf_counter() - start
    shutil.rmtree(where / "probe")
    every = max(2, math.ceil(1.5 * save_s / step_s))
    checkpoints = 3
    steps = every * (checkpoints + 1)  # k steps after the last checkpoint, as between two

    def run(mode: str, i: int) -> float:
        store = open_store(where / f"loop-{mode}-{i}")
        bare = BareCheckpointer()  # fresh buffers each run, as a fresh store's
        begin = time.perf_counter()
        futures: list[Any] = []
        for s in range(1, steps + 1):
            _compute(1)
            if s % every or s > every * checkpoints or mode == "none":
                continue
            name = f"step_{s}.pt"
            if mode == "async":
                futures.append(cs.save_async(state, store, name))
            elif mode == "sync":
                cs.save(state, store, name)
            elif mode == "bare":
                futures.append(bare.save(state, where / f"bare-{i}" / name))
            else:
                if futures:
                    futures[-1].result()  # DCP: one save in flight, as async_inflight=1
                futures.append(_dcp_async(state, where / f"dcp-{i}" / name))
        for f in futures:
            f.result()
        store.close()
        bare.close()
        wall = time.perf_counter() - begin
        shutil.rmtree(where / f"loop-{mode}-{i}", ignore_errors=True)
        shutil.rmtree(where / f"dcp-{i}", ignore_errors=True)
        shutil.rmtree(where / f"bare-{i}", ignore_errors=True)
        return wall

    times: dict[str, list[float]] = {m: [] for m in ("none", "async", "sync", "dcp", "bare")}
    for i in range(repeat):
        order = list(times)
        random.Random(100 + i).shuffle(order)
        for mode in order:
            times[mode].append(run(mode, i))
    extra = {
        "checkpoint_every_steps": every,
        "checkpoints": checkpoints,
        "steps": steps,
        "step_s": step_s,
        "save_s": save_s,
    }
    out = {
        "loop": _entry(
            "loop, save_async", times["async"], "loop, no checkpoints", times["none"], size
        ),
        "loop_sync": _entry(
            "loop, save", times["sync"], "loop, no checkpoints", times["none"], size
        ),
        "loop_dcp": _entry(
            "loop, dcp.async_save", times["dcp"], "loop, no checkpoints", times["none"], size
        ),
        "loop_bare": _entry(
            "loop, the same bytes written without the library",
            times["bare"],
            "loop, no checkpoints",
            times["none"],
            size,
        ),
        "loop_vs_bare": _entry(
            "loop, save_async",
            times["async"],
            "loop, the same bytes written without the library",
            times["bare"],
            size,
        ),
    }
    for r in out.values():
        r.update(extra)
    return out


RSS_CHILD = """
import json, resource, sys, torch
import commitstore.torch as cs
from commitstore import open_store
from benchmarks.asyncsave import _state
size = int(sys.argv[2])
state = _state(size)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
store = open_store(sys.argv[1], async_inflight=1)
for i in range(4):
    cs.save_async(state, store, f"s{i}.pt")
store.close()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"before": before, "after": after}))
"""


def rss(size: int, where: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, str(where / "rss"), str(size)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    over = got["after"] - got["before"]
    return {
        "state_bytes": size,
        "peak_before_saving_mib": got["before"] / MiB,
        "peak_after_4_saves_mib": got["after"] / MiB,
        "overhead_mib": over / MiB,
        "overhead_in_states": over / size,
        "bound": "one snapshot (1 state) + 64 MiB",
        "within_bound": over <= size + 64 * MiB,
    }


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 1024) * MiB
    repeat = args.repeat or 5
    base: Callable[..., Any] = tempfile.TemporaryDirectory
    with base(dir=args.dir) as d:
        where = Path(d)
        results = stall(size, repeat, where)
        results.update(loop(max(MiB, size // 4), repeat, where))
        memory = rss(size, where)
    for name, r in results.items():
        limit = TARGETS.get(name)
        r["target"] = limit
        r["meets"] = None if limit is None else bool(r["ratio_interval_95"][1] <= limit)
        r["within_noise"] = (
            None if limit is None else bool(r["ratio"] <= limit < r["ratio_interval_95"][1])
        )
    write_results(
        "asyncsave",
        "Asynchronous saves: the loop's wait",
        results,
        notes=(
            "stall and loop ratios are medians with a 95% bootstrap interval; 'meets' only "
            "when the interval's upper bound meets the target. The loop's state is a quarter "
            "of the stall's."
        ),
        extra={"memory": memory},
    )
    for name, r in results.items():
        lo, hi = r["ratio_interval_95"]
        print(f"  {name:14s} ratio {r['ratio']:.3f} [{lo:.3f}, {hi:.3f}] target {r['target']}")
    print(json.dumps(memory, indent=1))
