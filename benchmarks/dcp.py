"""DCP: a 2-rank ``dcp.save`` through ``commitstore.dcp.StorageWriter`` into a local store vs
``dcp.FileSystemWriter`` into a plain folder on the same disk (target <= 1.10x).

Two ranks of a gloo group on CPU (forked), a model state of ``--size-mib`` MiB sharded over both
(float32 tensors split along dim 0 as DTensors). Every repeat saves once with each writer, in
alternating order, to a fresh name/folder; each save is timed on rank 0 with ``perf_counter``
between two barriers (so it covers every rank's shard, ``.metadata`` and, for ours, the folder
commit). Medians are compared. The result goes to ``benchmarks/results/dcp_local.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ._harness import MiB, write_results


def _rank(rank: int, paths: tuple[str, str, str], size: int, repeat: int) -> None:
    rdv, tmp, out = paths
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import commitstore
    import commitstore.dcp as cdcp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    per = 16 * MiB  # bytes per tensor
    count = max(1, size // per)
    torch.manual_seed(0)
    state = {
        f"t{i}": distribute_tensor(torch.randn(per // 4 // 1024, 1024), mesh, [Shard(0)])
        for i in range(count)
    }
    store = commitstore.open_store(os.path.join(tmp, "store"))
    times: dict[str, list[float]] = {"filesystem_writer": [], "commitstore_writer": []}

    def timed(kind: str, i: int) -> None:
        if kind == "filesystem_writer":
            writer: Any = dcp.FileSystemWriter(os.path.join(tmp, "plain", f"step_{i}"))
        else:
            writer = cdcp.StorageWriter(store, f"ck/step_{i}")
        os.sync()
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=writer)
        dist.barrier()
        times[kind].append(time.perf_counter() - t0)

    timed("filesystem_writer", 10_000)  # warm-up, untimed below
    timed("commitstore_writer", 10_000)
    for runs in times.values():
        runs.clear()
    for i in range(repeat):
        order = ["filesystem_writer", "commitstore_writer"]
        for kind in order if i % 2 == 0 else reversed(order):
            timed(kind, i)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 256) * MiB
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cs-bench-dcp-") as tmp:
        out, rdv = os.path.join(tmp, "times.json"), os.path.join(tmp, "rdv")
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=_rank, args=(r, (rdv, tmp, out), size, args.repeat)) for r in (0, 1)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"dcp benchmark ranks exited {[p.exitcode for p in procs]}")
        times = json.loads(Path(out).read_text())
    base = statistics.median(times["filesystem_writer"])
    ours = statistics.median(times["commitstore_writer"])
    measurement = {
        "baseline": "dcp.FileSystemWriter",
        "ours": "commitstore.dcp.StorageWriter",
        "size_bytes": size,
        "baseline_runs_s": times["filesystem_writer"],
        "ours_runs_s": times["commitstore_writer"],
        "baseline_s": base,
        "ours_s": ours,
        "ratio": ours / base,
        "baseline_mib_s": size / base / MiB,
        "ours_mib_s": size / ours / MiB,
        "peak_rss_mib": None,
        "baseline_peak_rss_mib": None,
        "target": 1.10,
        "meets": ours / base <= 1.10,
    }
    write_results(
        "dcp_local",
        f"dcp: 2-rank save, {size // MiB} MiB, {args.repeat} runs each (alternating), medians, "
        "timed on rank 0 between barriers",
        {"dcp 2-rank save vs FileSystemWriter": measurement},
    )
    verdict = "meets" if ours / base <= 1.10 else "MISSES"
    print(
        f"dcp 2-rank save, {size // MiB} MiB, {args.repeat} runs each, medians: "
        f"time ratio {ours / base:.3f} (target <= 1.10) {verdict}; "
        f"FileSystemWriter {base:.3f} s, ours {ours:.3f} s"
    )
