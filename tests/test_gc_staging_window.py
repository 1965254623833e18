"""gc (``min_age=0``, in another process) at the moments a local writer's staging entry is
most exposed, each reached deterministically by pausing the writer there:

- between the create of its staging entry (a ``stage_dir`` folder, a staging file) and the
  writer's liveness lock on it: gc keeps the entry, the caller is handed only a folder the
  writer holds, and the commit publishes exactly what it wrote;
- the same when gc has taken the entry anyway (the folder's creation lock unavailable): the
  writer makes a new one and still commits;
- a folder replace between its exchange and its removal of the old folder (now under the
  staging name, held by no writer): gc may remove it first, and the replace returns durable,
  without a note;
- a staging entry that vanishes while gc looks at it is skipped, not an error;
- a ``begin_folder`` staging folder is made and locked under the same protocol, and held from
  ``begin_folder`` on: gc keeps it (and the file a joiner that exited left there) while the
  coordinator lives, and a folder moved in (``move_in``) is held as soon as it is there;
- what gc keeps because a writer is between a create and its lock in that folder says so (not
  "held by a live writer": no writer holds those entries).

Every check of storage reads the raw files (``LocalBackdoor``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import commitstore
from commitstore import open_store
from commitstore.backends.rename.posix import _liveness, _localfs
from commitstore.backends.rename.posix import backend as posix_backend
from commitstore.layout import STAGING_PREFIX
from commitstore.records import Record
from commitstore.testing import LocalBackdoor

from .helpers.gcelsewhere import ENV, GcReport, gc_elsewhere, gc_result, gc_started


def _pause_before_lock(monkeypatch: pytest.MonkeyPatch, at_pause: Callable[[], None]) -> list[str]:
    """The first writer to lock its new staging entry pauses just before the lock (the entry
    made, not yet locked) and runs ``at_pause``; the names it was about to lock are returned."""
    real = _liveness.hold
    seen: list[str] = []

    def hold(folder: int, name: str) -> Any:
        seen.append(name)
        if len(seen) == 1:
            at_pause()
        return real(folder, name)

    monkeypatch.setattr(_liveness, "hold", hold)
    return seen


def _staging_left(door: LocalBackdoor) -> list[str]:
    return [f for f in door.files() if STAGING_PREFIX in f]


@pytest.mark.parametrize("overwrite", [False, True])
def test_gc_between_stage_dir_create_and_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overwrite: bool
) -> None:
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    if overwrite:
        with store.stage_dir("hf/ck") as d:
            (d / "w.bin").write_bytes(b"old")
    removed: list[list[str]] = []
    _pause_before_lock(monkeypatch, lambda: removed.append(gc_elsewhere(root)["removed"]))
    got: list[Record] = []
    with store.stage_dir("hf/ck", overwrite=overwrite, records=got) as d:
        assert d.is_dir()  # handed over only once held
        (d / "w.bin").write_bytes(b"new")
    assert removed == [[]]
    assert door.read("hf/ck/w.bin") == b"new"
    assert got[0].outcome is not None and got[0].outcome.durable
    assert _staging_left(door) == []


def test_stage_dir_makes_a_new_entry_when_gc_took_its_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the folder's creation lock (as when gc holds it, claiming another entry), gc
    removes the new, unlocked staging folder; the writer sees it gone and makes another."""
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    with store.stage_dir("ck") as d:
        (d / "w.bin").write_bytes(b"old")
    monkeypatch.setattr(posix_backend.LocalBackend, "creating", lambda self, folder: _null())
    removed: list[list[str]] = []
    seen = _pause_before_lock(monkeypatch, lambda: removed.append(gc_elsewhere(root)["removed"]))
    with store.stage_dir("ck", overwrite=True) as d:
        assert d.is_dir()
        (d / "w.bin").write_bytes(b"new")
    assert len(seen) == 2 and seen[0] != seen[1]
    assert removed == [[seen[0]]]
    assert door.read("ck/w.bin") == b"new"
    assert _staging_left(door) == []


def test_gc_between_staging_file_create_and_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    store.put_bytes("a.bin", b"old")
    removed: list[list[str]] = []
    _pause_before_lock(monkeypatch, lambda: removed.append(gc_elsewhere(root)["removed"]))
    rec = store.put_bytes("a.bin", b"new" * 1000, overwrite=True)
    assert removed == [[]]
    assert door.read("a.bin") == b"new" * 1000
    assert rec.outcome is not None and rec.outcome.durable
    assert _staging_left(door) == []


def test_gc_removing_the_old_folder_a_replace_exchanged_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the exchange the old folder sits under the staging name, held by no writer: gc
    may remove it before the replace does. The name holds the new version either way, and the
    replace counts "already gone" as done: durable, no note."""
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    with store.stage_dir("hf/ck") as d:
        (d / "w.bin").write_bytes(b"old")
    real = _localfs.rmtree_at
    gcs: list[subprocess.Popen[str]] = []

    def rmtree_at(dirfd: int, name: str) -> None:
        if not gcs:  # gc starts; the writer resumes once gc has removed the old folder
            gcs.append(gc_started(root))
            while (root / "hf" / name).exists() and gcs[0].poll() is None:
                time.sleep(0.01)
        real(dirfd, name)

    monkeypatch.setattr(_localfs, "rmtree_at", rmtree_at)
    got: list[Record] = []
    with store.stage_dir("hf/ck", overwrite=True, records=got) as d:
        (d / "w.bin").write_bytes(b"new")
    report = gc_result(gcs[0], timeout=120)  # its pending-record pass waited for the lock
    assert any(STAGING_PREFIX in p for p in report["removed"])  # gc took the old folder
    assert door.read("hf/ck/w.bin") == b"new"
    outcome = got[0].outcome
    assert outcome is not None and outcome.durable and outcome.notes == ()
    assert _staging_left(door) == []


_RACED_GC = """
import os, sys, commitstore
state = {"busy": False, "done": 0}
def hook(event, args):
    # another remover (a replace dropping the old version it exchanged out) gets to each
    # file of the staging folder just before gc's own unlink of it
    if event == "os.remove" and not state["busy"]:  # gc removes only the staging folder here
        state["busy"] = True
        try:
            os.unlink(args[0], dir_fd=args[1])
            state["done"] += 1
        finally:
            state["busy"] = False
