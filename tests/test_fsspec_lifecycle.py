"""``commit://`` lifecycle edges: a root-less URL into a committed folder artifact never makes a
store inside it (writes there are refused, ``rm`` deletes the folder through its store), and a
file commits only on an explicit ``close()`` or a clean ``with`` exit, never from a finalizer
or while an exception (even the one handled at open, raised again) propagates.

Assertions read the storage through a backdoor (the raw folder), never through the API alone."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

import commitstore
from commitstore import AlreadyExistsError, open_store
from commitstore.testing import LocalBackdoor

ROOT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A store at ``run`` holding the folder artifact ``ck`` (two files) and ``m.pt``."""
    root = tmp_path / "run"
    store = commitstore.open_store(root)
    with store.stage_dir("ck") as d:
        (d / "a.bin").write_bytes(b"a" * 100)
        (d / "sub").mkdir()
        (d / "sub" / "b.bin").write_bytes(b"b" * 50)
    store.put_bytes("m.pt", b"good version")
    return root


def _meta_dirs(root: Path) -> list[str]:
    """Every ``.commitstore`` folder under ``root`` (the store's own is ``.commitstore``)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".commitstore") if p.is_dir())


# -- finding 6: no store inside a committed folder artifact -------------------------------------
@pytest.mark.parametrize("member", ["notes.txt", "sub/notes.txt", "a.bin"])
def test_rootless_write_into_a_folder_artifact_is_refused(run: Path, member: str) -> None:
    with pytest.raises(AlreadyExistsError), fsspec.open(f"commit://{run}/ck/{member}", "wb") as f:
        f.write(b"x")
    assert _meta_dirs(run) == [".commitstore"]
    assert not (run / "ck" / "notes.txt").exists()
    assert (run / "ck" / "a.bin").read_bytes() == b"a" * 100
    report = commitstore.open_store(run).verify()
    assert report.ok, report
    assert [r.status for r in report.results] == ["ok", "ok"]


def test_rootless_pipe_into_a_folder_artifact_is_refused(run: Path) -> None:
    fs = fsspec.filesystem("commit")
    with pytest.raises(AlreadyExistsError):
        fs.pipe_file(f"{run}/ck/sub/new.bin", b"y")
    assert _meta_dirs(run) == [".commitstore"]
    assert commitstore.open_store(run).verify().ok


def test_rootless_rm_recursive_deletes_the_folder_artifact(run: Path) -> None:
    fs = fsspec.filesystem("commit")
    fs.rm(f"{run}/ck", recursive=True)
    assert not (run / "ck").exists()
    door = LocalBackdoor(run)
    assert sorted(f for f in door.files() if not f.startswith(".commitstore")) == ["m.pt"]
    assert [r.name for r in commitstore.open_store(run).list()] == ["m.pt"]


def test_rootless_reads_and_listings_inside_a_folder_artifact(run: Path) -> None:
    fs = fsspec.filesystem("commit")
    assert fs.cat_file(f"{run}/ck/sub/b.bin") == b"b" * 50
    assert sorted(fs.ls(f"{run}/ck", detail=False)) == [f"{run}/ck/a.bin", f"{run}/ck/sub"]
    assert fs.ls(f"{run}/ck/sub", detail=False) == [f"{run}/ck/sub/b.bin"]
    with pytest.raises(PermissionError):
        fs.rm_file(f"{run}/ck/a.bin")
    assert _meta_dirs(run) == [".commitstore"]


def test_rootless_writes_beside_a_folder_artifact_still_commit(run: Path) -> None:
    with fsspec.open(f"commit://{run}/other.pt", "wb") as f:
        f.write(b"beside")
    (run / "plain").mkdir()
    with fsspec.open(f"commit://{run}/plain/x.pt", "wb") as f:
        f.write(b"own store")
    assert commitstore.open_store(run).read_bytes("other.pt") == b"beside"
    assert commitstore.open_store(run / "plain").read_bytes("x.pt") == b"own store"
    assert commitstore.open_store(run).verify().ok


# -- finding 11: only an explicit close or a clean with-exit commits -----------------------------
def _half_written_then_dropped(url: str) -> None:
    f = fsspec.open(url, "wb").open()
    f.write(b"half of a")
    raise RuntimeError("training step failed")


def test_a_dropped_file_is_aborted_by_gc_not_committed(run: Path) -> None:
    with pytest.raises(RuntimeError):
        _half_written_then_dropped(f"commit://{run}/m.pt")
    gc.collect()
    assert (run / "m.pt").read_bytes() == b"good version"
    assert commitstore.open_store(run).verify("m.pt").ok
    assert [f for f in LocalBackdoor(run).files() if ".commitstore.tmp." in f] == []


def test_a_file_never_closed_is_not_committed_at_exit(run: Path) -> None:
    script = (
        "import sys, fsspec\n"
        "f = fsspec.open(sys.argv[1], 'wb').open()\n"
        "f.write(b'half written')\n"
        "keep = [f]\n"  # alive until the interpreter tears its modules down
    )
    res = subprocess.run(
        [sys.executable, "-c", script, f"commit://{run}/m.pt"],
        cwd=ROOT_DIR,
        env={**os.environ, "PYTHONPATH": str(ROOT_DIR / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert (run / "m.pt").read_bytes() == b"good version"
    assert commitstore.open_store(run).verify("m.pt").ok


def test_a_bare_raise_inside_with_in_an_except_block_publishes_nothing(run: Path) -> None:
    with pytest.raises(ValueError, match="first"):
        try:
            raise ValueError("first")
        except ValueError:
            with fsspec.open(f"commit://{run}/m.pt", "wb") as f:
                f.write(b"bad")
                raise
    assert (run / "m.pt").read_bytes() == b"good version"


def test_raising_the_handled_exception_by_name_publishes_nothing(run: Path) -> None:
    with pytest.raises(ValueError, match="first"):
        try:
            raise ValueError("first")
        except ValueError as exc:
            with fsspec.open(f"commit://{run}/m.pt", "wb") as f:
                f.write(b"bad")
                raise exc
    assert (run / "m.pt").read_bytes() == b"good version"


def test_a_clean_with_inside_an_except_block_commits(run: Path) -> None:
    try:
        raise ValueError("first")
    except ValueError:
        with fsspec.open(f"commit://{run}/m.pt", "wb") as f:
            f.write(b"new version")
    assert (run / "m.pt").read_bytes() == b"new version"
    assert commitstore.open_store(run).verify("m.pt").ok


def test_an_explicit_close_commits(run: Path) -> None:
    f = fsspec.open(f"commit://{run}/m.pt", "wb").open()
    f.write(b"closed on purpose")
    f.close()
    assert (run / "m.pt").read_bytes() == b"closed on purpose"


def test_probing_paths_that_are_no_store_warns_nothing(
    tmp_path: Path, recwarn: pytest.WarningsRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """``exists``/``info``/``ls`` of root-less paths open the folders above as stores; one that
    is no store is a plain "not there" (False, FileNotFoundError), not a "no store at" warning
    (a store opened by a user still warns when a read finds its root missing)."""
    store = open_store(str(tmp_path))
    store.put_bytes("a.pt", b"A")
    (tmp_path / "plain.pt").write_bytes(b"not an artifact")
    fs = fsspec.filesystem("commit")
    assert fs.exists(f"{tmp_path}/a.pt")
    assert not fs.exists(f"{tmp_path}/plain.pt")
    assert not fs.exists(f"{tmp_path}/nothing/here.pt")
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{tmp_path}/nothing")
    assert not [w for w in recwarn if "no store at" in str(w.message)]
    assert "no store at" not in caplog.text
    with pytest.warns(UserWarning, match="no store at"):
        assert open_store(str(tmp_path / "typo")).list() == []
