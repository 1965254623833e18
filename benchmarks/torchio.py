"""commitstore.torch vs plain torch: in-process, ``time.perf_counter``, shuffled runs, medians.

- save: ``commitstore.torch.save`` of a state_dict vs ``torch.save`` to a local file + fsync
  (target <= 1.05x).
- resume: ``commitstore.torch.load(mmap=True)`` with a warm cache (the verified copy already
  fetched) vs ``torch.load(path, mmap=True)`` of a plain file, both touching every tensor
  (target <= 1.05x); the load alone is reported too.
- S3 (moto, through the counting proxy): bytes the server sends for a cold
  ``load(name=None, mmap=True)`` vs one ``GetObject`` of the same object (target <= 1.05x, the
  S3 resume suite's: the artifact is read once, and the records and the listing come on top),
  and vs ``torch.load`` over an s3fs file.

Results are printed and written to ``benchmarks/results/torch.json`` (timings) and
``benchmarks/results/torch-s3.json`` (bytes), rendered into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._harness import MiB, entry, judge, quiet, report, shuffled, write_results


def _state(size: int) -> dict[str, Any]:
    import torch

    n = 16
    per = max(1, size // n // 4)
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(per, generator=g) for i in range(n)}


def _pair(
    base: tuple[str, Callable[[], object]],
    ours: tuple[str, Callable[[], object]],
    size: int,
    repeat: int,
    *,
    clear: Callable[[], None] | None = None,
    prepare: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Time ``base`` and ``ours`` (label, call) ``repeat`` times each in a shuffled order, each
    run from the quiet state (``clear``, ``_harness.quiet``, ``prepare``, all untimed); the
    shape of ``_harness.pair`` (peak RSS: this one process's, the same for both)."""
    times: dict[str, list[float]] = {"baseline": [], "ours": []}
    calls = {"baseline": base[1], "ours": ours[1]}
    order = shuffled(["baseline", "ours"], repeat)
    for key in order:
        if clear is not None:
            clear()
        quiet()
        if prepare is not None:
            prepare()
        start = time.perf_counter()
        calls[key]()
        times[key].append(time.perf_counter() - start)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        **entry(base[0], ours[0], times["baseline"], times["ours"], size),
        "run_order": order,
        "peak_rss_mib": rss,
        "baseline_peak_rss_mib": rss,
    }


def _touch(state: dict[str, Any]) -> float:
    return float(sum(float(t.sum()) for t in state.values()))


