"""``commit://`` through fsspec itself: writes commit on a clean close only, reads verify,
listings show records. Assertions read the storage through a backdoor (raw files, boto3)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fsspec
import fsspec.tests.abstract as fsspec_abstract
import pytest
import xxhash

import commitstore
from commitstore import IntegrityError
from commitstore.fsspec import CommitFileSystem
from commitstore.layout import record_parts, validate_name
from commitstore.testing import LocalBackdoor, S3Backdoor

from .helpers.s3servers import BUCKET, MotoServer


def _digest(data: bytes) -> str:
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)


def _record(door: Any, name: str) -> dict[str, Any] | None:
    raw = door.read("/".join(record_parts(validate_name(name))))
    return None if raw is None else dict(json.loads(raw))


def _public(door: Any) -> list[str]:
    """Every file under the root that is not the store's own (records, staging)."""
    return [f for f in door.files() if not f.startswith(".commitstore")]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "run1"
    r.mkdir()
    return r


def test_protocol_is_registered_through_the_entry_point() -> None:
    cls = fsspec.get_filesystem_class("commit")
    assert cls is CommitFileSystem
    assert cls.cachable is False


def test_clean_close_commits_with_a_record(root: Path) -> None:
    data = os.urandom(100_000)
    with fsspec.open(f"commit://{root}/x.pt", "wb") as f:
        f.write(data)
        assert _public(LocalBackdoor(root)) == []  # nothing under any name before the close
    door = LocalBackdoor(root)
    assert door.read("x.pt") == data
    rec = _record(door, "x.pt")
    assert rec is not None and rec["size"] == len(data) and rec["digest"] == _digest(data)
    with fsspec.open(f"commit://{root}/x.pt", "rb") as f:
        assert f.read() == data


def test_exception_inside_with_publishes_nothing(root: Path) -> None:
    commitstore.open_store(root).put_bytes("old.pt", b"old")
    with pytest.raises(RuntimeError, match="boom"), fsspec.open(f"commit://{root}/x.pt", "wb") as f:
        f.write(b"half of a checkpoint")
        raise RuntimeError("boom")
    with (
        pytest.raises(RuntimeError, match="boom"),
        fsspec.open(f"commit://{root}/old.pt", "wb") as f,
    ):
        f.write(b"new")
        raise RuntimeError("boom")
    door = LocalBackdoor(root)
    assert _public(door) == ["old.pt"]
    assert _record(door, "x.pt") is None
    assert door.read("old.pt") == b"old"
    assert [f for f in door.files() if ".commitstore.tmp." in f] == []


def test_a_clean_write_inside_an_except_block_still_commits(root: Path) -> None:
    try:
        raise KeyError("handled before the file was opened")
    except KeyError:
        with fsspec.open(f"commit://{root}/x.pt", "wb") as f:
            f.write(b"whole")
    assert LocalBackdoor(root).read("x.pt") == b"whole"
    assert _record(LocalBackdoor(root), "x.pt") is not None


def test_transaction_commits_at_its_end_and_discards_on_error(root: Path) -> None:
    fs = fsspec.filesystem("commit")
    door = LocalBackdoor(root)
    with fs.transaction:
        with fs.open(f"{root}/a.pt", "wb") as f:
            f.write(b"a")
        with fs.open(f"{root}/b.pt", "wb") as f:
            f.write(b"b")
        assert _public(door) == []  # closed, but not committed before the transaction ends
    assert _public(door) == ["a.pt", "b.pt"]
    with pytest.raises(ValueError, match="stop"), fs.transaction:
        with fs.open(f"{root}/c.pt", "wb") as f:
            f.write(b"c")
        raise ValueError("stop")
    assert _public(door) == ["a.pt", "b.pt"]
    assert _record(door, "c.pt") is None


def test_xb_is_create_only(root: Path) -> None:
    fsspec.filesystem("commit").pipe_file(f"{root}/x.pt", b"first")
    with pytest.raises(FileExistsError):
        fsspec.open(f"commit://{root}/x.pt", "xb").open()
    assert LocalBackdoor(root).read("x.pt") == b"first"


def test_reads_refuse_damaged_bytes(root: Path) -> None:
    fs = fsspec.filesystem("commit")
    fs.pipe_file(f"{root}/x.pt", b"0123456789")
    LocalBackdoor(root).write("x.pt", b"0123456780")  # same size, one byte differs
    with pytest.raises(IntegrityError), fsspec.open(f"commit://{root}/x.pt", "rb") as f:
        f.read()
    with pytest.raises(IntegrityError):
        fs.cat_file(f"{root}/x.pt")
    with pytest.raises(IntegrityError):
        fs.get_file(f"{root}/x.pt", str(root.parent / "out.pt"))
    assert not (root.parent / "out.pt").exists()


