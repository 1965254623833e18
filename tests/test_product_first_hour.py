"""What a new user trips over in the first hour: a mistyped store URL taken for an empty store,
``mirror_status()`` raising when a mirror is down, the framework integrations' surprises
(a caller's ``TrainingArguments`` changed, a checkpoint folder outside the store found only at
the first save, a bare ``ModuleNotFoundError`` for a missing extra), and packaging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import commitstore
from commitstore import BackendUnavailableError, ConfigurationError, NotFoundError, open_store

from .helpers.s3servers import BUCKET, MotoServer
from .helpers.samba import PASSWORD, SambaServer, free_port
from .helpers.webdavserver import WebdavServer

SRC = Path(commitstore.__file__).resolve().parents[1]
"""The sources under test (a child process imports the same ones)."""
CLI = Path(sys.executable).with_name("commitstore")


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed ``commitstore`` entry point, in a process of its own (importing the
    sources under test)."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), full.get("PYTHONPATH")]))
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, env=full, timeout=120, check=False
    )


# -- 1. a typo is not an empty store ---------------------------------------------------------
def test_opening_and_reading_a_missing_local_store_create_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "chekpoints" / "run1"
    store = open_store(typo)
    assert not (tmp_path / "chekpoints").exists()  # opening created nothing
    for read in (store.list, store.latest, store.verify):
        with pytest.warns(UserWarning, match="no store at .*does not exist"):
            read()
    with pytest.warns(UserWarning, match="does not exist"):
        assert store.verify("step_1.pt").results[0].status == "missing"
    with pytest.raises(NotFoundError):
        store.read_bytes("step_1.pt")
    store.prune(keep_last=1, min_age=0)
    store.gc(min_age=0)
    store.describe()
    assert _tree(tmp_path) == []  # no read created anything


def test_create_false_raises_on_a_missing_store_and_the_first_write_creates_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "a" / "b"
    with pytest.raises(NotFoundError, match="no store at"):
        open_store(root, create=False)
    with pytest.raises(ConfigurationError):
        open_store(root, create="no")  # type: ignore[arg-type]
    assert not (tmp_path / "a").exists()
    store = open_store(root)
    store.put_bytes("step_1.pt", b"weights")
    assert open_store(root, create=False).read_bytes("step_1.pt") == b"weights"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an existing store, even an empty one, warns nothing
        assert [r.name for r in store.list()] == ["step_1.pt"]
        store.delete("step_1.pt")
        assert store.list() == []
        assert store.latest() is None


def test_s3_missing_store_warns_creates_nothing_and_create_false_raises(
    moto: MotoServer,
) -> None:
    client = moto.client()
    opts = moto.options()
    store = open_store(moto.url("typo-run"), **opts)
    for read in (store.list, store.latest, store.verify):
        with pytest.warns(UserWarning, match="no store at s3://"):
            read()
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="typo-run")
    assert listed.get("KeyCount", 0) == 0  # nothing was created by opening or reading
    with pytest.raises(NotFoundError):
        open_store(moto.url("typo-run"), create=False, **opts)
    with pytest.raises(NotFoundError):
        open_store("s3://no-such-bucket-here/run", create=False, **opts)
    store.put_bytes("step_1.pt", b"first write")
    again = open_store(moto.url("typo-run"), create=False, **opts)
    assert again.read_bytes("step_1.pt") == b"first write"


@pytest.fixture(scope="module")
def samba(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SambaServer]:
    server = SambaServer(tmp_path_factory.mktemp("first-hour-samba"))
    try:
        yield server
    finally:
        server.stop()


def test_smb_missing_store_creates_nothing_until_the_first_write(samba: SambaServer) -> None:
    url = samba.url("typo/run1")
    store = open_store(url, password=PASSWORD)  # connects (and authenticates) now
    assert not (samba.share_dir / "typo").exists()
    with pytest.warns(UserWarning, match="no store at smb://"):
        assert store.list() == []
    with pytest.warns(UserWarning, match="no store at smb://"):
        assert store.latest() is None
    store.gc(min_age=0)
    store.prune(keep_last=1, min_age=0)
    assert not (samba.share_dir / "typo").exists()
    with pytest.raises(NotFoundError):
        open_store(url, create=False, password=PASSWORD)
    store.put_bytes("step_1.pt", b"over smb")
    assert (samba.share_dir / "typo" / "run1" / "step_1.pt").read_bytes() == b"over smb"
    again = open_store(url, create=False, password=PASSWORD)
    assert again.read_bytes("step_1.pt") == b"over smb"
    with pytest.raises(BackendUnavailableError):
        open_store(samba.url("typo/run1"), password="not-the-password")


@pytest.fixture(scope="module")
def dav(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebdavServer]:
    server = WebdavServer(tmp_path_factory.mktemp("first-hour-webdav"))
    try:
        yield server
    finally:
        server.stop()


def test_webdav_and_generic_fsspec_stores_create_nothing_until_the_first_write(
    dav: WebdavServer, tmp_path: Path
) -> None:
    cases: list[tuple[str, dict[str, Any], Path]] = [
        (dav.url("typo/run1"), dict(dav.options()), dav.root / "typo"),
        (f"file://{tmp_path}/typo/run1", {"strategy": "fsspec"}, tmp_path / "typo"),
    ]
    for url, options, folder in cases:
        store = open_store(url, **options)
        with pytest.warns(UserWarning, match="no store at"):
            assert store.list() == []
        assert not folder.exists(), url
        with pytest.raises(NotFoundError):
            open_store(url, create=False, **options)
        store.put_bytes("step_1.pt", b"first write")
        assert (folder / "run1" / "step_1.pt").read_bytes() == b"first write"
        assert open_store(url, create=False, **options).read_bytes("step_1.pt") == b"first write"


def test_cli_info_on_a_missing_store_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    done = _run_cli("info", str(typo), "--json")
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["exists"] is False
    (line,) = done.stderr.splitlines()  # under --json, every stderr line is one JSON object
    error = json.loads(line)["error"]
    assert "no store at" in error["message"]
    assert error["exit_code"] == 2
    assert not typo.exists()
    ls = _run_cli("ls", str(typo))
    assert ls.returncode == 2
    assert not typo.exists()
    (tmp_path / "w.pt").write_bytes(b"w")
    assert _run_cli("put", str(tmp_path / "w.pt"), str(typo)).returncode == 0
    info = _run_cli("info", str(typo), "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["exists"] is True


# -- 3. mirror_status() when a mirror is down ------------------------------------------------
def test_mirror_status_reports_a_down_mirror_instead_of_raising(tmp_path: Path) -> None:
    down_url = f"s3://{BUCKET}/mirror"
    # One attempt per S3 request (the store's retries), so that a refused endpoint fails at once.
    down = open_store(
        down_url, endpoint_url=f"http://127.0.0.1:{free_port()}", key="k", secret="s", retries=1
    )
    up = open_store(tmp_path / "up")
    data = b"x" * 1234
    with open_store(tmp_path / "primary", mirrors=[down, up]) as store:
        store.put_bytes("step_1.pt", data)  # best effort: the commit stands
        store.flush()
        states = store.mirror_status()
    first, second = states
    assert first.url == down_url
    assert first.reachable is False
    assert first.last_error is not None
    assert "BackendUnavailableError" in first.last_error
    assert first.owed == 1
    assert first.owed_bytes == len(data)
    assert first.oldest_owed_age is not None
    assert first.oldest_owed_age >= 0
    assert "step_1.pt" in first.failed
    assert second.reachable is True
    assert (second.owed, second.owed_bytes, second.oldest_owed_age) == (0, 0, None)
    assert second.missing == ()


def test_mirror_status_counts_what_a_reachable_mirror_lacks(tmp_path: Path) -> None:
    primary = open_store(tmp_path / "p")
    primary.put_bytes("step_1.pt", b"a" * 10)
    primary.put_bytes("step_2.pt", b"b" * 20)
    with open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")]) as store:
        store.put_bytes("step_3.pt", b"c" * 30)
        store.flush()
        (state,) = store.mirror_status()
    assert state.reachable
    assert state.missing == ("step_1.pt", "step_2.pt")
    assert (state.owed, state.owed_bytes) == (2, 30)
    assert state.oldest_owed_age is not None
    record = open_store(tmp_path / "p").record("step_1.pt")
    assert state.oldest_owed_age <= _age(record.created) + 1e-6


def _age(created: Any) -> float:
    from datetime import datetime, timezone

    return float((datetime.now(timezone.utc) - created).total_seconds())


# -- 6. frameworks ---------------------------------------------------------------------------
def _tiny_hf_args(out: Path, limit: int) -> Any:
    import transformers

    return transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=2,
        save_steps=1,
        save_total_limit=limit,
        per_device_train_batch_size=4,
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def _tiny_hf_trainer(args: Any, callbacks: list[Any]) -> Any:
    import torch
    import transformers

    class Data(torch.utils.data.Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.tensor([(i + k) % 50 for k in range(8)])
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    return transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=Data(),
        callbacks=callbacks,
    )


def test_hf_callback_leaves_the_callers_save_total_limit_alone(tmp_path: Path) -> None:
    from commitstore.hf import CommitStoreCallback, latest_checkpoint

    store = open_store(tmp_path / "store")
    assert latest_checkpoint(store) is None  # a first run: resume_from_checkpoint=None
    args = _tiny_hf_args(tmp_path / "out", limit=1)
    first = _tiny_hf_trainer(args, [CommitStoreCallback(store)])
    assert args.save_total_limit == 1  # building the Trainer changed nothing of the caller's
    first.train(resume_from_checkpoint=latest_checkpoint(store))
    assert args.save_total_limit == 1  # and training gave it back
    assert [r.name for r in store.list()] == ["checkpoint-2"]  # the limit, through prune
    # A second Trainer built from the same arguments, without the callback, rotates as asked.
    second = _tiny_hf_trainer(args, [])
    assert second.args.save_total_limit == 1
    second.train()
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-2"]
    # output_dir is the store's root: the Trainer's rotation is off while it trains (it would
    # delete committed folders), and the caller's value is back afterwards.
    inside = open_store(tmp_path / "inside")
    in_place = _tiny_hf_args(tmp_path / "inside", limit=1)
    _tiny_hf_trainer(in_place, [CommitStoreCallback(inside)]).train()
    assert in_place.save_total_limit == 1
    assert [r.name for r in inside.list()] == ["checkpoint-2"]
    assert inside.verify(level="full").ok


def test_lightning_checkpoint_folder_outside_the_store_fails_before_training(
    tmp_path: Path,
) -> None:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from commitstore import InvalidNameError
    from commitstore.lightning import CommitStoreCheckpointIO

    steps: list[int] = []

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, idx: int) -> Any:
            steps.append(idx)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(8, 4)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    store = open_store(tmp_path / "store")
    io = CommitStoreCheckpointIO(store)
    for dirpath, fails in ((tmp_path / "elsewhere", True), (tmp_path / "store" / "ckpts", False)):
        trainer = pl.Trainer(
            default_root_dir=tmp_path,
            max_steps=2,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            plugins=[io],
            callbacks=[io.setup_check(), pl.callbacks.ModelCheckpoint(dirpath=dirpath)],
        )
        if fails:
            with pytest.raises(InvalidNameError, match="not under the store's root"):
                trainer.fit(Tiny(), data)
            assert steps == []  # refused before the first training step
            assert not dirpath.exists()
        else:
            trainer.fit(Tiny(), data)
            assert steps
            assert [r.name for r in store.list()] == ["ckpts/epoch=0-step=2.ckpt"]


@pytest.mark.parametrize(
    ("module", "extra", "blocked"),
    [
        ("torch", "torch", "torch"),
        ("lightning", "lightning", "lightning"),
        ("hf", "hf", "transformers"),
        ("hf", "hf", "accelerate"),
    ],
)
def test_an_integration_without_its_extra_names_the_pip_line(
    module: str, extra: str, blocked: str
) -> None:
    """The extra's library is made unimportable in a child (``sys.modules[name] = None`` is
    what Python does for a module that cannot be imported)."""
    code = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None\n"
        "from commitstore.errors import ConfigurationError\n"
        "try:\n"
        f"    import commitstore.{module}\n"
        "except ImportError as exc:\n"
        "    assert isinstance(exc, ConfigurationError), type(exc)\n"
        "    print(exc)\n"
        "else:\n"
        "    sys.exit('imported')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"pip install 'commitstore[{extra}]'" in done.stdout
    assert blocked in done.stdout


def test_cli_read_commands_on_a_missing_s3_store_exit_2(moto: MotoServer) -> None:
    env = moto.env()
    url = moto.url("cli-typo")
    for args in (("ls", url), ("verify", url), ("latest", url), ("info", url)):
        done = _run_cli(*args, env=env)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "no store at s3://" in done.stderr
    listed = moto.client().list_objects_v2(Bucket=BUCKET, Prefix="cli-typo")
    assert listed.get("KeyCount", 0) == 0


def test_a_write_to_a_bucket_that_does_not_exist_says_so(moto: MotoServer) -> None:
    """A mistyped bucket: the first write is refused with an error that names the bucket (it
    named a record that "does not exist"), and nothing is created."""
    store = open_store("s3://no-such-bucket-here/run", **moto.options())
    with pytest.raises(NotFoundError, match="bucket does not exist"):
        store.put_bytes("step_1.pt", b"weights")
    buckets = [b["Name"] for b in moto.client().list_buckets()["Buckets"]]
    assert "no-such-bucket-here" not in buckets
