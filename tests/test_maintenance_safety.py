"""Prune and gc against the cases that lose data: bit rot in the newest checkpoint, a fresh primary
beside a mirror holding the history, an overwrite between plan and delete, staging-like names
inside committed folders, a staging folder being filled by another process with old mtimes, empty
staging folders of killed writers, and adopt racing a writer."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from commitstore import ConfigurationError, Retention, digest, open_store
from commitstore.maintenance import prune as prune_mod
from commitstore.maintenance import retention
from commitstore.testing import S3Backdoor

from .helpers.s3servers import BUCKET, MotoServer


def _age(root: Path, seconds: float) -> None:
    old = time.time() - seconds
    for dirpath, dirs, files in os.walk(root):
        for f in (*files, *dirs):
            os.utime(os.path.join(dirpath, f), (old, old), follow_symlinks=False)


def _rot(path: Path) -> None:
    """Flip one byte in place: same size, other bytes (bit rot)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    st = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, (st.st_atime, st.st_mtime))


def _s3(moto: MotoServer) -> tuple[Any, S3Backdoor, str]:
    prefix = f"t{time.monotonic_ns()}"
    url = moto.url(prefix)
    return open_store(url, **moto.options()), S3Backdoor(moto.client(), BUCKET, prefix), url


# -- bug 1: the newest-good guard must hash, not compare sizes --------------------------------
def test_bit_rot_in_newest_keeps_the_older_good_one_local(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("step_1.pt", os.urandom(4096))
    store.put_bytes("step_2.pt", os.urandom(4096))
    _age(root, 3600)
    _rot(root / "step_2.pt")
    assert store.verify("step_2.pt", level="size").ok
    assert not store.verify("step_2.pt", level="full").ok
    report = store.prune(keep_last=1)
    assert "step_1.pt" not in report.deleted
    assert "step_2.pt" not in report.deleted  # the damaged newest is left for inspection
    latest = store.latest(level="full")
    assert latest is not None
    assert latest.name == "step_1.pt"


def test_bit_rot_in_newest_folder_artifact_local(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    for step in (1, 2):
        with store.stage_dir(f"ckpt_{step}") as d:
            (d / "model.bin").write_bytes(os.urandom(2048))
            (d / "opt.bin").write_bytes(os.urandom(2048))
    _age(root, 3600)
    _rot(root / "ckpt_2" / "opt.bin")
    store.prune(keep_last=1)
    latest = store.latest(level="full")
    assert latest is not None
    assert latest.name == "ckpt_1"


def test_bit_rot_in_newest_keeps_the_older_good_one_s3(moto: MotoServer) -> None:
    store, door, _url = _s3(moto)
    store.put_bytes("step_1.pt", os.urandom(4096))
    data = bytearray(os.urandom(4096))
    store.put_bytes("step_2.pt", bytes(data))
    data[100] ^= 0xFF
    door.write("step_2.pt", bytes(data))  # same size: the size level and the listing agree
    assert store.verify("step_2.pt", level="size").ok
    report = store.prune(keep_last=1, min_age=0)
    assert "step_1.pt" not in report.deleted
    latest = store.latest(level="full")
    assert latest is not None
    assert latest.name == "step_1.pt"


# -- bug 2: the keep-set comes from every target ----------------------------------------------
def test_fresh_primary_keeps_the_mirrors_history_local(tmp_path: Path) -> None:
    mirror = tmp_path / "m"
    history = open_store(mirror)
    for step in range(1, 11):
        history.put_bytes(f"step_{step:04d}.pt", os.urandom(1000))
    _age(mirror, 3600)
    store = open_store(tmp_path / "p", mirrors=[str(mirror)], mirror_mode="sync")
    report = store.prune(keep_last=3)
    left = [r.name for r in open_store(mirror).list()]
    assert left == ["step_0008.pt", "step_0009.pt", "step_0010.pt"], report
    assert report.targets[0].deleted == ()
    # The primary catches up (a new machine continuing the run): the policy holds over both.
    store.put_bytes("step_0011.pt", os.urandom(1000))
    _age(tmp_path / "p", 3600)
    _age(mirror, 3600)
    store.prune(keep_last=3)
    assert [r.name for r in open_store(mirror).list()] == [
        "step_0009.pt",
        "step_0010.pt",
        "step_0011.pt",
    ]
    assert [r.name for r in store.list()] == ["step_0011.pt"]
    store.close()


def test_fresh_primary_keeps_the_mirrors_history_s3(tmp_path: Path, moto: MotoServer) -> None:
    mirror, _door, _url = _s3(moto)
    for step in range(1, 8):
        mirror.put_bytes(f"step_{step:04d}.pt", os.urandom(1000))
    store = open_store(tmp_path / "p", mirrors=[mirror], mirror_mode="sync")
    store.put_bytes("other_0001.pt", b"fresh machine", step=1)  # the primary's only artifact
    store.prune(keep_last=3, min_age=0)
    assert [r.name for r in mirror.list()] == ["step_0005.pt", "step_0006.pt", "step_0007.pt"]
    assert [r.name for r in store.list()] == ["other_0001.pt"]  # its newest whole one
    store.close()


# -- bug 3: every delete re-checks what was planned ------------------------------------------
@pytest.mark.parametrize("min_age", [300, 0])
def test_overwrite_between_plan_and_delete_is_not_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, min_age: float
) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    for step in range(1, 5):
        store.put_bytes(f"step_{step}", bytes([step]) * 100)
    _age(root, 3600)
    other = open_store(root)  # another process's view of the same store
    planned = retention.plan_target
    seen: dict[str, Any] = {}

    def plan_then_overwrite(*args: Any, **kw: Any) -> Any:
        plan = planned(*args, **kw)
        if seen:  # overwrite once, after the first plan that deletes step_1
            return plan
        assert "step_1" in plan.delete
        seen["before"] = other.record("step_1")
        other.put_bytes("step_1", b"new bytes, just committed", overwrite=True)
        seen["after"] = other.record("step_1")
        return plan

    monkeypatch.setattr(prune_mod, "plan_target", plan_then_overwrite)
    report = store.prune(keep_last=1, min_age=min_age)
    assert seen["before"].digest != seen["after"].digest  # the overwrite did happen in between
    assert "step_1" not in report.deleted
    assert "step_1" in report.skipped
    assert store.read_bytes("step_1") == b"new bytes, just committed"
    assert sorted(report.deleted) == ["step_2", "step_3"]


# -- bug 4: gc ---------------------------------------------------------------------------------
def test_gc_keeps_staging_like_names_inside_a_committed_folder(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    with store.stage_dir("ckpt_1") as d:
        (d / ".commitstore.tmp.cache").write_bytes(b"framework cache")
        (d / "sub").mkdir()
        (d / "sub" / ".commitstore.tmp.x").mkdir()
        (d / "sub" / ".commitstore.tmp.x" / "f").write_bytes(b"inner")
        (d / "model.bin").write_bytes(b"weights")
    time.sleep(0.05)
    report = store.gc(min_age=0)  # no age protects it: only the records do
    assert report.removed == ()
    assert report.kept == ()
    assert store.verify("ckpt_1", level="full").ok


def test_gc_still_removes_real_leftovers_older_than_min_age(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("run/step_1", b"x")
    (root / "run" / ".commitstore.tmp.0123456789abcdef.step_2").write_bytes(b"partial")
    (root / ".commitstore.tmp.fedcba9876543210.ckpt").mkdir()
    (root / ".commitstore.tmp.fedcba9876543210.ckpt" / "a").write_bytes(b"partial")
    time.sleep(0.05)
    assert {i.path for i in store.gc(min_age=0).removed} == {
        "run/.commitstore.tmp.0123456789abcdef.step_2",
        ".commitstore.tmp.fedcba9876543210.ckpt",
    }
    assert store.verify().ok


def test_gc_removes_old_empty_staging_folders_keeps_fresh(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("step_1", b"x")
    old = root / ".commitstore.tmp.aaaaaaaaaaaaaaaa.ckpt_1"
    fresh = root / ".commitstore.tmp.bbbbbbbbbbbbbbbb.ckpt_2"
    old.mkdir()  # a killed writer's, before it wrote a byte (ctime cannot be set back: wait)
    time.sleep(1.5)
    fresh.mkdir()
    dry = store.gc(min_age=1.0, dry_run=True)
    assert [i.path for i in dry.removed] == [old.name]
    assert old.exists()
    report = store.gc(min_age=1.0)
    assert [i.path for i in report.removed] == [old.name]
    assert [(i.path, i.reason) for i in report.kept] == [(fresh.name, "younger than min_age")]
    assert not old.exists()
    assert fresh.exists()


FILLER = """
import os, shutil, sys, time
from pathlib import Path
from commitstore import open_store
root, src, flag = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
copied = []
def slow_copy(s, d):
    shutil.copy2(s, d)  # copies the file's old mtime, as copytree does
    copied.append(d)
    if len(copied) == 5:
        (flag / "half").write_text("mid-copy")
        while not (flag / "gc_done").exists():
            time.sleep(0.01)
with open_store(root).stage_dir("ckpt_copied") as d:
    shutil.copytree(src, d, dirs_exist_ok=True, copy_function=slow_copy)
(flag / "done").write_text("committed")
"""


def test_gc_spares_a_stage_dir_another_process_fills_with_old_mtimes(tmp_path: Path) -> None:
    root, src, flag = tmp_path / "s", tmp_path / "src", tmp_path / "flag"
    flag.mkdir()
    (src / "shards").mkdir(parents=True)
    for i in range(10):
        (src / "shards" / f"{i}.bin").write_bytes(os.urandom(1000))
    _age(src, 7200)  # old checkpoints being re-published
    store = open_store(root)
    store.put_bytes("step_1", b"x")
    proc = subprocess.Popen([sys.executable, "-c", FILLER, str(root), str(src), str(flag)])
    try:
        deadline = time.monotonic() + 60
        while not (flag / "half").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        staging = [p for p in root.iterdir() if p.name.startswith(".commitstore.tmp.")]
        assert len(staging) == 1  # the other process is mid-copy into its staging folder
        report = store.gc()  # default min_age
        assert not (flag / "done").exists()
        assert report.removed == ()
        assert [i.reason for i in report.kept] == ["held by a live writer"]
    finally:
        (flag / "gc_done").write_text("go")
        assert proc.wait(60) == 0
    assert (flag / "done").exists()
    assert store.verify("ckpt_copied", level="full").ok


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1, -0.5])
def test_gc_and_prune_refuse_bad_ages(tmp_path: Path, bad: float) -> None:
    store = open_store(tmp_path / "s")
    with pytest.raises(ConfigurationError):
        store.gc(min_age=bad)
    with pytest.raises(ConfigurationError):
        store.prune(keep_last=1, min_age=bad)
    with pytest.raises(ConfigurationError):
        Retention(keep_last=1, min_age=bad)


# -- 5: adopt racing a writer ----------------------------------------------------------------
def test_adopt_never_records_data_a_concurrent_commit_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from commitstore.maintenance import adopt as adopt_mod

    root = tmp_path / "s"
    root.mkdir()
    (root / "notes-1.dat").write_bytes(b"old bytes without a record")
    store = open_store(root)
    writer = open_store(root)
    hashed = digest.hash_stream
    raced: list[bool] = []

    def hash_then_commit(f: Any) -> tuple[int, str]:
        out = hashed(f)
        writer.put_bytes("notes-1.dat", b"a writer's commit", overwrite=True)
        raced.append(True)
        return out

    monkeypatch.setattr(adopt_mod, "hash_stream", hash_then_commit)
    report = store.adopt(trust=True)
    assert raced == [True]
    assert report.adopted == ()
    assert "notes-1.dat" in report.rejected
    assert store.read_bytes("notes-1.dat") == b"a writer's commit"
    assert store.verify().ok


def test_adopt_never_records_data_replaced_without_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data replaced between adopt's hash and its record (a writer killed between data and
    record): the record adopt would write no longer describes the data, so none is written."""
    from commitstore.maintenance import adopt as adopt_mod

    root = tmp_path / "s"
    root.mkdir()
    (root / "notes-1.dat").write_bytes(b"old bytes without a record")
    store = open_store(root)
    hashed = digest.hash_stream

    def hash_then_replace(f: Any) -> tuple[int, str]:
        out = hashed(f)
        tmp = root / ".commitstore.tmp.0000000000000000.notes-1.dat"
        tmp.write_bytes(b"other bytes, other length")
        os.replace(tmp, root / "notes-1.dat")
        return out

    monkeypatch.setattr(adopt_mod, "hash_stream", hash_then_replace)
    report = store.adopt(trust=True)
    assert report.adopted == ()
    assert "notes-1.dat" in report.rejected
    assert store.verify().ok
