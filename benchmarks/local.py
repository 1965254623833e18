"""Local disk: commit and verify against the physical limits measured in the same run.

Baselines: ``fio`` writing with ``O_DIRECT`` and 16 writes in flight (the device's write limit;
``dd if=/dev/zero bs=16M oflag=direct``, one write in flight, beside it, and the direct writer's
own ``pwrite`` pattern without the library, ``worker.direct_writes``), a naive write of the
final name + fsync (the unsafe way), a plain ``readinto`` read into one preallocated buffer
(warm and cold cache) at its best buffer size, and xxh3_128 of a buffer already in memory (the
hash's own limit). Small commits: ``put_bytes`` of 1 KiB artifacts against a write of each to
its final name + ``fsync`` of the file and of its folder (:func:`_measure_small`), and against
the same crash-ordered syscalls made without the library (``worker.small_floor``: what the
order itself costs; reported, no target).

Reads: before the read pairs, ``plain_read`` is swept over the buffer sizes of
``worker.READ_BUFFERS`` (128 KiB to the whole file; warm, then cold), and each pair's baseline
reads with the size that was fastest by median in that sweep (the sweep is kept in the result
file, ``read_sweeps``). Every timed run of either side starts from the same quiet state
(``_harness.quiet``: for writes, the previous file and the store's records deleted first; then
``sync``, the page cache dropped where permitted, a settle), and a warm pair's run reads its file
once, untimed, after it. Runs: ``--repeat`` a side (15 for this suite by default, at least
``LOCAL_MIN_RUNS`` recommended), in a shuffled order.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ._harness import MiB, pair, report, run, sweep
from .worker import READ_BUFFERS, SMALL_BYTES

SIZES_MIB = (256, 1024)
REPEAT = 15
"""Alternating pairs per measurement when ``--repeat`` is not given."""
SWEEP_REPEAT = 5

TARGETS = {
    "commit_vs_fio_direct": 1 / 0.9,  # >= 0.9x of the device's throughput
    "commit_vs_naive_write_fsync": 0.75,
    "verify_full_warm_vs_readinto_warm": 1.0,
    "verify_full_cold_vs_readinto_cold": 1.02,
    "small_commit_vs_naive_write_fsync_dir": 2.0,
}
SMALL_COMMITS = 50
"""How many commits of :data:`worker.SMALL_BYTES` one run of the small-commit pair makes, timed
together (one commit lasts a few syncs: too short to time alone)."""


def _measure_small(tmp: str, repeat: int) -> dict[str, Any]:
    """Small commits: ``put_bytes`` of 1 KiB artifacts against writing each to its final name
    with an ``fsync`` of the file and of its folder, the same count a side, each run from a
    folder emptied and synced (``clear``) and the quiet state."""
    folder = Path(tmp) / "small"
    folder.mkdir()

    def clear() -> None:
        shutil.rmtree(folder)
        folder.mkdir()
        os.sync()

    size = SMALL_COMMITS * SMALL_BYTES
    return pair("naive_small", "small_commit", str(folder / "item"), size, repeat, clear=clear)


def _measure_small_floor(tmp: str, repeat: int) -> dict[str, Any]:
    """Small commits against their protocol floor (``worker.small_floor``), as
    :func:`_measure_small` measures them against the naive write."""
    folder = Path(tmp) / "floor"
    folder.mkdir()

    def clear() -> None:
        shutil.rmtree(folder)
        folder.mkdir()
        os.sync()

    size = SMALL_COMMITS * SMALL_BYTES
    return pair("small_floor", "small_commit", str(folder / "item"), size, repeat, clear=clear)


def _measure(tmp: str, size: int, repeat: int, sweeps: dict[str, Any]) -> dict[str, dict[str, Any]]:
    target = Path(tmp) / "artifact.bin"
    t = str(target)

    def clear() -> None:
        target.unlink(missing_ok=True)
        shutil.rmtree(target.parent / ".commitstore", ignore_errors=True)
        os.sync()

    def warm() -> None:  # untimed, after the quiet state: the file's pages back in the cache
        run("plain_read", t, size)

    run("naive_write", t, size)  # warm-up: the first big write after boot is slow
    results = {
        "commit_vs_fio_direct": pair("fio_direct", "stage_commit", t, size, repeat, clear=clear),
        "commit_vs_dd_direct": pair("dd_direct", "stage_commit", t, size, repeat, clear=clear),
        "commit_vs_its_direct_writes": pair(
            "direct_writes", "stage_commit", t, size, repeat, clear=clear
        ),
        "commit_vs_naive_write_fsync": pair(
            "naive_write", "stage_commit", t, size, repeat, clear=clear
        ),
        "commit_vs_commit_without_writeback": pair(
            "stage_commit_no_writeback", "stage_commit", t, size, repeat, clear=clear
        ),
    }
    clear()
    run("stage_commit", t, size)  # the file verify reads must carry a record
    variants = {name: {"BENCH_READ_BUFFER": name} for name in READ_BUFFERS}
    mib = size // MiB
    sweep_repeat = min(SWEEP_REPEAT, repeat)
    warm_sweep = sweeps[f"plain_read warm, {mib} MiB"] = sweep(
        "plain_read", t, size, variants, sweep_repeat, prepare=warm
    )
    cold_sweep = sweeps[f"plain_read cold, {mib} MiB"] = sweep(
        "plain_read_cold", t, size, variants, sweep_repeat
    )
    best_warm, best_cold = variants[warm_sweep["best"]], variants[cold_sweep["best"]]
    results["verify_full_warm_vs_readinto_warm"] = pair(
        "plain_read", "verify_full", t, size, repeat, prepare=warm, env=best_warm
    )
    results["verify_full_cold_vs_readinto_cold"] = pair(
        "plain_read_cold", "verify_full_cold", t, size, repeat, env=best_cold
    )
    results["xxh3_in_memory_vs_readinto_warm"] = pair(
        "plain_read", "xxh3_memory", t, size, repeat, prepare=warm, env=best_warm
    )
    return results


def main(args: argparse.Namespace) -> None:
    sizes = (args.size_mib,) if args.size_mib else SIZES_MIB
    repeat = args.repeat or REPEAT
    results: dict[str, dict[str, Any]] = {}
    targets: dict[str, float] = {}
    sweeps: dict[str, Any] = {}
    for mib in sizes:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="cs-bench-") as tmp:
            for name, r in _measure(tmp, mib * MiB, repeat, sweeps).items():
                results[f"{name}, {mib} MiB"] = r
                if name in TARGETS:
                    targets[f"{name}, {mib} MiB"] = TARGETS[name]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cs-bench-") as tmp:
        name = "small_commit_vs_naive_write_fsync_dir"
        results[f"{name}, 1 KiB x {SMALL_COMMITS}"] = _measure_small(tmp, repeat)
        targets[f"{name}, 1 KiB x {SMALL_COMMITS}"] = TARGETS[name]
        floor = f"small_commit_vs_same_syncs_without_the_library, 1 KiB x {SMALL_COMMITS}"
        results[floor] = _measure_small_floor(tmp, repeat)
    report(
        f"local, {' and '.join(f'{m} MiB' for m in sizes)}, {repeat} runs a side "
        "(shuffled, each from the quiet state), medians",
        results,
        targets,
        suite="local",
        extra={"read_sweeps": sweeps},
    )
