"""A real ``torch.distributed`` gloo group on CPU for the DCP tests: one process per rank, forked
from the (warm) test process so no interpreter starts; rendezvous through a file.

Each rank runs ``fn(rank, world, args)``; an exception is written to ``<base>/err.<rank>`` and
makes the rank exit 1. :func:`run_group` returns the exit codes (``-9`` for a rank killed with
SIGKILL); ranks still alive once a killed rank was seen are killed by PID.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import s3fs  # noqa: F401  (the S3 client's imports once here, not in every rank)
import torch
import torch._dynamo  # fully_shard imports it lazily: seconds per rank unless the parent has it
import torch.distributed as dist
import torch.distributed.checkpoint  # imported before the fork: warm children
import torch.distributed.checkpoint.state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

JOIN_GUARD = 240.0
"""Seconds a group may take before its ranks are killed (a hang guard, never a measurement)."""


def _child(
    rank: int, world: int, where: tuple[str, str], job: tuple[Callable[..., None], Any]
) -> None:
    torch.set_num_threads(1)
    rdv, base = where
    fn, args = job
    try:
        dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
        fn(rank, world, args)
        dist.destroy_process_group()
    except BaseException:
        Path(base, f"err.{rank}").write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def run_group(
    base: Path, world: int, fn: Callable[..., None], args: Any, *, crash_ok: bool = False
) -> list[int | None]:
    """Run ``fn(rank, world, args)`` on ``world`` ranks; their exit codes. Unless
    ``crash_ok``, any failed rank fails the caller with its traceback."""
    base.mkdir(parents=True, exist_ok=True)
    rdv = base / f"rdv.{os.getpid()}.{len(list(base.iterdir()))}"
    ctx = mp.get_context("fork")
    procs = [
        ctx.Process(target=_child, args=(r, world, (str(rdv), str(base)), (fn, args)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        live = {p.sentinel: p for p in procs}
        while live:
            ready = wait(list(live), timeout=JOIN_GUARD)
            if not ready:
                break  # hung: killed below
            for s in ready:
                live.pop(s).join()  # type: ignore[arg-type]
            if crash_ok and any(p.exitcode == -signal.SIGKILL for p in procs):
                break  # a rank died: the others cannot finish their collectives
    finally:
        for p in procs:
            if p.exitcode is None and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
            p.join()
    codes = [p.exitcode for p in procs]
    if not crash_ok and any(c != 0 for c in codes):
        errs = "\n".join(f.read_text() for f in sorted(base.glob("err.*")))
        raise AssertionError(f"ranks exited {codes}:\n{errs}")
    return codes


def sharded_model(world: int, *, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model sharded with FSDP2 over all ranks, trained one step (so the optimizer has
    state), identical on every run with the same seed."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(seed + 1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def plain_model(*, seed: int = 100) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same architecture, unsharded, with other values (what a load must overwrite)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt
