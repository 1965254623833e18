"""``commitstore.dcp`` with real ``torch.distributed`` gloo groups on CPU (2 and 4 processes,
forked by the test), FSDP2-sharded model and optimizer state, on a local store, on Samba and on S3
(moto): one folder record per save, resharded loads, SIGKILL of a rank mid-save and of the
coordinator before ``finish`` of an ``async_save``, flipped bytes in a shard."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

import commitstore.dcp as cdcp
from commitstore import (
    AlreadyExistsError,
    ConfigurationError,
    IntegrityError,
    InvalidNameError,
    open_store,
)

from .helpers.dcpgroup import plain_model, run_group, sharded_model
from .helpers.s3servers import BUCKET, MotoServer
from .helpers.samba import PASSWORD, SambaServer

FULL = StateDictOptions(full_state_dict=True)


def _state(model: Any, opt: Any, **kw: Any) -> dict[str, Any]:
    msd, osd = get_state_dict(model, opt, **kw)
    return {"model": msd, "optim": osd}


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


# -- what each rank runs (forked: closures are not needed, arguments are not pickled) ---------
def _save(rank: int, world: int, job: tuple[str, dict[str, Any], list[str], str]) -> None:
    url, opts, names, ref = job
    model, opt = sharded_model(world)
    store = open_store(url, **opts)
    for name in names:
        dcp.save(_state(model, opt), storage_writer=cdcp.StorageWriter(store, name))
    full = _state(model, opt, options=FULL)  # a collective: every rank
    if rank == 0:
        torch.save(full, ref)


def _load(rank: int, world: int, job: tuple[str, dict[str, Any], str, str]) -> None:
    url, opts, name, out = job
    model, opt = sharded_model(world, seed=50)  # other values, which the load must replace
    store = open_store(url, **opts)
    sd = _state(model, opt)
    dcp.load(sd, storage_reader=cdcp.StorageReader(store, name))
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    full = _state(model, opt, options=FULL)
    if rank == 0:
        torch.save(full, out)


class _DieMidWrite(DefaultSavePlanner):  # type: ignore[misc]
    """Kills its own process (SIGKILL) when asked for the third item it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.items = 0

    def resolve_data(self, item: Any) -> Any:
        self.items += 1
        if self.items == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().resolve_data(item)


def _crash_mid_save(rank: int, world: int, job: tuple[str, dict[str, Any]]) -> None:
    url, opts = job
    model, opt = sharded_model(world)
    store = open_store(url, **opts)
    dcp.save(_state(model, opt), storage_writer=cdcp.StorageWriter(store, "ck/step_1"))
    planner = _DieMidWrite() if rank == 1 else DefaultSavePlanner()
    dcp.save(
        _state(model, opt), storage_writer=cdcp.StorageWriter(store, "ck/step_2"), planner=planner
    )


class _DieInFinish(cdcp.StorageWriter):
    """The coordinator is killed (SIGKILL) when ``finish`` starts: every shard written."""

    def finish(self, metadata: Any, results: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def _async_then_crash(rank: int, world: int, job: tuple[str, dict[str, Any]]) -> None:
    url, opts = job
    model, opt = sharded_model(world)
    store = open_store(url, **opts)
    dcp.async_save(
        _state(model, opt), storage_writer=cdcp.StorageWriter(store, "ck/step_1")
    ).result()
    dcp.async_save(_state(model, opt), storage_writer=_DieInFinish(store, "ck/step_2")).result()


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks_local(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 2-rank save of steps 1 and 2 to a local store: (store root, full reference state)."""
    base = tmp_path_factory.mktemp("dcp2")
    root, ref = base / "store", base / "ref.pt"
    run_group(base / "g", 2, _save, (str(root), {}, ["ck/step_1", "ck/step_2"], str(ref)))
    return root, ref


@pytest.fixture(scope="module")
def samba(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SambaServer]:
    server = SambaServer(tmp_path_factory.mktemp("samba"))
    try:
        yield server
    finally:
        server.stop()


def _load_one_rank(store: Any, name: str | None) -> dict[str, Any]:
    """Load on one rank (this process, no process group) into an unsharded model."""
    model, opt = plain_model()
    sd = _state(model, opt)
    cdcp.load(sd, store, name)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return _state(model, opt)


# -- tests -------------------------------------------------------------------------------------
def test_two_ranks_commit_one_folder_and_load_on_one_rank(two_ranks_local: Any) -> None:
    root, ref = two_ranks_local
    store = open_store(str(root))
    recs = store.list()
    assert [r.name for r in recs] == ["ck/step_1", "ck/step_2"]
    assert [r.step for r in recs] == [1, 2]
    assert [f.path for f in recs[1].files] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert store.verify(level="full").ok
    assert not [p for p in root.rglob("*") if ".commitstore.tmp." in p.name]
    _assert_same(_load_one_rank(store, "ck/step_2"), torch.load(ref, weights_only=False))
    # name=None: the newest DCP folder that verifies
    _assert_same(_load_one_rank(store, None), torch.load(ref, weights_only=False))


def test_committed_folder_is_a_plain_dcp_checkpoint(two_ranks_local: Any) -> None:
    root, ref = two_ranks_local
    model, opt = plain_model()
    sd = _state(model, opt)
    dcp.load(sd, storage_reader=dcp.FileSystemReader(str(root / "ck" / "step_1")))
    _assert_same(sd["model"], torch.load(ref, weights_only=False)["model"])


def test_flipped_byte_in_a_shard_raises_integrity_error(
    two_ranks_local: Any, tmp_path: Path
) -> None:
    root, _ref = two_ranks_local
    copy = tmp_path / "store"
    shutil.copytree(root, copy)
    shard = copy / "ck" / "step_2" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    store = open_store(str(copy))
    model, opt = plain_model()
    with pytest.raises(CheckpointException) as caught:
        dcp.load(_state(model, opt), storage_reader=cdcp.StorageReader(store, "ck/step_2"))
    errors = [err for err, _tb in caught.value.failures.values()]
    assert isinstance(errors[0], IntegrityError) and errors[0].status == "hash_mismatch"
    with pytest.raises(IntegrityError, match=r"__1_0\.distcp"):
        cdcp.load(_state(model, opt), store, "ck/step_2")
    # name=None skips the damaged step: the newest DCP folder that verifies is step 1
    model1, opt1 = plain_model()
    sd = _state(model1, opt1)
    assert cdcp.load(sd, store).name == "ck/step_1"


def test_four_ranks_to_s3_then_resharded_load_on_two_ranks(
    moto: MotoServer, tmp_path: Path
) -> None:
    url, opts = moto.url("dcp4"), moto.options()
    ref, out = tmp_path / "ref.pt", tmp_path / "out.pt"
    run_group(tmp_path / "g4", 4, _save, (url, opts, ["ck/step_7"], str(ref)))
    store = open_store(url, **opts)
    (rec,) = store.list()
    assert [f.path for f in rec.files] == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    assert store.verify(level="full").ok
    run_group(tmp_path / "g2", 2, _load, (url, opts, "ck/step_7", str(out)))
    _assert_same(torch.load(out, weights_only=False), torch.load(ref, weights_only=False))
    _assert_same(_load_one_rank(store, "ck/step_7"), torch.load(ref, weights_only=False))


def test_two_ranks_to_smb(samba: SambaServer, tmp_path: Path) -> None:
    url, opts = samba.url("dcp"), dict[str, Any](password=PASSWORD)
    ref = tmp_path / "ref.pt"
    run_group(tmp_path / "g", 2, _save, (url, opts, ["ck/step_3"], str(ref)))
    store = open_store(url, **opts)
    assert [r.name for r in store.list()] == ["ck/step_3"]
    assert store.verify(level="full").ok
    assert not [p for p in (samba.share_dir / "dcp").rglob("*") if ".commitstore.tmp." in p.name]
    _assert_same(_load_one_rank(store, "ck/step_3"), torch.load(ref, weights_only=False))


def _leftovers(target: str, root: Path | None, moto: MotoServer | None) -> list[str]:
    """What of step 2 is on the storage, seen without commitstore."""
    if root is not None:
        found = [str(p.relative_to(root)) for p in root.rglob("*")]
        return [p for p in found if "step_2" in p]
    assert moto is not None
    listing = moto.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{target}/")
    return [o["Key"] for o in listing.get("Contents", []) if "step_2" in o["Key"]]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_sigkill_of_a_rank_mid_save_publishes_nothing(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    moto: MotoServer | None = request.getfixturevalue("moto") if where == "s3" else None
    root = None if moto else tmp_path / "store"
    url = moto.url("crash") if moto else str(root)
    opts = moto.options() if moto else {}
    codes = run_group(tmp_path / "g", 2, _crash_mid_save, (url, opts), crash_ok=True)
    assert codes[1] == -signal.SIGKILL
    store = open_store(url, **opts)
    assert [r.name for r in store.list()] == ["ck/step_1"]
    latest = store.latest()
    assert latest is not None and latest.name == "ck/step_1"
    left = _leftovers("crash", root, moto)
    assert any("__0_0.distcp" in p for p in left), left  # rank 0's shard was written
    report = store.gc(min_age=0)
    assert report.removed
    assert _leftovers("crash", root, moto) == []
    assert store.verify(level="full").ok and [r.name for r in store.list()] == ["ck/step_1"]


def test_async_save_then_coordinator_killed_before_finish(tmp_path: Path) -> None:
    root = tmp_path / "store"
    codes = run_group(tmp_path / "g", 2, _async_then_crash, (str(root), {}), crash_ok=True)
    assert codes[0] == -signal.SIGKILL
    store = open_store(str(root))
    assert [r.name for r in store.list()] == ["ck/step_1"]
    assert store.latest() is not None and store.latest().name == "ck/step_1"  # type: ignore[union-attr]
    staged = [p.name for p in root.rglob("*.distcp") if "step_2" in str(p)]
    assert sorted(staged) == ["__0_0.distcp", "__1_0.distcp"]  # both shards, no commit
    assert store.gc(min_age=0).removed
    assert _leftovers("", root, None) == []


def test_single_process_overwrite_and_bad_arguments(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    model, opt = plain_model()
    rec = cdcp.save(_state(model, opt), store, "ck/step_1", metadata={"loss": 0.5})
    assert rec is not None and rec.metadata == {"loss": 0.5}
    with pytest.raises(AlreadyExistsError):
        cdcp.save(_state(model, opt), store, "ck/step_1")
    model2, opt2 = plain_model(seed=7)
    again = cdcp.save(_state(model2, opt2), store, "ck/step_1", overwrite=True)
    assert again is not None and again.digest != rec.digest
    _assert_same(_load_one_rank(store, "ck/step_1"), _state(model2, opt2))
    with pytest.raises(InvalidNameError):
        cdcp.StorageWriter(store, "../x")
    with pytest.raises(ConfigurationError):
        cdcp.StorageWriter("not a store", "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        cdcp.StorageWriter(store, "x", metadata={"bad": object()})
    store.put_bytes("plain.bin", b"x")
    with pytest.raises(ConfigurationError, match="not a DCP folder"):
        cdcp.load(_state(model, opt), store, "plain.bin")
