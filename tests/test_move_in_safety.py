"""``FolderWrite.move_in`` and ``FolderWrite.adopt`` on a local store never take what is not the
caller's to give:

- ``adopt`` (a folder written inside the store's own folder) refuses the same folders as
  ``move_in`` below, another writer's staging folder and a folder outside the store, and takes
  a folder inside the store that is no artifact, or the write's own name (committed in place);

- a ``src`` inside the store's own folder (a committed artifact's folder, the records), the
  root itself or a folder holding it, also reached through symlinks, is refused with
  ``NameConflictError`` before any I/O: every byte of the store and ``src`` stay as they were,
  and ``abort`` afterwards removes nothing committed;
- a staging folder another writer (a joiner, in another process) holds is never replaced: the
  joiner's lock would stay on the replaced folder and gc (another process, ``min_age=0``)
  could take the moved one from the live joiner once the coordinator is gone. ``move_in``
  returns None (``src`` untouched, the caller copies), the coordinator keeps its own lock, and
  the joiner commits what it wrote.

Every check of storage reads the raw files (``LocalBackdoor``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from commitstore import open_store
from commitstore.errors import NameConflictError
from commitstore.layout import STAGING_PREFIX
from commitstore.testing import LocalBackdoor

from .helpers.gcelsewhere import ENV, gc_elsewhere, kept_reasons

_HELD = "held by a live writer"


def _folder(path: Path) -> Path:
    """A folder another tool wrote (one file in it)."""
    path.mkdir(parents=True)
    (path / "w.bin").write_bytes(b"w")
    return path


def _linked(link: Path, to: Path) -> Path:
    link.symlink_to(to)
    return link


def _pending_below(root: Path) -> Path:
    """A folder below which a commit is in progress: its pending record is there, no record."""
    src = _folder(root / "incoming")
    records = root / ".commitstore" / "records" / "incoming"
    records.mkdir(parents=True)
    (records / ".commitstore.new.x.json").write_bytes(b"{}")
    return src


def _snapshot(door: LocalBackdoor) -> dict[str, bytes | None]:
    return {f: door.read(f) for f in door.files()}


def _committed_store(root: Path) -> LocalBackdoor:
    store = open_store(root)
    with store.stage_dir("ckpt/step_1") as d:
        (d / "model.bin").write_bytes(b"weights" * 1000)
        (d / "sub").mkdir()
        (d / "sub" / "opt.bin").write_bytes(b"opt")
    store.put_bytes("other.pt", b"o")
    return LocalBackdoor(root)


def _srcs(tmp_path: Path, root: Path) -> dict[str, Callable[[], Path]]:
    def via_symlink() -> Path:
        link = tmp_path / "link"
        link.symlink_to(root / "ckpt" / "step_1")
        return link

    def via_symlinked_parent() -> Path:
        link = tmp_path / "parent_link"
        link.symlink_to(root / "ckpt")
        return link / "step_1"

    def via_dotdot() -> Path:
        """``lnk/..`` is the store's root to the kernel (symlink first), ``tmp_path`` as text."""
        link = tmp_path / "lnk"
        link.symlink_to(root / "ckpt")
        return link / ".." / "ckpt" / "step_1"

    return {
        "artifact_folder": lambda: root / "ckpt" / "step_1",
        "folder_holding_artifacts": lambda: root / "ckpt",
        "records": lambda: root / ".commitstore" / "records",
        "meta": lambda: root / ".commitstore",
        "root": lambda: root,
        "holds_root": lambda: tmp_path,
        "symlink_to_artifact": via_symlink,
        "through_symlinked_parent": via_symlinked_parent,
        "relative": lambda: Path(os.path.relpath(root / "ckpt" / "step_1")),
        "dotdot_after_symlink": via_dotdot,
    }


_OF_THE_STORE = [
    "artifact_folder",
    "folder_holding_artifacts",
    "records",
    "meta",
    "root",
    "holds_root",
    "symlink_to_artifact",
    "through_symlinked_parent",
    "relative",
    "dotdot_after_symlink",
]

_ADOPT_ONLY = [
    "staging_entry",
    "outside",
    "inside_artifact",
    "holding_own_path",
    "own_committed",
    "pending_commit_below",
    "staging_below",
    "case_folded_meta",
    "symlink_inside",
]


