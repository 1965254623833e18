"""``commitstore.dcp`` with real ``torch.distributed`` gloo groups on CPU (2 and 4 processes,
forked by the test), FSDP2-sharded model and optimizer state, on a local store, on Samba and on S3
(moto): one folder record per save, resharded loads, SIGKILL of a rank mid-save and of the
coordinator before ``finish`` of an ``async_save``, flipped bytes in a shard. ``dcp.async_save``
under both ``AsyncCheckpointerType.THREAD`` and ``PROCESS`` (the writer pickled into torch's
checkpoint process) with torch's ``DefaultStager`` (pinned memory where CUDA is there), 2 ranks on
a local store, 4 on S3 (THREAD) and local (PROCESS), 2 on S3 (PROCESS: the S3 store opened again
there from its URL and options); a rank killed from its background writer
thread leaves the previous step as ``latest()``."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

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


def _stager(kind: str) -> DefaultStager:
    """torch's staging: host copies made on the caller's thread before the background save;
    pinned (and copied without blocking) where CUDA is there; shared memory for PROCESS."""
    cuda = torch.cuda.is_available()
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=kind == "PROCESS",
            use_async_staging=cuda,
            use_non_blocking_copy=cuda,
        )
    )


def _async_save(rank: int, world: int, job: tuple[str, dict[str, Any], str, str]) -> None:
    url, opts, kind, ref = job
    model, opt = sharded_model(world)
    store = open_store(url, **opts)
    stager = _stager(kind)
    # the background save's collectives get a group of their own (torch's advice for THREAD:
    # the training thread's collectives go on meanwhile)
    group = dist.new_group(backend="gloo")
    try:
        for step in (1, 2):
            if step == 2:
                full = _state(model, opt, options=FULL)  # a collective: before the save
                if rank == 0:
                    torch.save(full, ref)
            got = dcp.async_save(
                _state(model, opt),
                storage_writer=cdcp.StorageWriter(store, f"ck/step_{step}", step=step),
                async_checkpointer_type=AsyncCheckpointerType[kind],
                async_stager=stager,
                process_group=group,
            )
            upload = getattr(got, "upload_completion", got)
            # the state is staged: the next optimizer step (in place) must not reach the save
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            upload.result()
    finally:
        stager.close()


class _DieOnBackgroundThread(DefaultSavePlanner):  # type: ignore[misc]
    """Kills its own process (SIGKILL) at the third item it writes, if on a thread other than
    the main one (the async_save writer thread); says which thread in ``where``."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.items, self.where = 0, where

    def resolve_data(self, item: Any) -> Any:
        self.items += 1
        if self.items == 3:
            Path(self.where).write_text(threading.current_thread().name)
            if threading.current_thread() is not threading.main_thread():
                os.kill(os.getpid(), signal.SIGKILL)
        return super().resolve_data(item)


def _async_killed_in_background(rank: int, world: int, job: tuple[str, str]) -> None:
    url, where = job
    model, opt = sharded_model(world)
    store = open_store(url)
    dcp.async_save(
        _state(model, opt), storage_writer=cdcp.StorageWriter(store, "ck/step_1")
    ).result()
    planner = _DieOnBackgroundThread(where) if rank == 1 else DefaultSavePlanner()
    dcp.async_save(
        _state(model, opt),
        storage_writer=cdcp.StorageWriter(store, "ck/step_2"),
        planner=planner,
        async_stager=_stager("THREAD"),
        process_group=dist.new_group(backend="gloo"),
    ).result()


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


@pytest.mark.parametrize(
    ("kind", "world", "where"),
    [
        ("THREAD", 2, "local"),
        ("PROCESS", 2, "local"),
        ("THREAD", 4, "s3"),
        ("PROCESS", 4, "local"),
        ("PROCESS", 2, "s3"),
    ],
)
def test_async_save_thread_and_process_with_staging(
    kind: str, world: int, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    moto: MotoServer | None = request.getfixturevalue("moto") if where == "s3" else None
    url = moto.url(f"async-{kind.lower()}") if moto else str(tmp_path / "store")
    opts = moto.options() if moto else {}
    ref = tmp_path / "ref.pt"
    run_group(tmp_path / "g", world, _async_save, (url, opts, kind, str(ref)))
    store = open_store(url, **opts)
    recs = store.list()
    assert [(r.name, r.step) for r in recs] == [("ck/step_1", 1), ("ck/step_2", 2)]
    assert [f.path for f in recs[1].files] == [".metadata"] + [
        f"__{r}_0.distcp" for r in range(world)
    ]
    assert store.verify(level="full").ok
    # what was staged before the in-place change is what was committed
    _assert_same(_load_one_rank(store, "ck/step_2"), torch.load(ref, weights_only=False))


def test_async_save_refuses_to_send_a_mirrored_store_to_another_process(tmp_path: Path) -> None:
    import pickle

    writer = cdcp.StorageWriter(open_store(str(tmp_path / "a")), "ck/step_1")
    again = pickle.loads(pickle.dumps(writer))
    assert again.store.url == writer.store.url and again.name == "ck/step_1"
    mirrored = open_store(str(tmp_path / "b"), mirrors=[str(tmp_path / "m")])
    with pytest.raises(ConfigurationError, match="mirrors"):
        pickle.dumps(cdcp.StorageWriter(mirrored, "ck/step_1"))
    mirrored.close()


def test_async_save_rank_killed_in_its_background_writer_keeps_the_previous_step(
    tmp_path: Path,
) -> None:
    root, where = tmp_path / "store", tmp_path / "killed-on.txt"
    codes = run_group(
        tmp_path / "g", 2, _async_killed_in_background, (str(root), str(where)), crash_ok=True
    )
    assert codes[1] == -signal.SIGKILL
    assert where.read_text() != threading.main_thread().name  # the background writer thread
    store = open_store(str(root))
    assert [r.name for r in store.list()] == ["ck/step_1"]
    latest = store.latest()
    assert latest is not None and latest.name == "ck/step_1"
    assert store.verify(level="full").ok
    assert store.gc(min_age=0).removed  # the staged shards of step 2
    assert _leftovers("", root, None) == []
