"""``python -m benchmarks [SUITE|all]``: ratios against same-run baselines.

Targets (time ratios ours/baseline, lower is better):
- local (256 MiB and 1 GiB, 15 runs a side by default): ``verify`` full <= 1.0x a plain
  ``readinto`` read at its best buffer size, warm cache, and <= 1.02x cold; commit via
  ``stage()`` >= 0.9x the throughput of ``fio`` writing with ``O_DIRECT`` and 16 writes in flight
  (its own timing) plus an ``fsync``
  (time ratio <= 1.11; ``dd oflag=direct`` reported beside it) and <= 0.75x the time of a naive
  write + fsync of the final name; peak RSS reported.
- smb: commit of 512 MiB <= 1.11x a raw ``smbclient.open_file`` write + flush to the same server
  (throughput >= 0.9x) while also hashing and checking.
- bridge (FUSE passthrough): commit vs plain write + fsync through the same mount, reported,
  with and without the read-back.
- s3: 1 GiB ``put_file`` to moto and to ``rclone serve s3`` vs ``s3fs.put_file`` (at its
  defaults, and configured as our client is: no payload signing, no CRC32 on plain HTTP) and
  ``rclone copyto`` (at its defaults, and with its documented upload options) of the same file to
  the same server: at least as fast as the fastest baseline (ratio <= 1.0 against it); peak RSS
  < 256 MiB.
- s3resume: resume of the newest of four checkpoints from moto and ``rclone serve s3``
  (``latest(level="size")`` + hash-verified ``get_file``) vs one ``s3fs.get_file`` of it: time
  ratio <= 1.05, bytes the server sent (counted at a proxy) <= 1.05x one download.
- uploadresume: a ``put_file`` to moto, to ``rclone serve s3``, to fake-gcs-server and to
  Azurite whose writer is SIGKILLed at ~80% of its parts (GCS: chunks, Azure: blocks), put
  again: bytes sent <= the share of parts missing + 0.02 of one whole ``put_file`` (256 MiB,
  counted at a proxy); the same for a background S3 (moto) mirror's copy, killed with its
  process and completed from the owed journal by a restarted process, vs one whole copy.
- scale: a dry-run prune plan and ``latest(level="size")`` over 10,000 artifacts, first scan
  (no record cache) on moto < 5 s each; warm and local reported.
- gcs: the same against fake-gcs-server vs ``gcsfs.put_file`` (its default chunk size, and its
  documented larger chunks), the bucket emptied before every run.
- dcp: a 2-rank ``dcp.save`` through ``commitstore.dcp.StorageWriter`` to a local store vs
  ``dcp.FileSystemWriter`` to a plain folder on the same disk, <= 1.10x (perf_counter in rank 0).
- mirrors: time ``stage()``+commit blocks the caller with two background mirrors (local + moto)
  vs none, <= 1.10x; ``sync()`` of 20 x 64 MiB to a local folder and moto vs ``rclone copy
  --checksum`` of the same set to the same targets (one after the other: <= 1.0; both at once:
  <= 0.95), peak RSS < 256 MiB.
- torch: ``commitstore.torch.save`` of a 1 GiB state_dict vs ``torch.save`` + fsync <= 1.05x;
  warm resume ``load(mmap=True)`` vs ``torch.load(mmap=True)`` of a plain file <= 1.05x; on S3
  the bytes served for a resume <= 1.0x one download (in-process, perf_counter).
- asyncsave: time until ``commitstore.torch.save_async`` returns vs the synchronous ``save`` of a
  1 GiB state dict <= 0.15, and vs ``dcp.async_save`` returning <= 1.0; a training-shaped loop
  with asynchronous checkpoints vs none <= 1.10; peak RSS overhead with ``async_inflight=1``.
- scrub: ``scrub()`` of a primary and a local mirror (8 artifacts each, every copy in full) vs a
  plain ``readinto`` read of the same copies, <= 1.10x, warm cache and cold.

Every timed run of a pair starts from the same quiet state (``_harness.quiet``) in a shuffled
order; suites on local storage take at least 8 runs a side by default, the others 5. Each ratio
is a median with a 95% bootstrap interval; a target is met only when the interval's upper bound
meets it ("within noise" when only the median does).
"""

from __future__ import annotations

import argparse
import os

from . import (
    _harness,
    asyncsave,
    bridge,
    dcp,
    gcs,
    local,
    mirrors,
    s3,
    s3resume,
    scale,
    scrub,
    smb,
    torchio,
    uploadresume,
)
from ._harness import LOCAL_MIN_RUNS, mark_start

SUITES = {
    "local": local.main,
    "smb": smb.main,
    "bridge": bridge.main,
    "s3": s3.main,
    "s3resume": s3resume.main,
    "uploadresume": uploadresume.main,
    "gcs": gcs.main,
    "mirrors": mirrors.main,
    "scale": scale.main,
    "dcp": dcp.main,
    "torch": torchio.main,
    "asyncsave": asyncsave.main,
    "scrub": scrub.main,
}

DEFAULT_REPEAT = {
    "local": 15,
    "bridge": LOCAL_MIN_RUNS,
    "dcp": LOCAL_MIN_RUNS,
    "torch": LOCAL_MIN_RUNS,
    "asyncsave": LOCAL_MIN_RUNS,
    "scrub": LOCAL_MIN_RUNS,
}
"""Runs a side when ``--repeat`` is not given (suites on local storage); the others take 5."""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("suite", nargs="?", default="all", choices=[*SUITES, "all"])
    p.add_argument("--size-mib", type=int, default=None, help="artifact size (suite default)")
    p.add_argument("--repeat", type=int, default=None, help="runs a side (suite default; else 5)")
    p.add_argument(
        "--results-dir",
        default=None,
        help="write result files here instead of benchmarks/results (BENCH_RESULTS_DIR)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=_harness.QUIET["settle_s"],
        help="seconds to settle before each timed run (after sync and dropping caches)",
    )
    p.add_argument(
        "--no-drop-caches",
        action="store_true",
        help="do not drop the page cache before each run (recorded in the result file)",
    )
    p.add_argument("--dir", default=None, help="folder on the disk to measure (local suite)")
    p.add_argument(
        "--local-only",
        action="store_true",
        help="scale suite: measure the local store only (no moto); no results file is written",
    )
    args = p.parse_args(argv)
    if args.results_dir is not None:
        os.environ["BENCH_RESULTS_DIR"] = str(args.results_dir)
    _harness.QUIET["settle_s"] = args.settle
    _harness.QUIET["drop_caches"] = not args.no_drop_caches
    given = args.repeat
    for name, fn in SUITES.items():
        if args.suite in (name, "all"):
            mark_start()
            args.repeat = given if given is not None else DEFAULT_REPEAT.get(name, 5)
            fn(args)


if __name__ == "__main__":
    main()