def test_listings_show_committed_artifacts_only(root: Path) -> None:
    store = commitstore.open_store(root)
    store.put_bytes("a.pt", b"aaaa", step=3)
    with store.stage_dir("ckpt/step_10") as d:
        (d / "model.bin").write_bytes(b"m" * 10)
        (d / "sub").mkdir()
        (d / "sub" / "opt.bin").write_bytes(b"o" * 7)
    (root / "stray.pt").write_bytes(b"no record")
    (root / ".commitstore.tmp.x.pt.123").write_bytes(b"staging")
    fs = fsspec.filesystem("commit", root=str(root))
    assert fs.ls(str(root), detail=False) == [f"{root}/a.pt", f"{root}/ckpt"]
    info = fs.info(f"{root}/a.pt")
    assert (info["size"], info["digest"], info["step"]) == (4, _digest(b"aaaa"), 3)
    assert fs.info(f"{root}/ckpt")["type"] == "directory"
    assert fs.info(f"{root}/ckpt/step_10")["type"] == "directory"
    assert sorted(fs.find(str(root))) == [
        f"{root}/a.pt",
        f"{root}/ckpt/step_10/model.bin",
        f"{root}/ckpt/step_10/sub/opt.bin",
    ]
    member = fs.info(f"{root}/ckpt/step_10/sub/opt.bin")
    assert (member["size"], member["digest"]) == (7, _digest(b"o" * 7))
    assert fs.cat_file(f"{root}/ckpt/step_10/model.bin") == b"m" * 10
    assert not fs.exists(f"{root}/stray.pt")
    LocalBackdoor(root).write("ckpt/step_10/model.bin", b"m" * 9 + b"X")
    with pytest.raises(IntegrityError):
        fs.cat_file(f"{root}/ckpt/step_10/model.bin")


def test_rm_deletes_through_the_store(root: Path) -> None:
    store = commitstore.open_store(root)
    store.put_bytes("a.pt", b"a")
    with store.stage_dir("d/f") as d:
        (d / "w.bin").write_bytes(b"w")
    fs = fsspec.filesystem("commit", root=str(root))
    with pytest.raises(PermissionError):
        fs.rm(f"{root}/d/f/w.bin")
    fs.rm(f"{root}/a.pt")
    door = LocalBackdoor(root)
    assert door.read("a.pt") is None and _record(door, "a.pt") is None
    fs.rm(f"{root}/d", recursive=True)
    assert _public(door) == [] and store.list() == []