sys.addaudithook(hook)
r = commitstore.open_store(sys.argv[1]).gc(min_age=0)
print(state["done"], sorted(i.kind for i in r.removed))
"""


def test_gc_skips_what_another_remover_takes_while_it_removes(tmp_path: Path) -> None:
    """A staging folder whose files another remover takes while gc removes it: gc finishes
    without an error (what is gone is removed)."""
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    store.put_bytes("keep.bin", b"k")
    for rel in ("a.bin", "sub/b.bin"):
        door.write(f"hf/{STAGING_PREFIX}0123456789abcdef.ck/{rel}", b"x")
    out = subprocess.run(
        [sys.executable, "-c", _RACED_GC, str(root)],
        check=False,
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "2 ['staging']"
    assert _staging_left(door) == []
    assert door.read("keep.bin") == b"k"


_DEAD = f"{STAGING_PREFIX}0123456789abcdef.dead.pt"
"""A staging file a dead writer left at the store's root (no lock on it)."""


_CREATING = "a writer is creating an entry in this folder"
_HELD = "held by a live writer"


def test_gc_says_why_it_keeps_entries_beside_a_writer_creating_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer between its staging file's create and its lock holds the folder's creation
    lock: gc keeps every entry of that folder, a dead writer's too, with that reason (no
    writer holds the dead one), and removes the dead one once the folder is free."""
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    door.write(_DEAD, b"dead")
    reports: list[GcReport] = []
    seen = _pause_before_lock(monkeypatch, lambda: reports.append(gc_elsewhere(root)))
    store.put_bytes("a.bin", b"new")
    assert reports == [GcReport(removed=[], kept=[[_DEAD, _CREATING], [seen[0], _CREATING]])]
    assert gc_elsewhere(root) == GcReport(removed=[_DEAD], kept=[])
    assert door.read("a.bin") == b"new"


def test_gc_between_begin_folder_create_and_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``begin_folder`` makes its staging folder under the root's creation lock: gc, run
    while the writer is between the make and its own lock, keeps the folder and, for the
    same reason, a dead writer's entry beside it, saying why (no writer holds either)."""
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    door.write(_DEAD, b"dead")
    reports: list[GcReport] = []
    seen = _pause_before_lock(monkeypatch, lambda: reports.append(gc_elsewhere(root)))
    fw = store.begin_folder("ck")
    area = seen[0]
    assert door.is_dir(area)  # made by begin_folder itself
    creating = _CREATING
    assert reports == [GcReport(removed=[], kept=[[_DEAD, creating], [area, creating]])]
    a = fw.write_bytes("a.bin", b"a" * 100)
    again = gc_elsewhere(root)  # the writer holds its folder: only the dead entry goes
    assert again == {"removed": [_DEAD], "kept": [[area, _HELD]]}
    fw.commit([a])
    assert door.read("ck/a.bin") == b"a" * 100
    assert _staging_left(door) == []


_JOINER = """
import json, sys, commitstore
fw = commitstore.open_store(sys.argv[1]).join_folder(sys.argv[2])
r = fw.write_bytes("part-1.bin", b"j" * 5000)
print(json.dumps([r.path, r.size, r.digest]))
"""


def test_gc_keeps_a_joiners_file_while_the_coordinator_lives(tmp_path: Path) -> None:
    """A coordinator that writes no file itself holds its staging folder from
    ``begin_folder``: a joiner's file, left there by a joiner process that exited, is not
    taken by gc (min_age=0) before the coordinator commits it."""
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    fw = store.begin_folder("ck")
    out = subprocess.run(
        [sys.executable, "-c", _JOINER, str(root), fw.token],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    joined = commitstore.FileRecord(*json.loads(out.stdout))
    report = gc_elsewhere(root)
    assert report["removed"] == []
    assert [reason for _path, reason in report["kept"]] == [_HELD]
    fw.commit([joined])
    assert door.read("ck/part-1.bin") == b"j" * 5000
    assert _staging_left(door) == []


def test_gc_keeps_a_folder_moved_in(tmp_path: Path) -> None:
    """``move_in`` renames the caller's folder onto the (empty) staging folder and holds the
    moved one at once: gc (min_age=0) keeps it until the commit."""
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    src = tmp_path / "trainer_out"
    (src / "sub").mkdir(parents=True)
    (src / "w.bin").write_bytes(b"w" * 10)
    (src / "sub" / "c.json").write_bytes(b"{}")
    fw = store.begin_folder("ck")
    files = fw.move_in(src)
    assert files is not None and not src.exists()
    report = gc_elsewhere(root)
    assert report["removed"] == []
    assert [reason for _path, reason in report["kept"]] == [_HELD]
    fw.commit(files)
    assert door.read("ck/w.bin") == b"w" * 10
    assert door.read("ck/sub/c.json") == b"{}"
    assert _staging_left(door) == []


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
