"""Names are paths: an operation on one name never reaches into another.

``runs/step_1.pt`` and ``runs/step_2.pt`` are committed; ``runs`` is not an artifact, only the
folder path that holds them. Deleting or replacing ``runs`` (through the store, through the
``commit://`` filesystem, as a file or as a folder) is refused with NameConflictError before
anything is removed; deleting an artifact removes exactly the files its record names; committing
a name inside a committed file artifact, or a file where committed artifacts sit below, is
refused. ``get_file`` never removes a local folder. Every state is read through the backdoor:
the bytes under the root are the same before and after a refused call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest

from commitstore import AlreadyExistsError, CommitStoreError, NameConflictError, open_store
from commitstore.backends import PutMode
from commitstore.cli import main as cli_main
from commitstore.testing import GcsBackdoor, LocalBackdoor, S3Backdoor, Target, record_path, xxh

from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.overwriter import version
from .helpers.s3servers import BUCKET, MotoServer

CHILDREN = {
    "runs/step_1.pt": b"step one " * 300,
    "runs/step_2.pt": b"step two " * 310,
    "runs/deep/x.bin": b"deep x " * 50,
}


def make_target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if kind == "local":
        root = tmp_path / "store"
        return Target(open_store(str(root)), LocalBackdoor(root), lambda: open_store(str(root)))
    prefix = f"h{time.monotonic_ns()}"
    if kind == "s3":
        moto: MotoServer = request.getfixturevalue("moto")
        url, opts = moto.url(prefix), moto.options()
        door: Any = S3Backdoor(moto.client(), BUCKET, prefix)
    else:
        gcs: FakeGcs = request.getfixturevalue("gcs")
        url, opts = gcs.url(prefix), gcs.options()
        door = GcsBackdoor(gcs.endpoint, GCS_BUCKET, prefix)
    return Target(open_store(url, **opts), door, lambda: open_store(url, **opts))


def snapshot(t: Target) -> dict[str, bytes | None]:
    """Every file under the root and its bytes, the record cache aside (a cache, rewritten by
    listings)."""
    return {f: t.door.read(f) for f in t.door.files() if not f.startswith(".commitstore/cache/")}


def with_children(t: Target) -> dict[str, bytes | None]:
    for name, body in CHILDREN.items():
        t.store.put_bytes(name, body)
    return snapshot(t)


def assert_children_whole(t: Target) -> None:
    """Through the backdoor: each child's bytes and record as committed; then a fresh store
    verifies every one of them."""
    for name, body in CHILDREN.items():
        assert t.door.read(name) == body, name
        raw = t.door.read(record_path(name))
        assert raw is not None, f"{name}: record gone"
        assert json.loads(raw)["digest"] == xxh(body)
    report = t.reopen().verify()
    assert report.ok, report.results
    assert {r.name for r in report.results if r.status == "ok"} >= set(CHILDREN)


KINDS = ["local", "s3", "gcs"]


# -- finding 1: delete of a folder path that holds artifacts -----------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_delete_of_a_folder_holding_artifacts_is_refused(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target(kind, request, tmp_path)
    before = with_children(t)
    for name in ("runs", "runs/deep"):
        with pytest.raises(NameConflictError, match="committed artifacts"):
            t.store.delete(name)
        assert snapshot(t) == before
    assert_children_whole(t)
    t.store.delete("runs/step_1.pt")  # an artifact of its own still goes, alone
    assert t.door.read("runs/step_1.pt") is None
    assert t.door.read(record_path("runs/step_1.pt")) is None
    assert t.door.read("runs/step_2.pt") == CHILDREN["runs/step_2.pt"]


@pytest.mark.parametrize("kind", KINDS)
def test_delete_of_a_file_inside_a_folder_artifact_is_refused(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``ck/w``, one file of the committed folder artifact ``ck``, is not an artifact: deleting
    it would leave ``ck`` failing its record (it was removed, and ``ck`` went ``missing``)."""
    t = make_target(kind, request, tmp_path)
    with t.store.stage_dir("ck") as d:
        (d / "w").write_bytes(b"weights")
        (d / "sub").mkdir()
        (d / "sub" / "v").write_bytes(b"vocab")
    before = snapshot(t)
    for name in ("ck/w", "ck/sub/v", "ck/sub"):
        with pytest.raises(NameConflictError, match="inside a committed artifact"):
            t.store.delete(name)
        assert snapshot(t) == before
    assert t.reopen().verify("ck").ok


