"""Retention, prune and adopt: the pure policy (property-based), the guards on real storage, a
prune racing a committing process, and adoption of pre-commitstore checkpoints."""

from __future__ import annotations

import io
import json
import math
import os
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitstore import ConfigurationError, InvalidNameError, Retention, open_store
from commitstore.maintenance.retention import Candidate, keep_set, plan_target

NOW = 1_800_000_000.0


@st.composite
def targets(draw: st.DrawFn) -> list[list[Candidate]]:
    """A primary and two mirrors, each with any subset of the run's steps, each copy with its own
    mtime (unknown and zero included), wholeness (a full check's answer) and pending flag."""
    steps = draw(st.lists(st.integers(0, 500), min_size=1, max_size=40, unique=True))
    mtime = st.one_of(st.none(), st.just(0.0), st.floats(NOW - 10_000, NOW))

    def cands(names: list[int]) -> list[Candidate]:
        return [
            Candidate(
                f"step_{s}",
                s,
                (True, s, 0.0, f"step_{s}"),
                draw(mtime),
                draw(st.booleans()),
                draw(st.booleans()),
            )
            for s in names
        ]

    subset = st.lists(st.sampled_from(steps), unique=True)
    return [cands(draw(subset)) for _ in range(3)]


@settings(max_examples=300, deadline=None)
@given(
    per_target=targets(),
    keep_last=st.one_of(st.none(), st.integers(0, 15)),
    keep_every=st.one_of(st.none(), st.integers(1, 50)),
    min_age=st.floats(0, 5000),
)
def test_policy_properties(
    per_target: list[list[Candidate]],
    keep_last: int | None,
    keep_every: int | None,
    min_age: float,
) -> None:
    policy = Retention(keep_last=keep_last, keep_every=keep_every, min_age=min_age)
    keep = keep_set([c for cands in per_target for c in cands], policy)
    union_whole = sorted(
        {c.name: c for cands in per_target for c in cands if c.whole}.values(),
        key=lambda c: c.order,
    )
    if keep_last:  # the policy holds over the union: a target's own gaps never shrink it
        assert {c.name for c in union_whole[-keep_last:]} <= keep
    for cands in per_target:
        plan = plan_target(cands, keep, min_age=min_age, now=NOW)
        by_name = {c.name: c for c in cands}
        ordered = sorted(cands, key=lambda c: c.order)
        whole = [c for c in ordered if c.whole]
        if whole:  # the newest verifying artifact of every target survives, and all newer ones
            newest = whole[-1]
            assert newest.name not in plan.delete
            assert not any(c.order > newest.order for c in ordered if c.name in plan.delete)
        else:  # a target where nothing verifies loses nothing
            assert plan.delete == ()
        for name in plan.delete:
            c = by_name[name]
            assert name not in keep  # the one keep-set, identical on every target
            assert c.mtime is not None
            assert c.mtime > 0  # unknown is not old
            assert NOW - c.mtime >= min_age  # nothing younger than min_age
            assert not c.pending  # replication in flight is never pruned
        assert set(plan.keep) == {c.name for c in cands} & keep
        assert set(plan.delete) | set(plan.keep) | set(plan.skipped) == set(by_name)


def test_bad_policy_is_a_typed_error(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for bad in ({"keep_last": -1}, {"keep_every": 0}, {"min_age": -1}, {"min_age": math.nan}):
        with pytest.raises(ConfigurationError):
            store.prune(**bad)
    with pytest.raises(ConfigurationError):
        store.gc(min_age=math.nan)
    with pytest.raises(InvalidNameError):  # a name, and only a name, is an InvalidNameError
        store.prune(keep=["../x"])
    assert not issubclass(ConfigurationError, InvalidNameError)
    assert issubclass(ConfigurationError, ValueError)


def _age(root: Path, seconds: float) -> None:
    old = time.time() - seconds
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(dirpath, f), (old, old))