@pytest.mark.parametrize(
    ("method", "where"),
    [
        *(("move_in", where) for where in _OF_THE_STORE),
        # adopt takes folders inside the store, but none of these either
        *(("adopt", where) for where in (*_OF_THE_STORE, *_ADOPT_ONLY)),
    ],
)
def test_a_write_never_takes_a_folder_of_the_store(tmp_path: Path, method: str, where: str) -> None:
    root = tmp_path / "s"
    door = _committed_store(root)
    staging = root / f"{STAGING_PREFIX}x.y"  # another writer's staging folder
    staging.mkdir()
    (staging / "f").write_bytes(b"another writer's")
    outside = tmp_path / "out"
    outside.mkdir()
    srcs: dict[str, Callable[[], Path]] = {
        **_srcs(tmp_path, root),
        "staging_entry": lambda: staging,
        "outside": lambda: outside,
        "inside_artifact": lambda: root / "ckpt" / "step_1" / "sub",
        "holding_own_path": lambda: _folder(root / "run1"),
        "own_committed": lambda: root / "ckpt" / "step_1",
        "pending_commit_below": lambda: _pending_below(root),
        "staging_below": lambda: _folder(root / "incoming" / f"{STAGING_PREFIX}a.b"),
        "case_folded_meta": lambda: _folder(root / ".COMMITSTORE"),
        "symlink_inside": lambda: _linked(root / "lnk_in", outside),
    }
    src = srcs[where]()
    store = open_store(root)
    own = {"holding_own_path": "run1/final", "own_committed": "ckpt/step_1"}.get(where)
    fw = store.begin_folder(own or "ckpt/step_2", overwrite=own is not None)
    before = _snapshot(door)
    with pytest.raises(NameConflictError, match="nothing was moved"):
        getattr(fw, method)(src)
    assert src.exists()
    fw.abort()
    assert _snapshot(door) == before
    assert door.read("ckpt/step_1/model.bin") == b"weights" * 1000
    assert door.read("ckpt/step_1/sub/opt.bin") == b"opt"
    statuses = {r.name: r.status for r in store.verify().results}
    assert (statuses["ckpt/step_1"], statuses["other.pt"]) == ("ok", "ok"), statuses


def test_move_in_of_a_folder_beside_the_store_still_moves(tmp_path: Path) -> None:
    """A folder next to the store (its name starts like the root's) is not inside it."""
    root = tmp_path / "s"
    _committed_store(root)
    src = tmp_path / "s2"
    src.mkdir()
    (src / "w.bin").write_bytes(b"w")
    fw = open_store(root).begin_folder("ckpt/step_2")
    files = fw.move_in(src)
    assert files is not None and not src.exists()
    fw.commit(files)
    assert LocalBackdoor(root).read("ckpt/step_2/w.bin") == b"w"


_COORDINATOR = """
import sys
from pathlib import Path
import commitstore
fw = commitstore.open_store(sys.argv[1]).begin_folder("shared")
print(fw.token, flush=True)
sys.stdin.readline()  # the joiner joined
print(repr(fw.move_in(Path(sys.argv[2]))), flush=True)
sys.stdin.readline()  # killed here
"""

_JOINER = """
import sys
import commitstore
fw = commitstore.open_store(sys.argv[1]).join_folder(sys.stdin.readline().strip())
print("joined", flush=True)
sys.stdin.readline()  # killed here
"""