# -- finding 2: replacing a folder path that holds artifacts -----------------------------------
def _stage_dir(t: Target, overwrite: bool) -> None:
    with t.store.stage_dir("runs", overwrite=overwrite) as d:
        (d / "new.bin").write_bytes(b"would replace the folder")


def _stage(t: Target, overwrite: bool) -> None:
    with t.store.stage("runs", overwrite=overwrite) as f:
        f.write(b"a file over the folder")


def _put_bytes(t: Target, overwrite: bool) -> None:
    t.store.put_bytes("runs", b"a file over the folder", overwrite=overwrite)


REPLACES = [  # one object store covers the file writes (GCS takes the same object code path)
    (kind, how)
    for kind in KINDS
    for how in (_stage_dir, _stage, _put_bytes)
    if kind != "gcs" or how is _stage_dir
]


@pytest.mark.parametrize(("kind", "how"), REPLACES, ids=[f"{k}-{h.__name__}" for k, h in REPLACES])
@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "create"])
def test_replacing_a_folder_holding_artifacts_is_refused(
    kind: str, how: Any, overwrite: bool, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target(kind, request, tmp_path)
    before = with_children(t)
    with pytest.raises(NameConflictError, match="committed artifacts"):
        how(t, overwrite)
    assert snapshot(t) == before
    assert_children_whole(t)


# -- the reverse: a name inside a committed file artifact --------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_committing_inside_a_committed_file_is_refused(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target(kind, request, tmp_path)
    t.store.put_bytes("runs", b"a file artifact")
    before = snapshot(t)
    for overwrite in (False, True):
        with pytest.raises(AlreadyExistsError, match="inside the committed artifact runs"):
            t.store.put_bytes("runs/a.pt", b"inside a file", overwrite=overwrite)
        with (
            pytest.raises(AlreadyExistsError, match="inside the committed artifact runs"),
            t.store.stage_dir("runs/d", overwrite=overwrite) as d,
        ):
            (d / "f").write_bytes(b"x")
    assert snapshot(t) == before
    assert t.reopen().verify().ok


# -- deleting and replacing remove exactly what the record names -------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_delete_removes_exactly_the_recorded_files(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target(kind, request, tmp_path)
    with t.store.stage_dir("ckpt") as d:
        (d / "model.bin").write_bytes(b"model " * 100)
        (d / "sub").mkdir()
        (d / "sub" / "opt.bin").write_bytes(b"opt " * 100)
    t.door.write("ckpt/notes-by-hand.txt", b"a user's file, not in the record")
    t.store.delete("ckpt")
    left = [f for f in t.door.files() if not f.startswith(".commitstore/")]
    assert left == ["ckpt/notes-by-hand.txt"]
    assert t.door.read("ckpt/notes-by-hand.txt") == b"a user's file, not in the record"
    assert t.door.read(record_path("ckpt")) is None
    with t.store.stage_dir("whole") as d:  # nothing else inside: every folder goes
        (d / "a" / "b").mkdir(parents=True)
        (d / "a" / "b" / "w.bin").write_bytes(b"w")
        (d / "top.bin").write_bytes(b"t")
    t.store.delete("whole")
    assert not t.door.is_dir("whole") and t.door.read("whole") is None


def test_an_inconsistent_folder_record_never_reaches_a_child(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """S3 holds a key and keys below it at once: a folder record of ``runs`` that names
    ``step_1.pt`` (written by another tool) must not let ``delete("runs")`` remove the committed
    artifact ``runs/step_1.pt``."""
    t = make_target("s3", request, tmp_path)
    with_children(t)
    rec = {
        "created": "2026-11-29T16:23:03.123456Z",
        "digest": "xxh3_128:" + "0" * 32,
        "files": [{"digest": xxh(CHILDREN["runs/step_1.pt"]), "path": "step_1.pt", "size": 2700}],
        "kind": "dir",
        "metadata": {},
        "name": "runs",
        "schema": "commitstore.record/1",
        "size": 2700,
        "step": None,
    }
    t.door.write(record_path("runs"), (json.dumps(rec, sort_keys=True) + "\n").encode())
    with pytest.raises(NameConflictError):
        t.store.delete("runs")
    t.door.remove(record_path("runs"))  # the hand-made record only stood in the way of verify
    assert_children_whole(t)


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_object_folder_replace_never_deletes_another_artifacts_keys(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """On an object store the publish lock holds nothing, so a commit below ``runs`` can land
    after the core's check: the backend's folder replace itself (its stale-key deletes, also
    gc's roll-forward) never deletes a key of another committed artifact."""
    t = make_target(kind, request, tmp_path)
    with_children(t)
    sink = t.store._committer.backend.open_dir_sink(("runs",), mode=PutMode.REPLACE)
    (sink.local_path / "new.bin").write_bytes(b"the new folder's file")
    sink.publish()
    assert t.door.read("runs/new.bin") == b"the new folder's file"
    assert_children_whole(t)


# -- finding 3: the commit:// filesystem's rm --------------------------------------------------
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_fsspec_rm_of_a_folder_holding_artifacts_is_refused(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target(kind, request, tmp_path)
    before = with_children(t)
    if kind == "local":
        base = str(tmp_path / "store")
        fs = fsspec.filesystem("commit", root=base)
    else:
        moto: MotoServer = request.getfixturevalue("moto")
        door: Any = t.door
        base = f"s3://{BUCKET}/{door.prefix}"
        fs = fsspec.filesystem(
            "commit", root=base, target_protocol="s3", target_options=moto.options()
        )
    with pytest.raises(IsADirectoryError, match="recursive=True"):
        fs.rm(f"{base}/runs")
    assert snapshot(t) == before
    assert_children_whole(t)
    fs.rm(f"{base}/runs", recursive=True)  # every artifact below, each by its own record
    assert [f for f in t.door.files() if not f.startswith(".commitstore/")] == []


# -- finding 7: get_file onto a local folder ---------------------------------------------------
def _user_folder(tmp_path: Path) -> Path:
    dest = tmp_path / "mine"
    (dest / "keep").mkdir(parents=True)
    (dest / "keep" / "thesis.tex").write_bytes(b"years of work")
    return dest


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("artifact", ["file", "folder"])
def test_get_file_onto_a_user_folder_puts_the_artifact_inside_it(
    artifact: str, tmp_path: Path
) -> None:
    store = open_store(str(tmp_path / "store"))
    if artifact == "file":
        store.put_bytes("run/model.pt", b"weights")
    else:
        with store.stage_dir("run/model.pt") as d:
            (d / "w.bin").write_bytes(b"weights")
    dest = _user_folder(tmp_path)
    store.get_file("run/model.pt", dest)
    got = _tree(dest)
    assert got.pop("keep/thesis.tex") == b"years of work"
    assert got == (
        {"model.pt": b"weights"} if artifact == "file" else {"model.pt/w.bin": b"weights"}
    )


@pytest.mark.parametrize("artifact", ["file", "folder"])
def test_get_file_never_replaces_a_local_folder(artifact: str, tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    if artifact == "file":
        store.put_bytes("keep", b"weights")
    else:
        with store.stage_dir("keep") as d:
            (d / "w.bin").write_bytes(b"weights")
    dest = _user_folder(tmp_path)
    with pytest.raises(NameConflictError, match="folder"):
        store.get_file("keep", dest)  # would land at mine/keep: the user's folder
    assert _tree(dest) == {"keep/thesis.tex": b"years of work"}


def test_get_file_replaces_a_local_file_but_never_with_a_folder(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("a.pt", b"new bytes")
    with store.stage_dir("d") as d:
        (d / "w.bin").write_bytes(b"weights")
    out = tmp_path / "out.pt"
    out.write_bytes(b"an older copy")
    store.get_file("a.pt", out)  # a file over a file: replaced, as cp does
    assert out.read_bytes() == b"new bytes"
    with pytest.raises(NameConflictError, match="file"):
        store.get_file("d", out)
    assert out.read_bytes() == b"new bytes"


def test_cli_get_onto_a_user_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "store")
    store = open_store(url)
    with store.stage_dir("keep") as d:
        (d / "w.bin").write_bytes(b"weights")
    dest = _user_folder(tmp_path)
    assert cli_main(["get", url, "keep", str(dest)]) == 1
    err = capsys.readouterr().err
    assert "folder" in err and "Traceback" not in err
    assert _tree(dest) == {"keep/thesis.tex": b"years of work"}
    other = tmp_path / "other"
    other.mkdir()
    assert cli_main(["get", url, "keep", str(other)]) == 0
    assert _tree(other) == {"keep/w.bin": b"weights"}


# -- finding 15: get_file of a folder overwritten by another process ---------------------------
def test_get_file_of_a_folder_overwritten_meanwhile_gets_a_whole_version(tmp_path: Path) -> None:
    """Another process overwrites the folder at every progress report of ``get_file`` (it
    waits on no lock: while the reader holds the publish lock it declines). Each call gets one
    whole version, never an IntegrityError."""
    root = tmp_path / "store"
    store = open_store(str(root))
    with store.stage_dir("ck") as d:
        for rel, body in version(1).items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.overwriter", str(root), "ck"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert child.stdin is not None and child.stdout is not None
    answers: list[str] = []

    def overwrite(_done: int) -> None:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        answers.append(child.stdout.readline().strip())

    whole = [version(n) for n in range(1, 200)]
    try:
        for i in range(3):
            out = tmp_path / f"got-{i}"
            try:
                store.get_file("ck", out, progress=overwrite)
            except CommitStoreError as exc:
                pytest.fail(f"call {i}: {type(exc).__name__}: {exc}")
            assert _tree(out) in whole
    finally:
        child.stdin.close()
        child.wait()
    assert sum(a.startswith("done") for a in answers) >= 3  # the folder did change under it


def test_adopt_never_claims_a_folder_that_holds_artifacts(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target("local", request, tmp_path)
    before = with_children(t)
    report = t.store.adopt("runs", trust=True)
    assert "runs" not in report.adopted and "holds committed artifacts" in report.rejected["runs"]
    assert t.door.read(record_path("runs")) is None
    assert snapshot(t) == before
    assert_children_whole(t)


def test_deleting_an_unrecorded_folder_never_takes_a_write_in_progress(tmp_path: Path) -> None:
    """``runs`` has no record; a writer of ``runs/a.pt`` is staging below it. Deleting ``runs``
    would take the writer's staged bytes: refused, and the write still commits."""
    root = tmp_path / "store"
    store = open_store(str(root))
    door = LocalBackdoor(root)
    door.write("runs/notes.txt", b"unrecorded")
    st = store.stage("runs/a.pt")
    st.write(b"being written")
    with pytest.raises(NameConflictError, match="write in progress"):
        store.delete("runs")
    st.commit()
    assert door.read("runs/a.pt") == b"being written"
    assert door.read("runs/notes.txt") == b"unrecorded"
    assert store.verify("runs/a.pt").ok