def local(size: int, repeat: int, tmp: Path) -> dict[str, dict[str, Any]]:
    import torch

    import commitstore
    import commitstore.torch as cs_torch

    state = _state(size)
    plain = tmp / "plain" / "model.pt"
    plain.parent.mkdir()

    def torch_save_fsync() -> None:
        with open(plain, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def clear() -> None:
        plain.unlink(missing_ok=True)
        shutil.rmtree(tmp / "store", ignore_errors=True)

    def ours_save() -> None:
        cs_torch.save(state, commitstore.open_store(tmp / "store"), "model.pt")

    out = {
        "save_vs_torch_save_fsync": _pair(
            ("torch.save + fsync", torch_save_fsync),
            ("commitstore.torch.save", ours_save),
            size,
            repeat,
            clear=clear,
        )
    }
    clear()
    torch_save_fsync()
    store = commitstore.open_store(tmp / "store")
    cs_torch.save(state, store, "model.pt")
    cache = tmp / "cache"
    cs_torch.load(store, "model.pt", mmap=True, cache_dir=cache)  # the first resume fills it

    def base_load() -> float:
        return _touch(torch.load(plain, mmap=True, weights_only=True))

    def ours_load() -> float:
        return _touch(cs_torch.load(store, "model.pt", mmap=True, cache_dir=cache))

    def warm() -> None:  # untimed, after the quiet state: both files' pages in the cache
        base_load(), ours_load()

    out["resume_mmap_warm_vs_torch_load_mmap"] = _pair(
        ("torch.load(mmap=True) + touch", base_load),
        ("load(mmap=True), cached + touch", ours_load),
        size,
        repeat,
        prepare=warm,
    )
    out["resume_mmap_warm_load_only"] = _pair(
        ("torch.load(mmap=True)", lambda: torch.load(plain, mmap=True, weights_only=True)),
        (
            "load(mmap=True), cached",
            lambda: cs_torch.load(store, "model.pt", mmap=True, cache_dir=cache),
        ),
        size,
        repeat,
        prepare=warm,
    )
    return out


def s3(size: int, tmp: Path) -> dict[str, dict[str, Any]]:
    import boto3
    import s3fs
    import torch
    from botocore.config import Config
    from tests.helpers.faultproxy import FaultProxy
    from tests.helpers.s3servers import ACCESS_KEY, BUCKET, SECRET_KEY, MotoServer

    import commitstore
    import commitstore.torch as cs_torch

    server = MotoServer(tmp / "moto")
    proxy = FaultProxy(server.port)
    try:
        store = commitstore.open_store(
            server.url("bench"), **{**server.options(), "endpoint_url": proxy.endpoint}
        )
        rec = cs_torch.save(_state(size), store, "model-step1.pt")
        key = f"bench/{rec.name}"

        def served(fn: Callable[[], object]) -> int:
            before = proxy.served
            fn()
            return proxy.served - before

        via = boto3.client(
            "s3",
            endpoint_url=proxy.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

        def one_download() -> bytes:
            body: bytes = via.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            return body

        one = served(one_download)
        fs = s3fs.S3FileSystem(
            key=ACCESS_KEY,
            secret=SECRET_KEY,
            client_kwargs={"endpoint_url": proxy.endpoint, "region_name": "us-east-1"},
        )

        def s3fs_load() -> object:
            with fs.open(f"{BUCKET}/{key}", "rb") as f:
                return torch.load(f, weights_only=True)

        plain = served(s3fs_load)
        ours = served(lambda: cs_torch.load(store, mmap=True, cache_dir=tmp / "s3cache"))
        again = served(lambda: cs_torch.load(store, mmap=True, cache_dir=tmp / "s3cache"))

        def row(ours_label: str, base_label: str, got: int, base: int) -> dict[str, Any]:
            return {
                "ours": ours_label,
                "baseline": base_label,
                "artifact_bytes": rec.size,
                "ours_bytes": got,
                "baseline_bytes": base,
                "ratio": got / base,
            }

        cold = "cold load(name=None, mmap=True)"
        return {
            "s3_resume_bytes_vs_one_download": row(cold, "one GetObject", ours, one),
            "s3_resume_bytes_vs_torch_load_over_s3fs": row(
                cold, "torch.load over s3fs", ours, plain
            ),
            "s3_second_resume_bytes_vs_artifact": row(
                "second load (cache hit)", "the artifact's size", again, rec.size
            ),
        }
    finally:
        proxy.stop()
        server.stop()


TARGETS = {
    "save_vs_torch_save_fsync": 1.05,
    "resume_mmap_warm_vs_torch_load_mmap": 1.05,
    "s3_resume_bytes_vs_one_download": 1.05,
}


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 1024) * MiB
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cs-bench-torch-") as tmp:
        timed = local(size, args.repeat, Path(tmp))
        counted = s3(size, Path(tmp))
    title = (
        f"torch, {size // MiB} MiB state_dict (16 float32 tensors), {args.repeat} runs a side "
        "in one process (shuffled, each from the quiet state), medians"
    )
    note = "Timed in-process with time.perf_counter; peak RSS is the process's, shared by both."
    report(title, timed, TARGETS, suite="torch", notes=note)
    for name, r in counted.items():
        judge(r, TARGETS.get(name))
    write_results(
        "torch-s3",
        f"torch resume on S3 (moto through a counting proxy), {size // MiB} MiB state_dict: bytes "
        "the server sent",
        counted,
        notes="Records and the listing come on top of the one download.",
    )
    for name, r in counted.items():
        print(f"  {name:42s} {r['ours_bytes']} vs {r['baseline_bytes']} bytes: {r['ratio']:.4f}")
