"""gc removes only what it can show a dead writer owns, by the exact file list a pending
record or marker names, never by prefix, never a file a committed record names, and never
anything a live writer holds, whatever its age (issue 22, findings 4, 5, 9, 10).

Every assertion on storage goes through the backdoor (``commitstore.testing``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import commitstore
from commitstore import CommitError, open_store
from commitstore.digest import manifest_digest
from commitstore.records import FileRecord, Record, encode_record
from commitstore.testing import LocalBackdoor, S3Backdoor, pending_paths, record_path, xxh

from .helpers.s3servers import BUCKET, MotoServer

Opened = tuple[Any, Any, Callable[[], Any]]
SRC = Path(commitstore.__file__).resolve().parent.parent
"""Where the commitstore under test lives: the writer processes import the same one."""


def _local(tmp_path: Path) -> Opened:
    root = tmp_path / "store"
    return open_store(str(root)), LocalBackdoor(root), lambda: open_store(str(root))


def _s3(moto: MotoServer) -> Opened:
    prefix = f"g{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    return (
        open_store(url, **opts),
        S3Backdoor(moto.client(), BUCKET, prefix),
        lambda: open_store(url, **opts),
    )


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Opened:
    if request.param == "local":
        return _local(tmp_path)
    return _s3(request.getfixturevalue("moto"))


def pending_path(name: str) -> str:
    return record_path(name).replace("/.commitstore.rec.", "/.commitstore.new.")


def planted_folder_record(name: str, files: dict[str, bytes], *, wrong: bool) -> bytes:
    """A pending record of folder ``name`` listing ``files`` (digests spoiled if ``wrong``)."""
    entries = tuple(
        FileRecord(p, len(b), "xxh3_128:" + ("0" * 32 if wrong else xxh(b)[9:]))
        for p, b in sorted(files.items())
    )
    return encode_record(
        Record(
            name=name,
            step=None,
            size=sum(f.size for f in entries),
            digest=manifest_digest((f.path, f.size, f.digest) for f in entries),
            files=entries,
            created=datetime(2020, 1, 1, tzinfo=timezone.utc),
            metadata={},
            kind="dir",
        )
    )


# -- finding 5: a planted pending record is untrusted -----------------------------------------
@pytest.mark.parametrize("wrong", [True, False])
def test_planted_pending_record_never_removes_a_committed_artifact(
    target: Opened, wrong: bool
) -> None:
    store, door, reopen = target
    store.put_bytes("runs/a.pt", b"committed a" * 50)
    store.put_bytes("runs/b.pt", b"committed b" * 50)
    files = {"a.pt": b"committed a" * 50, "b.pt": b"committed b" * 50}
    door.write(pending_path("runs"), planted_folder_record("runs", files, wrong=wrong))

    report = reopen().gc(min_age=0)

    assert door.read("runs/a.pt") == b"committed a" * 50
    assert door.read("runs/b.pt") == b"committed b" * 50
    assert door.read(record_path("runs/a.pt")) is not None
    assert door.read(record_path("runs")) is None, "a folder record over committed artifacts"
    assert reopen().verify().ok
    assert not any(i.path.startswith("runs/") for i in report.removed)


def test_planted_pending_record_removes_only_unrecorded_files_it_names(target: Opened) -> None:
    """A new folder's upload that stopped part way is rolled back by the exact list its pending
    record names: a file it does not name, or one a committed record names, stays."""
    store, door, reopen = target
    store.put_bytes("runs/kept.pt", b"kept" * 10)
    door.write("runs/x.bin", b"x" * 30)  # uploaded by the stopped commit
    door.write("runs/other.bin", b"o" * 30)  # not named by its pending record
    listed = {"x.bin": b"x" * 30, "y.bin": b"y" * 30, "kept.pt": b"kept" * 10}
    door.write(pending_path("runs"), planted_folder_record("runs", listed, wrong=False))

    reopen().gc(min_age=0)

    assert door.read("runs/kept.pt") == b"kept" * 10
    assert door.read("runs/other.bin") == b"o" * 30
    assert reopen().verify("runs/kept.pt").ok


# -- finding 4: a dead multi-writer folder's marker -------------------------------------------
def test_dead_folder_write_never_takes_a_later_artifact_under_its_name(moto: MotoServer) -> None:
    store, door, reopen = _s3(moto)
    fw = store.begin_folder("runs")
    fw.write_bytes("shard-0.bin", b"s0" * 40)  # then every writer dies: no commit, no abort
    store.put_bytes("runs/step_10.pt", b"ten" * 40)

    reopen().gc(min_age=0)

    assert door.read("runs/step_10.pt") == b"ten" * 40
    assert reopen().verify("runs/step_10.pt").ok
    assert door.read("runs/shard-0.bin") is None, "the dead write's own file is removed"
    assert not [f for f in door.files() if f.startswith(".commitstore/folders/")]


def test_dead_folder_marker_from_an_older_version_removes_no_file(moto: MotoServer) -> None:
    """A marker without a file list (written before markers listed their files) removes no
    file: only the marker goes."""
    store, door, reopen = _s3(moto)
    store.put_bytes("runs/step_10.pt", b"ten" * 40)
    door.write("runs/orphan.bin", b"o" * 10)
    marker = json.dumps({"name": "runs", "id": "0123456789abcdef"}).encode()
    door.write(".commitstore/folders/0123456789abcdef.json", marker)

    reopen().gc(min_age=0)

    assert door.read("runs/step_10.pt") == b"ten" * 40
    assert door.read("runs/orphan.bin") == b"o" * 10
    assert door.read(".commitstore/folders/0123456789abcdef.json") is None


# -- finding 10: a live writer's staging entry, whatever its age ------------------------------
def staging_files(door: Any) -> list[str]:
    return [f for f in door.files() if ".commitstore.tmp." in f]


def test_gc_keeps_the_staging_folder_of_a_paused_stage_dir(tmp_path: Path) -> None:
    """The caller pauses inside ``stage_dir`` (gc's ``min_age=0``: any age counts as old); gc
    keeps the folder because its writer holds it, and the commit publishes every file."""
    store, door, reopen = _local(tmp_path)
    src = tmp_path / "more"
    src.mkdir()
    (src / "b.bin").write_bytes(b"b" * 70)
    with store.stage_dir("ckpt") as d:
        (d / "a.bin").write_bytes(b"a" * 50)
        report = reopen().gc(min_age=0)
        assert [f.rsplit("/", 1)[-1] for f in staging_files(door)] == ["a.bin"]
        assert [(i.kind, i.reason) for i in report.kept] == [("staging", "held by a live writer")]
        shutil.copytree(src, d, dirs_exist_ok=True)
    assert door.read("ckpt/a.bin") == b"a" * 50
    assert door.read("ckpt/b.bin") == b"b" * 70
    assert reopen().verify("ckpt").ok


def test_gc_keeps_the_staging_file_of_a_paused_stage(tmp_path: Path) -> None:
    store, door, reopen = _local(tmp_path)
    with store.stage("model.pt") as st:
        st.write(b"first half ")
        reopen().gc(min_age=0)
        assert len(staging_files(door)) == 1
        st.write(b"second half")
    assert door.read("model.pt") == b"first half second half"
    assert reopen().verify().ok


def test_a_staging_folder_removed_under_its_writer_is_never_published(tmp_path: Path) -> None:
    """Removed under the writer (by another tool) and made again by the caller's copytree: the
    commit fails, the name keeps its old version, and nothing partial verifies."""
    store, door, reopen = _local(tmp_path)
    store.put_bytes("ckpt", b"old version")
    src = tmp_path / "more"
    src.mkdir()
    (src / "b.bin").write_bytes(b"b" * 70)
    with (
        pytest.raises(CommitError, match="made again"),
        store.stage_dir("ckpt", overwrite=True) as d,
    ):
        (d / "a.bin").write_bytes(b"a" * 50)
        shutil.rmtree(d)
        shutil.copytree(src, d, dirs_exist_ok=True)
    assert door.read("ckpt") == b"old version"
    assert reopen().verify().ok
    assert reopen().read_bytes("ckpt") == b"old version"


DEAD_WRITER = """
import sys, os, signal
from commitstore import CommitError, open_store
with open_store(sys.argv[1]).stage_dir("ckpt") as d:
    (d / "a.bin").write_bytes(b"a" * 50)
    print("ready", flush=True)
    sys.stdin.readline()
"""


def test_gc_removes_the_staging_folder_of_a_killed_writer(tmp_path: Path) -> None:
    """The lock dies with its writer: a SIGKILLed writer's staging folder is removed."""
    _store, door, reopen = _local(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", DEAD_WRITER, str(tmp_path / "store")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    assert len(staging_files(door)) == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    report = reopen().gc(min_age=0)
    assert staging_files(door) == []
    assert [i.kind for i in report.removed] == ["staging"]


# -- finding 9: an object-store replace longer than min_age -----------------------------------
def test_gc_leaves_a_live_s3_folder_replace_alone(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer pauses among its copies for longer than gc's ``min_age``; its heartbeat keeps
    its pending record young, so gc neither drops it nor removes the staged copy, and the
    replace completes."""
    prefix = f"h{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    store = open_store(url, heartbeat=0.2, **opts)
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    old = {"a.bin": b"old a" * 20, "b.bin": b"old b" * 20, "c.bin": b"old c" * 20}
    new = {"a.bin": b"NEW a" * 30, "b.bin": b"NEW b" * 30, "c.bin": b"NEW c" * 30}
    with store.stage_dir("ckpt", overwrite=False) as d:
        for p, b in old.items():
            (d / p).write_bytes(b)
    backend: Any = store._committer.backend
    copies = [0]
    paused, go = threading.Event(), threading.Event()
    original = backend.copy_checked
    lock = threading.Lock()  # the files are copied several at a time

    def copy_checked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            copies[0] += 1
            second = copies[0] == 2
        if second:  # a copy started before this one: the final keys are (becoming) a mix
            paused.set()
            assert go.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(backend, "copy_checked", copy_checked)
    errors: list[BaseException] = []

    def replace() -> None:
        try:
            with store.stage_dir("ckpt", overwrite=True) as d:
                for p, b in new.items():
                    (d / p).write_bytes(b)
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=replace)
    writer.start()
    try:
        assert paused.wait(60)
        min_age = 1.0
        time.sleep(3 * min_age)  # the writer pauses longer than gc's min_age
        report = open_store(url, **opts).gc(min_age=min_age)
        assert [i for i in report.removed if i.kind in ("pending", "staging")] == []
        assert pending_paths(door, "ckpt") != [], "gc dropped a live writer's pending record"
        assert [f for f in door.files() if f.startswith(".commitstore/staged/")] != []
    finally:
        go.set()
        writer.join(60)
    assert errors == []
    assert {p: door.read(f"ckpt/{p}") for p in new} == new
    assert open_store(url, **opts).verify("ckpt").ok


def test_gc_leaves_a_live_s3_folder_write_alone(moto: MotoServer) -> None:
    """A multi-writer folder write whose writer keeps a file open for longer than gc's
    ``min_age``: its marker's heartbeat keeps the write alive, so gc removes none of its files
    and the commit succeeds."""
    prefix = f"f{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    store = open_store(url, heartbeat=0.2, **opts)
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    fw = store.begin_folder("runs")
    first = fw.write_bytes("a.bin", b"a" * 40)
    f = fw.open_file("b.bin")
    f.write(b"b" * 30)
    min_age = 1.0
    time.sleep(3 * min_age)  # the writer pauses longer than gc's min_age
    report = open_store(url, **opts).gc(min_age=min_age)
    assert [i for i in report.removed if i.kind == "folder"] == []
    assert door.read("runs/a.bin") == b"a" * 40
    second = f.finish()
    fw.commit([first, second])
    assert open_store(url, **opts).verify("runs").ok
    assert [f for f in door.files() if f.startswith(".commitstore/folders/")] == []


def test_gc_leaves_a_live_s3_multipart_upload_alone(moto: MotoServer) -> None:
    """A writer streaming a large artifact pauses between parts for longer than gc's
    ``min_age``: its upload's proof of life (rewritten every ``heartbeat`` seconds) keeps it
    young, so gc aborts nothing and the commit lands whole. gc aborted the upload by its
    parts' age, and the writer's next part failed."""
    prefix = f"u{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    part = 5 << 20
    store = open_store(url, heartbeat=0.2, single_put_max=part, part_size=part, **opts)
    body = [bytes([i]) * part for i in range(3)]
    min_age = 1.0
    with store.stage("big.bin") as f:
        f.write(body[0])
        f.write(body[1])  # the first part is on its way: the upload exists
        time.sleep(3 * min_age)  # the writer pauses longer than gc's min_age
        report = open_store(url, **opts).gc(min_age=min_age)
        assert [i for i in report.removed if i.kind == "upload"] == [], report
        assert any(i.kind == "upload" for i in report.kept), report
        f.write(body[2])
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    assert door.read("big.bin") == b"".join(body)
    assert open_store(url, **opts).verify("big.bin").ok
    assert [k for k in door.files() if k.startswith(".commitstore/uploads/")] == []


KILLED_UPLOAD = """
import os, signal, sys, time
from commitstore import open_store
opts = dict(endpoint_url=sys.argv[2], key=sys.argv[3], secret=sys.argv[4])
store = open_store(sys.argv[1], heartbeat=0.2, single_put_max=5 << 20, part_size=5 << 20, **opts)
f = store.stage("big.bin")
f.write(b"x" * (11 << 20))
time.sleep(1)
print("uploading", flush=True)
time.sleep(600)
"""


def test_gc_aborts_the_upload_of_a_killed_writer(moto: MotoServer) -> None:
    """The proof of life stops with its writer: once it is older than ``min_age``, gc aborts
    the upload and removes its marker."""
    prefix = f"k{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLED_UPLOAD,
            url,
            opts["endpoint_url"],
            opts["key"],
            opts["secret"],
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **moto.env()},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "uploading"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    assert [k for k in door.files() if k.startswith(".commitstore/uploads/")] != []
    min_age = 1.0
    time.sleep(2 * min_age)
    report = open_store(url, **opts).gc(min_age=min_age)
    assert [i.kind for i in report.removed].count("upload") == 1, report
    assert [k for k in door.files() if k.startswith(".commitstore/uploads/")] == []
    assert door.read("big.bin") is None
