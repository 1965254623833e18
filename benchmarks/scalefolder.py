"""Scale, one folder artifact of many files (10,000 by default): its commit and full verify on a
local store (reported), and its mirror copy to S3 (moto) by ``sync()`` against ``s3fs.put`` of
the same tree, configured as commitstore's own client: time ratio <= 1.0, peak RSS < 256 MiB.

Each run is a fresh Python process (so each side's peak RSS is its own); every run of either
side starts from an emptied bucket and the quiet state, in a shuffled order.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.helpers.s3servers import BUCKET, MotoServer

from commitstore import open_store

from ._harness import ROOT, entry, judge, quiet, shuffled, write_results

FILE_BYTES = 4096
TARGET = 1.0
RSS_LIMIT_MIB = 256
NAME = "tree/ckpt"


def make_tree(where: Path, files: int) -> int:
    """``files`` files of ``FILE_BYTES`` (distinct bytes), 100 to a folder; their total size."""
    for i in range(files):
        path = where / f"d{i // 100:03d}" / f"f{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(i.to_bytes(4, "little") * (FILE_BYTES // 4))
    return files * FILE_BYTES


def _s3fs(endpoint: str, key: str, secret: str) -> Any:
    """s3fs configured as commitstore's own client (as the s3 suite's matched baseline)."""
    from benchmarks.worker import s3fs_like_ours

    return s3fs_like_ours(endpoint, key, secret)


def side(which: str, store_root: str, tree: str, options: dict[str, Any]) -> None:
    """One timed run in this (fresh) process; prints its seconds and peak RSS as JSON."""
    import resource

    if which == "ours":
        mirror = open_store(f"s3://{BUCKET}/ours", **options)
        store = open_store(store_root, mirrors=[mirror])
        t0 = time.perf_counter()
        report = store.sync()
        seconds = time.perf_counter() - t0
        assert report.ok, report
        store.close()
    else:
        fs = _s3fs(options["endpoint_url"], options["key"], options["secret"])
        t0 = time.perf_counter()
        fs.put(tree, f"{BUCKET}/base/{NAME}", recursive=True)
        seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "maxrss_kib": rss}))


def _run(which: str, store_root: Path, tree: Path, options: dict[str, Any]) -> dict[str, float]:
    code = (
        "import sys, json; from benchmarks.scalefolder import side; "
        "side(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, which, str(store_root), str(tree), json.dumps(options)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def _empty(server: MotoServer) -> None:
    client = server.client()
    while True:
        listed = client.list_objects_v2(Bucket=BUCKET).get("Contents", [])
        if not listed:
            return
        client.delete_objects(
            Bucket=BUCKET, Delete={"Objects": [{"Key": o["Key"]} for o in listed]}
        )


def _local(tmp: Path, tree: Path, repeat: int) -> tuple[Path, dict[str, list[float]]]:
    """Commit the tree as one folder artifact ``repeat`` times (a fresh store each time, the
    files copied in through ``stage_dir``), then verify it in full ``repeat`` times; the
    last store is kept for the mirror runs."""
    times: dict[str, list[float]] = {"commit": [], "verify": []}
    root = tmp / "none"
    for i in range(repeat):
        root = tmp / f"store{i}"
        store = open_store(root)
        quiet()
        t0 = time.perf_counter()
        with store.stage_dir(NAME) as out:
            shutil.copytree(tree, out, dirs_exist_ok=True)
        times["commit"].append(time.perf_counter() - t0)
        if i < repeat - 1:
            shutil.rmtree(root)
    store = open_store(root)
    for _ in range(repeat):
        quiet()
        t0 = time.perf_counter()
        assert store.verify(level="full").ok
        times["verify"].append(time.perf_counter() - t0)
    return root, times


def run_folder(tmp: Path, server: MotoServer, files: int, repeat: int) -> None:
    """Measure and write ``scale-folder.json``."""
    tree = tmp / "tree"
    tmp.mkdir(parents=True, exist_ok=True)
    size = make_tree(tree, files)
    store_root, local = _local(tmp, tree, repeat)
    options: dict[str, Any] = dict(server.options())
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "base": []}
    order = shuffled(["ours", "base"], repeat)
    for which in order:
        _empty(server)
        quiet()
        runs[which].append(_run(which, store_root, tree, options))
    _empty(server)
    ours = [r["seconds"] for r in runs["ours"]]
    base = [r["seconds"] for r in runs["base"]]
    m = entry("s3fs.put(tree, recursive=True), matched", "sync() to an S3 mirror", base, ours, size)
    judge(m, TARGET)
    m["run_order"] = ["ours" if w == "ours" else "baseline" for w in order]
    m["peak_rss_mib"] = max(r["maxrss_kib"] for r in runs["ours"]) / 1024
    m["baseline_peak_rss_mib"] = max(r["maxrss_kib"] for r in runs["base"]) / 1024
    m["rss_limit_mib"] = RSS_LIMIT_MIB
    m["files"] = files
    print(
        f"  folder of {files} files to moto: ratio {m['ratio']:.3f} {m['verdict']}; "
        f"peak RSS {m['peak_rss_mib']:.0f} MiB"
    )
    notes = (
        f"One folder artifact of {files} files of {FILE_BYTES} bytes. On the local store "
        f"(medians of {repeat}, reported): commit through `stage_dir` (the files copied in) "
        f"{statistics.median(local['commit']):.2f} s, full verify "
        f"{statistics.median(local['verify']):.2f} s. Peak RSS of the mirror copy: "
        f"{m['peak_rss_mib']:.0f} MiB (limit {RSS_LIMIT_MIB} MiB: "
        f"{'within' if m['peak_rss_mib'] < RSS_LIMIT_MIB else '**over**'})."
    )
    write_results(
        "scale-folder",
        f"scale: a folder artifact of {files} files mirrored to moto, {repeat} runs a side",
        {"mirror to S3 (moto)": m},
        notes=notes,
        extra={"local_s": local},
    )
