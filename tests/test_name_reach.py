"""Operations on one name never reach into another, and nothing committed is lost.

``adopt`` refuses, before writing anything, when a store of its own sits below the root, and
when the name it is given lies inside a committed artifact; it never adopts a key below a
committed file (object stores) nor anything a write in flight owns (a folder commit open in
this process, a commit stopped in another process before its record). ``get_file``, ``fetch``
and ``commitstore get`` refuse a destination inside the local store's own folder before any
I/O; ``open_store`` refuses a mirror that is, holds or lies inside the primary. Every state is
read through the backdoor: a refused call leaves the bytes under the root as they were.
"""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from commitstore import ConfigurationError, NameConflictError, open_store
from commitstore.cli import main as cli_main
from commitstore.testing import LocalBackdoor, S3Backdoor, Target, record_path
from commitstore.testing.crashwriter import FOLDER, Writer

from .helpers.s3servers import BUCKET, MotoServer


def make_target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if kind == "local":
        root = tmp_path / "store"
        return Target(open_store(str(root)), LocalBackdoor(root), lambda: open_store(str(root)))
    moto: MotoServer = request.getfixturevalue("moto")
    prefix = f"r{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    return Target(open_store(url, **opts), door, lambda: open_store(url, **opts))


def snapshot(t: Target) -> dict[str, bytes | None]:
    """Every file under the root and its bytes (the record cache aside)."""
    return {f: t.door.read(f) for f in t.door.files() if not f.startswith(".commitstore/cache/")}


def a_zip(tag: bytes) -> bytes:
    """A whole zip (a torch checkpoint's container): adopt's structural check passes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("data", tag * 10)
    return buf.getvalue()


# -- 1. a store of its own below the root ----------------------------------------------------
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_adopt_refuses_a_nested_store_before_writing_anything(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target(kind, request, tmp_path)
    t.door.write("a.pt", a_zip(b"a"))  # sorts before the nested store: adopted first, before
    if kind == "local":
        inner = open_store(str(tmp_path / "store" / "sub"))
    else:
        inner = open_store(f"{t.store.url}/sub", **request.getfixturevalue("moto").options())
    inner.put_bytes("x.pt", a_zip(b"x"))
    before = snapshot(t)
    for name in (None, "sub", "sub/x.pt"):
        with pytest.raises(NameConflictError, match="store of its own"):
            t.store.adopt(name, trust=True)
        assert snapshot(t) == before
    assert t.door.read(record_path("a.pt")) is None
    assert inner.verify(level="full").ok


# -- 2. a key below a committed file (object stores) -----------------------------------------
def test_adopt_never_adopts_a_key_below_a_committed_file(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target("s3", request, tmp_path)
    t.store.put_bytes("a.pt", a_zip(b"a"))
    t.door.write("a.pt/x", b"foreign")
    before = snapshot(t)
    report = t.store.adopt(trust=True)
    assert report.adopted == ()
    assert "inside the committed file artifact a.pt" in report.rejected["a.pt/x"]
    assert snapshot(t) == before
    with pytest.raises(NameConflictError, match=r"inside the committed artifact a\.pt"):
        t.store.adopt("a.pt/x", trust=True)
    assert snapshot(t) == before
    assert t.door.read(record_path("a.pt/x")) is None


# -- 3. a member of a committed folder -------------------------------------------------------
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_adopt_refuses_a_file_inside_a_committed_folder(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target(kind, request, tmp_path)
    with t.store.stage_dir("ck") as d:
        (d / "model.bin").write_bytes(a_zip(b"m"))
    before = snapshot(t)
    with pytest.raises(NameConflictError, match="inside the committed artifact ck"):
        t.store.adopt("ck/model.bin", trust=True)
    assert snapshot(t) == before
    assert t.door.read(record_path("ck/model.bin")) is None
    assert t.store.verify(level="full").ok


# -- 4. writes in flight ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_adopt_skips_a_folder_commit_open_below_the_name(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``checkpoint-5`` holds an unrecorded file and a folder commit still being written
    (``checkpoint-5/sub``): neither ``adopt()`` (which groups ``checkpoint-5``) nor
    ``adopt("checkpoint-5")`` claims it, and the folder commit then succeeds."""
    t = make_target(kind, request, tmp_path)
    t.door.write("checkpoint-5/config.json", b"{}")
    folder = t.store.begin_folder("checkpoint-5/sub")
    first = folder.write_bytes("a.json", b"[]")
    for report in (t.store.adopt(trust=True), t.store.adopt("checkpoint-5", trust=True)):
        assert report.adopted == ()
        assert "checkpoint-5" in report.rejected
    assert t.door.read(record_path("checkpoint-5")) is None
    rec = folder.commit([first])
    assert rec.name == "checkpoint-5/sub"
    assert t.door.read(record_path("checkpoint-5/sub")) is not None
    assert t.store.verify("checkpoint-5/sub", level="full").ok