def test_pipe_cat_put_get(root: Path, tmp_path: Path) -> None:
    fs = fsspec.filesystem("commit")
    fs.pipe_file(f"{root}/p.pt", b"piped", step=7)
    assert fs.cat_file(f"{root}/p.pt") == b"piped"
    assert fs.cat_file(f"{root}/p.pt", start=1, end=3) == b"ip"
    src = tmp_path / "local.bin"
    src.write_bytes(b"put me")
    fs.put_file(str(src), f"{root}/q.pt")
    fs.get_file(f"{root}/q.pt", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == b"put me"
    recs = {r.name: r for r in commitstore.open_store(root).list()}
    assert recs["p.pt"].step == 7 and recs["q.pt"].size == 6


def test_writes_outside_the_root_are_refused(root: Path) -> None:
    fs = fsspec.filesystem("commit", root=str(root))
    with pytest.raises(commitstore.ConfigurationError):
        fs.pipe_file(f"{root.parent}/elsewhere.pt", b"x")
    with pytest.raises(commitstore.ConfigurationError):
        fs.open(f"{root}/x.pt", "ab")


# -- over S3 (moto) ---------------------------------------------------------------------------
@pytest.fixture
def s3(moto: MotoServer, request: pytest.FixtureRequest) -> tuple[str, S3Backdoor]:
    prefix = f"fs-{request.node.name[:40]}"
    return f"{BUCKET}/{prefix}", S3Backdoor(moto.client(), BUCKET, prefix)


def test_chained_s3_url_commits_and_verifies(moto: MotoServer, s3: tuple[str, S3Backdoor]) -> None:
    base, door = s3
    data = os.urandom(50_000)
    url = f"commit::s3://{base}/x.pt"
    with fsspec.open(url, "wb", s3=moto.options()) as f:
        f.write(data)
    assert door.read("x.pt") == data
    rec = _record(door, "x.pt")
    assert rec is not None and rec["digest"] == _digest(data)
    with fsspec.open(url, "rb", s3=moto.options()) as f:
        assert f.read() == data
    damaged = bytearray(data)
    damaged[1234] ^= 0x10
    door.write("x.pt", bytes(damaged))
    with pytest.raises(IntegrityError), fsspec.open(url, "rb", s3=moto.options()) as f:
        f.read()


def test_chained_s3_with_a_root(moto: MotoServer, s3: tuple[str, S3Backdoor]) -> None:
    base, door = s3
    url = f"commit::s3://{base}/sub/deeper/x.pt"
    with fsspec.open(url, "wb", s3=moto.options(), commit={"root": f"s3://{base}"}) as f:
        f.write(b"rooted")
    assert _record(door, "sub/deeper/x.pt") is not None
    with (
        pytest.raises(RuntimeError),
        fsspec.open(f"commit::s3://{base}/y.pt", "wb", s3=moto.options()) as f,
    ):
        f.write(b"never")
        raise RuntimeError
    assert door.read("y.pt") is None


def test_pandas_parquet_round_trip(moto: MotoServer, s3: tuple[str, S3Backdoor]) -> None:
    import pandas as pd

    base, door = s3
    url = f"commit::s3://{base}/table.parquet"
    df = pd.DataFrame({"step": list(range(100)), "loss": [1.0 / (i + 1) for i in range(100)]})
    df.to_parquet(url, storage_options={"s3": moto.options()})
    rec = _record(door, "table.parquet")
    raw = door.read("table.parquet")
    assert rec is not None and raw is not None and rec["digest"] == _digest(raw)
    back = pd.read_parquet(url, storage_options={"s3": moto.options()})
    assert back.equals(df)


def test_torch_save_and_load_through_fsspec(root: Path) -> None:
    import torch

    state = {"w": torch.arange(12.0).reshape(3, 4), "step": 5}
    with fsspec.open(f"commit://{root}/model.pt", "wb") as f:
        torch.save(state, f)
    with fsspec.open(f"commit://{root}/model.pt", "rb") as f:
        back = torch.load(f, weights_only=True)
    assert torch.equal(back["w"], state["w"]) and back["step"] == 5
    assert commitstore.open_store(root).verify("model.pt").ok


# -- fsspec's own abstract tests ----------------------------------------------------------------
class _CommitFixtures(fsspec_abstract.AbstractFixtures):  # type: ignore[misc]
    """Where they apply: open, pipe, put, get, copy and move run unchanged on a rooted
    ``commit://`` filesystem over a local folder. Empty directories do not exist (a directory is
    implicit in the names of the artifacts under it), which the suite's own
    ``supports_empty_directories`` fixture covers."""

    @pytest.fixture
    def fs(self, tmp_path: Path) -> Any:
        return fsspec.filesystem("commit", root=str(tmp_path / "store"))

    @pytest.fixture
    def fs_path(self, tmp_path: Path) -> str:
        return str(tmp_path / "store")

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False


class TestFsspecOpen(_CommitFixtures, fsspec_abstract.AbstractOpenTests):  # type: ignore[misc]
    pass


class TestFsspecPipe(_CommitFixtures, fsspec_abstract.AbstractPipeTests):  # type: ignore[misc]
    pass


# The glob edge cases (29 cases per class, each a few dozen listings) run in the soak session.
class TestFsspecPut(_CommitFixtures, fsspec_abstract.AbstractPutTests):  # type: ignore[misc]
    test_put_glob_edge_cases = pytest.mark.soak(
        fsspec_abstract.AbstractPutTests.test_put_glob_edge_cases
    )


class TestFsspecGet(_CommitFixtures, fsspec_abstract.AbstractGetTests):  # type: ignore[misc]
    test_get_glob_edge_cases = pytest.mark.soak(
        fsspec_abstract.AbstractGetTests.test_get_glob_edge_cases
    )


class TestFsspecCopy(_CommitFixtures, fsspec_abstract.AbstractCopyTests):  # type: ignore[misc]
    test_copy_glob_edge_cases = pytest.mark.soak(
        fsspec_abstract.AbstractCopyTests.test_copy_glob_edge_cases
    )
