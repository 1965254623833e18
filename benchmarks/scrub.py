"""Scrub: a full scrub of a primary and a local mirror vs a plain read of the same copies."""

from __future__ import annotations

import argparse
import os
import random
import tempfile
from pathlib import Path
from typing import Any

from commitstore import open_store

from ._harness import MiB, pair, report

ARTIFACTS = 8
"""Artifacts of size/ARTIFACTS bytes each, on the primary and on the mirror."""
THROUGHPUT = "throughput: scrub() of a primary and a local mirror vs a plain read of every copy"
COLD = "the same, every copy's pages evicted first (a scrub reads data not read lately)"
TARGETS = {THROUGHPUT: 1.10, COLD: 1.10}


def prepare(root: Path, size: int) -> None:
    """The store the suite's ops read: ``root/primary`` with the mirror ``root/mirror``, both
    holding ``ARTIFACTS`` artifacts of ``size // ARTIFACTS`` random bytes."""
    each = max(1, size // ARTIFACTS)
    rng = random.Random(0)
    block = rng.randbytes(min(each, 4 * MiB))
    with open_store(str(root / "primary"), mirrors=[str(root / "mirror")], mirror_mode="sync") as s:
        for i in range(ARTIFACTS):
            body = (block * (each // len(block) + 1))[:each]
            s.put_bytes(f"step_{i:03d}.pt", bytes([i]) + body[1:])
    os.sync()


def measure(root: Path, size: int, repeat: int, *, cold: bool = False) -> dict[str, Any]:
    """``pair`` of the plain read and the scrub over the store :func:`prepare` made: warm cache
    on both sides (the copies were just written, then read by each run), or with ``cold``
    every copy's pages evicted before each run. A scrub also lists both targets and writes
    each one's scrub state (a fixed cost of a few small durable writes)."""
    env = {"BENCH_COLD": "1"} if cold else None
    return pair("read_copies", "scrub_copies", str(root), size, repeat, env=env)


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 512) * MiB
    with tempfile.TemporaryDirectory(prefix="cs-bench-scrub-") as tmp:
        root = Path(tmp)
        prepare(root, size)
        results = {
            THROUGHPUT: measure(root, size * 2, args.repeat),
            COLD: measure(root, size * 2, args.repeat, cold=True),
        }
    report(
        f"scrub, {ARTIFACTS} x {size // ARTIFACTS // MiB} MiB on a primary and a mirror, "
        f"{args.repeat} runs each, medians",
        results,
        TARGETS,
        suite="scrub",
    )