def test_adopt_skips_a_folder_another_process_is_committing(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A second process stopped between a folder's uploads and its record (object store): its
    files are in place, unrecorded; adopt claims none of them, and the commit then completes
    as one folder artifact."""
    t = make_target("s3", request, tmp_path)
    writer = Writer(t, FOLDER, b"payload", "before-record")
    try:
        assert writer.state == "stopped"
        files = [f for f in t.door.files() if f.startswith(f"{FOLDER}/")]
        assert files  # the uploads are in place
        report = t.store.adopt(trust=True)
        assert report.adopted == ()
        assert set(report.rejected) == set(files)
        for f in files:
            assert t.door.read(record_path(f)) is None
        assert writer.resume() == "done"
    finally:
        writer.kill()
    assert t.store.record(FOLDER).kind == "dir"
    assert t.store.verify(level="full").ok


# -- 5. a destination inside the store's own folder ------------------------------------------
def test_get_file_and_fetch_refuse_a_destination_inside_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    t = Target(open_store(str(root)), LocalBackdoor(root), lambda: open_store(str(root)))
    t.store.put_bytes("a.pt", b"A" * 100)
    t.store.put_bytes("b.pt", b"B" * 200)
    before = snapshot(t)
    for dest in (root / "a.pt", root, root / "new" / "c.pt"):
        with pytest.raises(NameConflictError, match="inside the store"):
            t.store.get_file("b.pt", dest)
        assert snapshot(t) == before
    for cache in (root, root / "cache"):
        with pytest.raises(ConfigurationError, match="inside the store"):
            t.store.fetch("b.pt", cache_dir=cache)
        assert snapshot(t) == before
    assert cli_main(["get", str(root), "b.pt", str(root / "a.pt")]) == 1
    assert "inside the store" in capsys.readouterr().err
    assert snapshot(t) == before
    assert t.store.verify(level="full").ok
    outside = tmp_path / "out.pt"
    t.store.get_file("b.pt", outside)
    assert outside.read_bytes() == b"B" * 200


# -- 6. a mirror that overlaps the primary ---------------------------------------------------
def test_open_store_refuses_a_local_mirror_overlapping_the_primary(tmp_path: Path) -> None:
    root = tmp_path / "store"
    for mirror in (root, root / "m", tmp_path, f"{root}/./"):
        with pytest.raises(ConfigurationError, match="mirror"):
            open_store(str(root), mirrors=[str(mirror)])
    assert not root.exists() and not (root / "m").exists()
    with pytest.raises(ConfigurationError, match="mirror"):
        open_store(str(root / "p"), mirrors=[str(root / "q"), str(root / "q" / "r")])
    open_store(str(root / "p"), mirrors=[str(root / "p2")]).close()  # siblings are fine


def test_open_store_refuses_an_s3_mirror_overlapping_the_primary(moto: MotoServer) -> None:
    prefix = f"m{time.monotonic_ns()}"
    opts: dict[str, Any] = moto.options()
    for mirror in (prefix, f"{prefix}/inner", ""):
        other = open_store(moto.url(mirror) if mirror else f"s3://{BUCKET}", **opts)
        with pytest.raises(ConfigurationError, match="mirror"):
            open_store(moto.url(prefix), mirrors=[other], **opts)
    fine = open_store(moto.url(prefix + "x"), **opts)
    open_store(moto.url(prefix), mirrors=[fine], **opts).close()
