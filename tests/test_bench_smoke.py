"""Every benchmark suite runs end to end at tiny sizes (structure only, never timing).

Each suite's ``main`` runs in this process with one or two runs a side, no settle and no cache
drop (a shared test machine), into a temporary results folder: the repository's result files
are left alone, and each file written has its measurements with ratios, ordered intervals, a
verdict that is one of the three words where there is a target, and no figure that contradicts
its own runs (what the docs check recomputes).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest
from benchmarks import (
    _harness,
    asyncsave,
    bridge,
    dcp,
    gcs,
    local,
    mirrors,
    render,
    s3,
    s3resume,
    scale,
    scrub,
    smb,
    torchio,
    uploadresume,
)

ROOT = Path(__file__).resolve().parent.parent
SUITES: dict[str, tuple[Any, int, int, tuple[str, ...]]] = {
    # suite: (module, --size-mib (scale: a count), --repeat, the result files it writes)
    "local": (local, 4, 1, ("local",)),
    "smb": (smb, 4, 1, ("smb",)),
    "bridge": (bridge, 4, 1, ("bridge",)),
    "s3": (s3, 4, 1, ("s3",)),
    "s3resume": (s3resume, 4, 1, ("s3resume", "s3resume-bytes")),
    "gcs": (gcs, 4, 1, ("gcs",)),
    "mirrors": (mirrors, 20, 1, ("mirrors",)),
    "scale": (scale, 20, 1, ("scale", "scale-folder")),
    "dcp": (dcp, 16, 2, ("dcp_local",)),
    "torch": (torchio, 4, 2, ("torch", "torch-s3")),
    "asyncsave": (asyncsave, 4, 2, ("asyncsave",)),
    "scrub": (scrub, 8, 1, ("scrub",)),
    "uploadresume": (uploadresume, 48, 1, ("uploadresume",)),
}


def _snapshot() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((ROOT / "benchmarks/results").glob("*"))}


def _check_measurement(name: str, r: dict[str, Any]) -> None:
    if "prune_plan_s" in r or "whole store" in r:  # scale: times against an absolute target
        assert r["artifacts"] > 0, name
        return
    assert isinstance(r["ratio"], float) and math.isfinite(r["ratio"]) and r["ratio"] >= 0, name
    if "ours_runs_s" in r:
        lo, hi = r["ratio_interval_95"]
        assert 0 <= lo <= hi, (name, lo, hi)
    if r.get("target") is not None:
        assert _word(r) in _harness.VERDICTS, (name, r)
        _, word = render.judged(r)
        assert _word(r) == word, name


def _word(r: dict[str, Any]) -> str:
    """A measurement's verdict: its ``verdict``, or (a suite that keeps the two flags only)
    the word its ``meets`` and ``within_noise`` say."""
    if "verdict" in r:
        return str(r["verdict"])
    return "meets" if r["meets"] else "within noise" if r["within_noise"] else "misses"


@pytest.mark.parametrize("suite", list(SUITES))
def test_suite_runs_at_tiny_sizes(
    suite: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, size, repeat, files = SUITES[suite]
    out = tmp_path / "benchmarks" / "results"
    monkeypatch.setenv("BENCH_RESULTS_DIR", str(out))
    monkeypatch.setitem(_harness.QUIET, "settle_s", 0.0)
    monkeypatch.setitem(_harness.QUIET, "drop_caches", False)
    monkeypatch.setattr(mirrors, "TRAIN_SECONDS", 0.05)
    before = _snapshot()
    _harness.mark_start()
    module.main(
        argparse.Namespace(
            suite=suite, size_mib=size, repeat=repeat, dir=str(tmp_path), local_only=False
        )
    )
    assert _snapshot() == before, "a result file in the repository was written"
    assert sorted(p.stem for p in out.glob("*.json")) == sorted(files)
    for stem in files:
        doc = json.loads((out / f"{stem}.json").read_text())
        assert doc["measurements"], stem
        for name, r in doc["measurements"].items():
            _check_measurement(f"{stem}: {name}", r)
        assert render.contradictions(doc) == [], stem
        if "quiet_state" in doc:
            assert doc["quiet_state"]["drop_caches"] in (
                {},
                {"off": doc["quiet_state"]["drop_caches"].get("off")},
            )
        # the file renders (its commit is not in the temporary tree's history: stale)
        assert "**Stale**" in render.render_suite(stem, tmp_path)