def _started(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _send(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


def _killed(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


def _staging(door: LocalBackdoor) -> list[str]:
    return sorted({f.split("/")[0] for f in door.files() if f.startswith(STAGING_PREFIX)})


def test_move_in_never_replaces_a_folder_a_joiner_holds(tmp_path: Path) -> None:
    """The coordinator (another process) moves a folder in while this process, a joiner,
    holds the staging folder; the coordinator is SIGKILLed, gc runs in a third process: the
    joiner's folder is kept and its commit publishes what it wrote."""
    root = tmp_path / "s"
    open_store(root).put_bytes("seed", b"1")
    door = LocalBackdoor(root)
    src = tmp_path / "trainer_out"
    src.mkdir()
    (src / "part0").write_bytes(b"P0")
    coordinator = _started(_COORDINATOR, str(root), str(src))
    try:
        joiner = open_store(root).join_folder(_line(coordinator))
        _send(coordinator, "joined")
        assert _line(coordinator) == "None"  # refused: the caller copies
        assert (src / "part0").read_bytes() == b"P0"  # src untouched
    finally:
        _killed(coordinator)
    part1 = joiner.write_bytes("part1", b"P1")
    report = gc_elsewhere(root)
    assert report["removed"] == []
    assert kept_reasons(report) == [_HELD]
    record = joiner.commit([part1])
    assert [f.path for f in record.files] == ["part1"]
    assert door.read("shared/part1") == b"P1"
    assert _staging(door) == []


def test_a_refused_move_in_keeps_the_coordinators_lock(tmp_path: Path) -> None:
    """The coordinator (this process) is refused because a joiner (another process) holds the
    staging folder; once the joiner is SIGKILLed, the coordinator still holds the folder: gc
    in another process keeps it, and the coordinator's file in it commits."""
    root = tmp_path / "s"
    door = LocalBackdoor(root)
    store = open_store(root)
    fw = store.begin_folder("shared")
    joiner = _started(_JOINER, str(root))
    try:
        _send(joiner, fw.token)
        assert _line(joiner) == "joined"
        src = tmp_path / "trainer_out"
        src.mkdir()
        (src / "part0").write_bytes(b"P0")
        assert fw.move_in(src) is None
        assert (src / "part0").read_bytes() == b"P0"
    finally:
        _killed(joiner)
    staging = [e for e in os.listdir(root) if e.startswith(STAGING_PREFIX)]  # empty: no files
    assert len(staging) == 1
    report = gc_elsewhere(root)
    assert report["removed"] == []
    assert report["kept"] == [[staging[0], _HELD]]
    rec = fw.write_bytes("part0", b"P0")
    fw.commit([rec])
    assert door.read("shared/part0") == b"P0"
    assert _staging(door) == []


def test_move_in_after_the_joiner_left_moves(tmp_path: Path) -> None:
    """Once no other writer holds the staging folder (the joiner exited), the coordinator's
    move_in moves the folder with one rename and holds it: gc keeps it."""
    root = tmp_path / "s"
    door = LocalBackdoor(root)
    fw = open_store(root).begin_folder("shared")
    joiner = _started(_JOINER, str(root))
    _send(joiner, fw.token)
    assert _line(joiner) == "joined"
    _killed(joiner)
    src = tmp_path / "trainer_out"
    src.mkdir()
    (src / "part0").write_bytes(b"P0")
    files = fw.move_in(src)
    assert files is not None and not src.exists()
    report = gc_elsewhere(root)
    assert report["removed"] == []
    assert kept_reasons(report) == [_HELD]
    fw.commit(files)
    assert door.read("shared/part0") == b"P0"


# -- adopt: a folder written inside the store's own folder ---------------------------------------
def test_adopt_takes_a_folder_inside_the_store_that_is_no_artifact(tmp_path: Path) -> None:
    root = tmp_path / "s"
    door = _committed_store(root)
    src = root / "incoming" / "run"  # written there by another tool; no artifact
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(b"w" * 10)
    store = open_store(root)
    fw = store.begin_folder("ckpt/step_2")
    files = fw.adopt(src)
    assert files is not None and not src.exists()
    fw.commit(files)
    assert door.read("ckpt/step_2/w.bin") == b"w" * 10
    assert door.read("ckpt/step_1/model.bin") == b"weights" * 1000
    assert [r.status for r in store.verify(level="full").results] == ["ok", "ok", "ok"]


def test_adopt_commits_the_writes_own_uncommitted_path_in_place(tmp_path: Path) -> None:
    """A folder another tool wrote at the write's own path (nothing committed there) is
    renamed into the staging area and committed back under the name."""
    root = tmp_path / "s"
    door = _committed_store(root)
    (root / "ckpt" / "step_9").mkdir()
    (root / "ckpt" / "step_9" / "model.bin").write_bytes(b"newer" * 10)
    store = open_store(root)
    fw = store.begin_folder("ckpt/step_9", overwrite=True)  # data there without a record
    files = fw.adopt(root / "ckpt" / "step_9")
    assert files is not None
    record = fw.commit(files)
    assert door.read("ckpt/step_9/model.bin") == b"newer" * 10
    assert record.size == 50
    assert door.read("ckpt/step_1/model.bin") == b"weights" * 1000
    assert [r.status for r in store.verify(level="full").results] == ["ok", "ok", "ok"]
