"""DCP: a 2-rank ``dcp.save`` through ``commitstore.dcp.StorageWriter`` into a local store vs
``dcp.FileSystemWriter`` into a plain folder on the same disk (target <= 1.10x).

Two ranks of a gloo group on CPU (forked), a model state of ``--size-mib`` MiB sharded over both
(float32 tensors split along dim 0 as DTensors). Every repeat saves once with each writer, in a
shuffled order, each from the quiet state (``_harness.quiet`` on rank 0), to a fresh
name/folder; each save is timed on rank 0 with ``perf_counter``
between two barriers (so it covers every rank's shard, ``.metadata`` and, for ours, the folder
commit). Medians are compared. The result goes to ``benchmarks/results/dcp_local.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from . import _harness
from ._harness import MiB, entry, quiet, report, shuffled

TARGET = 1.10


def _rank(
    rank: int, paths: tuple[str, str, str], size: int, repeat: int, settings: dict[str, Any]
) -> None:
    rdv, tmp, out = paths
    _harness.QUIET.update(settings)  # a spawned rank starts from the module's defaults
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
    # shuffled (the same seeded order on both ranks), each run from the quiet state
    for i, kind in enumerate(shuffled(["filesystem_writer", "commitstore_writer"], repeat)):
        if rank == 0:
            quiet()
        dist.barrier()
        timed(kind, i)
    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "quiet": _harness.quiet_state()}))
    dist.destroy_process_group()


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 256) * MiB
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cs-bench-dcp-") as tmp:
        out, rdv = os.path.join(tmp, "times.json"), os.path.join(tmp, "rdv")
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(
                target=_rank, args=(r, (rdv, tmp, out), size, args.repeat, dict(_harness.QUIET))
            )
            for r in (0, 1)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"dcp benchmark ranks exited {[p.exitcode for p in procs]}")
        got = json.loads(Path(out).read_text())
    times = got["times"]
    _harness.count_quiet(got["quiet"]["drop_caches"])
    measurement = {
        **entry(
            "dcp.FileSystemWriter",
            "commitstore.dcp.StorageWriter",
            times["filesystem_writer"],
            times["commitstore_writer"],
            size,
        ),
        "peak_rss_mib": None,
        "baseline_peak_rss_mib": None,
    }
    report(
        f"dcp: 2-rank save, {size // MiB} MiB, {args.repeat} runs a side (shuffled, each from the "
        "quiet state), medians, timed on rank 0 between barriers",
        {"dcp 2-rank save vs FileSystemWriter": measurement},
        {"dcp 2-rank save vs FileSystemWriter": TARGET},
        suite="dcp_local",
    )
