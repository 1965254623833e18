"""Local-only guarantees: symlinks never lead writes out of the root; two processes racing."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import threading
from pathlib import Path

import pytest

from commitstore import (
    AlreadyExistsError,
    ConfigurationError,
    IntegrityError,
    InvalidNameError,
    _read,
    open_store,
)
from commitstore.testing import LocalBackdoor, xxh


def test_symlinked_folder_pointing_outside_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    store = open_store(root)
    os.symlink(outside, root / "link")
    with pytest.raises(InvalidNameError):
        store.put_bytes("link/step_1", b"data")
    with pytest.raises(InvalidNameError), store.stage_dir("link/deeper/x"):
        pass
    assert list(outside.iterdir()) == []


def test_symlink_inside_root_is_refused_too(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = open_store(root)
    (root / "real").mkdir(parents=True)
    os.symlink(root / "real", root / "alias")
    with pytest.raises(InvalidNameError):
        store.put_bytes("alias/x", b"data")
    assert list((root / "real").iterdir()) == []


def test_symlink_at_final_name_is_replaced_not_followed(tmp_path: Path) -> None:
    root, target = tmp_path / "root", tmp_path / "victim.txt"
    target.write_bytes(b"precious")
    root.mkdir()
    store = open_store(root)
    os.symlink(target, root / "evil")
    store.put_bytes("evil", b"new bytes", overwrite=True)
    assert target.read_bytes() == b"precious"
    assert stat.S_ISREG(os.lstat(root / "evil").st_mode)
    assert (root / "evil").read_bytes() == b"new bytes"


def test_symlink_is_never_read_through(tmp_path: Path) -> None:
    root, target = tmp_path / "root", tmp_path / "secret"
    target.write_bytes(b"secret")
    store = open_store(root)
    store.put_bytes("f", b"secret")
    os.unlink(root / "f")
    os.symlink(target, root / "f")
    with pytest.raises((IntegrityError, InvalidNameError)):
        store.read_bytes("f")
    assert store.verify().results[0].status != "ok"


def _race(root: str, payload: bytes, overwrite: bool, barrier: object, out: object) -> None:
    store = open_store(root)
    st = store.stage("contested.bin", overwrite=overwrite)
    for _ in range(8):
        st.write(payload)
    barrier.wait()  # type: ignore[attr-defined]
    try:
        st.commit()
        out.put("won")  # type: ignore[attr-defined]
    except AlreadyExistsError:
        out.put("lost")  # type: ignore[attr-defined]


@pytest.mark.parametrize("overwrite", [False, True])
def test_two_processes_same_name(tmp_path: Path, overwrite: bool) -> None:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    root = str(tmp_path / "root")
    open_store(root)
    payloads = [b"A" * 1_000_000, b"B" * 1_000_000]
    procs = [ctx.Process(target=_race, args=(root, p, overwrite, barrier, out)) for p in payloads]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = sorted(out.get() for _ in procs)
    assert results == (["won", "won"] if overwrite else ["lost", "won"])
    data = (Path(root) / "contested.bin").read_bytes()
    assert data in (payloads[0] * 8, payloads[1] * 8)
    store = open_store(root)
    assert store.record("contested.bin").digest == xxh(data)
    assert store.verify().ok
    assert LocalBackdoor(root).files() == sorted(
        [
            "contested.bin",
            ".commitstore/lock",
            ".commitstore/records/.commitstore.rec.contested.bin.json",
        ]
    )


@pytest.mark.parametrize("attempts", [None, 1], ids=["default", "locked-attempt-only"])
def test_readers_see_old_or_new_during_overwrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attempts: int | None
) -> None:
    """A reader racing a writer that overwrites as fast as it can never gets an error: failed
    checks are retried, and the last attempt reads under the publish lock (alone, with
    ``attempts=1``, it must be enough)."""
    if attempts is not None:
        monkeypatch.setattr(_read, "ATTEMPTS", attempts)
    root = tmp_path / "root"
    store = open_store(root)
    versions = [bytes([i]) * 200_000 for i in range(2)]
    store.put_bytes("hot", versions[0])
    stop = threading.Event()
    started = threading.Event()
    errors: list[BaseException] = []
    reads: list[int] = []  # which version each read returned

    def reader() -> None:
        r = open_store(root)
        while not stop.is_set():
            try:
                data = r.read_bytes("hot")
                assert data in versions
                reads.append(data[0])
                started.set()
            except BaseException as exc:
                errors.append(exc)
                started.set()
                return

    t = threading.Thread(target=reader)
    t.start()
    assert started.wait(30)
    before = len(reads)
    i = 0
    # At least 150 overwrites, and on until the reader has seen both versions while they ran.
    while i < 150 or (len(set(reads[before:])) < 2 and i < 5000):
        store.put_bytes("hot", versions[i % 2], overwrite=True)
        i += 1
    during = len(reads) - before
    stop.set()
    t.join()
    assert errors == []
    assert during >= 2, "the reader did not run while the writer overwrote"
    assert set(reads[before:]) == {0, 1}, "the reads never raced a replacement"


def test_gc_removes_old_orphans_of_killed_writers(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path / "store"
    store = open_store(root)
    store.put_bytes("step_0001.pt", b"committed")
    for seed in (1, 2):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.writer",
                str(root),
                f"step_000{seed + 1}.pt",
                str(seed),
                str(256 * 1024 * 1024),
            ],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    orphans = sorted(p for p in root.iterdir() if p.name.startswith(".commitstore.tmp."))
    assert len(orphans) == 2
    old = time.time() - 7200
    os.utime(orphans[0], (old, old))  # one dead writer's leftover is two hours old
    report = store.gc()  # default min_age: one hour
    assert [i.path for i in report.removed] == [orphans[0].name]
    assert [i.path for i in report.kept] == [orphans[1].name]
    assert report.kept[0].reason == "younger than min_age"
    assert not orphans[0].exists()
    assert orphans[1].exists()
    assert store.read_bytes("step_0001.pt") == b"committed"
    assert store.gc(min_age=0).removed[0].path == orphans[1].name
    assert LocalBackdoor(root).files() == sorted(
        [
            ".commitstore/lock",
            ".commitstore/records/.commitstore.rec.step_0001.pt.json",
            "step_0001.pt",
        ]
    )


def test_gc_cannot_be_pointed_outside(tmp_path: Path) -> None:
    outside = tmp_path / ".commitstore.tmp.0000.victim"
    outside.write_bytes(b"not ours")
    old = 1_000_000_000
    os.utime(outside, (old, old))
    store = open_store(tmp_path / "store")
    assert store.gc(min_age=0).removed == ()
    assert outside.exists()
    with pytest.raises(ConfigurationError):  # an argument problem, not a name
        store.gc(min_age=-1)