def test_prune_keeps_last_milestones_and_young(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    for step in range(1, 21):
        store.put_bytes(f"step_{step:04d}.pt", bytes([step]) * 100)
    _age(tmp_path / "s", 3600)
    store.put_bytes("step_0021.pt", b"young")  # just written: younger than min_age
    dry = store.prune(keep_last=3, keep_every=10, dry_run=True)
    assert len(store.list()) == 21
    report = store.prune(keep_last=3, keep_every=10)
    assert report.deleted == dry.deleted
    left = [r.name for r in store.list()]
    assert left == ["step_0010.pt", "step_0019.pt", "step_0020.pt", "step_0021.pt"]
    assert store.verify().ok
    assert store.prune(keep_last=3, keep_every=10).deleted == ()  # idempotent


def test_unknown_mtime_and_newest_whole_survive(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    for step in range(1, 6):
        store.put_bytes(f"step_{step}", b"x" * 10)
    _age(tmp_path / "s", 3600)
    os.utime(tmp_path / "s" / "step_2", (0, 0))  # a network filesystem answering mtime 0
    (tmp_path / "s" / "step_5").write_bytes(b"x")  # the newest is damaged (truncated)
    _age(tmp_path / "s", 3600)
    os.utime(tmp_path / "s" / "step_2", (0, 0))
    report = store.prune(keep_last=1)
    assert report.skipped["step_2"] == "unknown mtime"
    assert report.kept == ("step_4",)  # the keep-set counts whole artifacts only
    assert "fails its check" in report.skipped["step_5"]  # damaged, left for inspection
    assert sorted(report.deleted) == ["step_1", "step_3"]
    latest = store.latest()
    assert latest is not None
    assert latest.name == "step_4"


def test_automatic_retention_after_each_commit(tmp_path: Path) -> None:
    mirror = tmp_path / "m"
    store = open_store(
        tmp_path / "p",
        mirrors=[str(mirror)],
        mirror_mode="sync",
        retention=Retention(keep_last=2, min_age=0),
    )
    for step in range(1, 7):
        store.put_bytes(f"step_{step}", b"s" * step)
    assert [r.name for r in store.list()] == ["step_5", "step_6"]
    assert [r.name for r in open_store(mirror).list()] == ["step_5", "step_6"]


PRUNER = """
import json, sys, time
from commitstore import open_store
root, rounds = sys.argv[1], int(sys.argv[2])
store = open_store(root)
deleted, bad = [], 0
for _ in range(rounds):
    deleted += store.prune(keep_last=3, min_age=0).deleted
    rec = store.latest(level="full")
    if rec is None or not store.verify(rec.name).ok:
        bad += 1
print(json.dumps({"deleted": deleted, "bad": bad}))
"""


def test_prune_racing_a_committing_process(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("step_00000.pt", b"seed")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom commitstore import open_store\n"
            "s = open_store(sys.argv[1])\n"
            "for i in range(1, 301):\n"
            "    s.put_bytes(f'step_{i:05d}.pt', bytes([i % 256]) * 20000)\n",
            str(root),
        ],
    )
    pruner = subprocess.run(
        [sys.executable, "-c", PRUNER, str(root), "150"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert writer.wait(300) == 0
    assert pruner.returncode == 0, pruner.stderr
    doc = json.loads(pruner.stdout)
    assert doc["bad"] == 0  # latest() always returned a whole artifact
    committed = {"step_00000.pt"} | {f"step_{i:05d}.pt" for i in range(1, 301)}
    remaining = {r.name for r in store.list()}
    assert committed == remaining | set(doc["deleted"])  # nothing vanished unasked
    assert "step_00300.pt" in remaining
    assert store.verify().ok


def _torch_like(n: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for i in range(n):
            z.writestr(f"archive/data/{i}", os.urandom(50_000))
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    return buf.getvalue()


def _safetensors() -> bytes:
    header = {
        "a": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]},
        "b": {"dtype": "F32", "shape": [500], "data_offsets": [4000, 6000]},
        "__metadata__": {"format": "pt"},
    }
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + os.urandom(6000)


def test_adopt_whole_and_refuses_truncated(tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    pt, st_ = _torch_like(6), _safetensors()
    (root / "step_0100.pt").write_bytes(pt)
    (root / "step_0200.pt").write_bytes(pt[: int(len(pt) * 0.74)])  # header intact, tail missing
    (root / "step_0300.pt").write_bytes(pt[:-10])  # end-of-central-directory cut
    (root / "step_0400.pt").write_bytes(pt[: len(pt) // 2])
    (root / "model-100.safetensors").write_bytes(st_)
    (root / "model-200.safetensors").write_bytes(st_[:-1000])
    (root / "notes-1.dat").write_bytes(b"who knows")
    store = open_store(root)
    report = store.adopt()
    assert sorted(report.adopted) == ["model-100.safetensors", "step_0100.pt"]
    assert set(report.rejected) == {
        "step_0200.pt",
        "step_0300.pt",
        "step_0400.pt",
        "model-200.safetensors",
        "notes-1.dat",
    }
    assert "unknown format" in report.rejected["notes-1.dat"]
    assert sorted(r.name for r in store.list()) == ["model-100.safetensors", "step_0100.pt"]
    assert store.verify("step_0100.pt").ok
    latest = store.latest()
    assert latest is not None
    assert latest.name == "step_0100.pt"
    trusted = store.adopt("notes-1.dat", trust=True)
    assert trusted.adopted == ("notes-1.dat",)
    assert store.adopt().adopted == ()  # nothing new: idempotent
    res = subprocess.run(
        [sys.executable, "-m", "commitstore", "adopt", str(root), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 1  # truncated files were found
    assert "step_0400.pt" in json.loads(res.stdout)["rejected"]
