"""commitstore.lightning.CommitStoreCheckpointIO under a real Lightning ``Trainer`` (CPU, a tiny
model, a few steps): ``ModelCheckpoint(save_top_k=2, save_last=True)`` leaves exactly the expected
committed checkpoints, all verifying; a fit SIGKILLed in the middle of a save (a forked child of
this warm process kills itself from inside the write) is resumed by a new
``Trainer(...).fit(ckpt_path="last")`` from a whole checkpoint.

``asynchronous=True``: the same Trainer outcome; the removal of an old checkpoint waits until the
new one landed (a gate blocks the background pickling to look at the state in between) and is
skipped when the new one failed; ``teardown`` waits and raises the failure; a fit SIGKILLed while
the worker thread writes ``last.ckpt`` resumes from a whole step."""

from __future__ import annotations

import os
import signal
import traceback
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from commitstore import (
    CommitStore,
    ConfigurationError,
    InvalidNameError,
    open_store,
)
from commitstore._stagefile import Stage
from commitstore.lightning import CommitStoreCheckpointIO

from .helpers.gate import Gate

torch.set_num_threads(1)


class Tiny(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, _idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StartStep(pl.Callback):  # type: ignore[misc]
    """Records the global step a fit started from."""

    def __init__(self) -> None:
        self.start: int | None = None

    def on_train_start(self, trainer: Any, _module: Any) -> None:
        self.start = trainer.global_step


def _data() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def _trainer(
    store: CommitStore, root: Path, max_steps: int, *extra: Any, asynchronous: bool = False
) -> Any:
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=root / "ckpts",
        save_top_k=2,
        monitor="step",
        mode="max",
        every_n_train_steps=2,
        save_last=True,
    )
    return pl.Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[CommitStoreCheckpointIO(store, asynchronous=asynchronous)],
        callbacks=[ckpt, *extra],
    )


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_trainer_keeps_top_k_and_last_all_committed(tmp_path: Path, asynchronous: bool) -> None:
    store = open_store(tmp_path)
    _trainer(store, tmp_path, 8, asynchronous=asynchronous).fit(Tiny(), _data())
    # fit returned: teardown waited for every background save and deferred removal
    names = [r.name for r in store.list()]
    assert sorted(names) == [
        "ckpts/epoch=1-step=6.ckpt",
        "ckpts/epoch=1-step=8.ckpt",
        "ckpts/last.ckpt",
    ]
    assert store.verify().ok
    last = store.record("ckpts/last.ckpt")
    assert last.alias and last.step == 8 and last.metadata == {"global_step": 8, "epoch": 1}
    assert store.record("ckpts/epoch=1-step=6.ckpt").step == 6
    # No stray file beside them (removed top-k ones went with their records).
    on_disk = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    assert on_disk == ["epoch=1-step=6.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]
    # The alias survives keep_last=1 (newest by step: step 8), which deletes step 6.
    report = store.prune(keep_last=1, min_age=0)
    assert [r.name for r in store.list()] == ["ckpts/epoch=1-step=8.ckpt", "ckpts/last.ckpt"]
    assert report.targets[0].deleted == ("ckpts/epoch=1-step=6.ckpt",)


def test_paths_outside_the_root_are_refused(tmp_path: Path) -> None:
    io = CommitStoreCheckpointIO(open_store(tmp_path / "store"))
    assert io.name_of(str(tmp_path / "store" / "a" / "b.ckpt")) == "a/b.ckpt"
    assert io.name_of(tmp_path / "store" / "x" / ".." / "c.ckpt") == "c.ckpt"
    for bad in (tmp_path / "elsewhere.ckpt", tmp_path / "store", "relative.ckpt", 3):
        with pytest.raises(InvalidNameError):
            io.name_of(bad)
    with pytest.raises(InvalidNameError):
        io.save_checkpoint({"global_step": 1}, tmp_path / "out.ckpt")
    assert not (tmp_path / "out.ckpt").exists()
    # A remote store: paths under its URL (what Lightning is given as dirpath) map to names.
    remote = CommitStoreCheckpointIO(open_store("memory://lightning-paths"))
    assert remote.name_of("memory://lightning-paths/ckpts/last.ckpt") == "ckpts/last.ckpt"
    for bad in ("memory://other/last.ckpt", "memory://lightning-paths/../x.ckpt"):
        with pytest.raises(InvalidNameError):
            remote.name_of(bad)
    remote.save_checkpoint({"global_step": 3}, "memory://lightning-paths/ckpts/last.ckpt")
    rec = remote.store.record("ckpts/last.ckpt")
    assert rec.alias and rec.step == 3
    assert remote.load_checkpoint("memory://lightning-paths/ckpts/last.ckpt") == {"global_step": 3}
    remote.remove_checkpoint("memory://lightning-paths/ckpts/last.ckpt")
    remote.remove_checkpoint("memory://lightning-paths/ckpts/last.ckpt")  # gone: not an error
    assert remote.store.list() == []


def test_fit_killed_mid_save_resumes_from_a_whole_checkpoint(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies by SIGKILL
        try:
            _kill_inside_last_save_at_step(6)
            _trainer(open_store(tmp_path), tmp_path, 8).fit(Tiny(), _data())
        except BaseException:
            (tmp_path / "child-error.txt").write_text(traceback.format_exc())
        finally:
            os._exit(3)  # reached only if the kill did not happen
    _, status = os.waitpid(pid, 0)
    error = tmp_path / "child-error.txt"
    assert not error.exists(), error.read_text()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    # The kill hit the overwrite of last.ckpt at step 6: its step-4 version is still whole.
    assert store.verify().ok
    assert store.record("ckpts/last.ckpt").step == 4
    assert any(p.name.startswith(".commitstore.tmp.") for p in (tmp_path / "ckpts").iterdir())
    started = StartStep()
    trainer = _trainer(store, tmp_path, 8, started)
    trainer.fit(Tiny(), _data(), ckpt_path="last")
    assert started.start == 4 and trainer.global_step == 8
    assert store.verify().ok
    assert store.record("ckpts/last.ckpt").step == 8
    assert "ckpts/epoch=1-step=8.ckpt" in [r.name for r in store.list()]


def _kill_inside_last_save_at_step(step: int) -> None:
    """In this (child) process: SIGKILL once half of last.ckpt's bytes at ``step`` are staged."""
    original = Stage.write
    written: dict[int, int] = {}

    def write(self: Stage, b: Any) -> int:
        n = original(self, b)
        if self.name.endswith("last.ckpt") and _saving_step[0] == step:
            written[id(self)] = written.get(id(self), 0) + n
            if written[id(self)] > 1000:
                os.kill(os.getpid(), signal.SIGKILL)
        return n

    save = CommitStoreCheckpointIO.save_checkpoint

    def save_checkpoint(
        self: CommitStoreCheckpointIO, checkpoint: dict[str, Any], path: Any, **kw: Any
    ) -> None:
        _saving_step[0] = checkpoint["global_step"]
        save(self, checkpoint, path, **kw)

    Stage.write = write  # type: ignore[method-assign]
    CommitStoreCheckpointIO.save_checkpoint = save_checkpoint  # type: ignore[method-assign,assignment]


_saving_step = [-1]


def _ckpt(step: int, **extra: Any) -> dict[str, Any]:
    return {"global_step": step, "epoch": 0, "w": torch.full((1000,), float(step)), **extra}


def test_async_removal_waits_until_the_new_checkpoint_landed(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    io = CommitStoreCheckpointIO(store, asynchronous=True)
    old, new = tmp_path / "ckpts" / "step=2.ckpt", tmp_path / "ckpts" / "step=4.ckpt"
    io.save_checkpoint(_ckpt(2), old)
    io.wait()
    gate = Gate()
    io.save_checkpoint(_ckpt(4, gate=gate), new)  # returns once snapshotted
    assert gate.entered.wait(60)
    assert gate.thread is not None and gate.thread.startswith("commitstore-async")
    io.remove_checkpoint(old)  # what ModelCheckpoint(save_top_k) does right after the save
    # in between: the new one is still being written, so the old one stays, whole
    assert [r.name for r in store.list()] == ["ckpts/step=2.ckpt"]
    assert store.verify().ok and old.exists()
    gate.release.set()
    io.teardown()
    assert [r.name for r in store.list()] == ["ckpts/step=4.ckpt"]
    assert not old.exists()
    assert io.load_checkpoint(new, weights_only=False)["global_step"] == 4
    # nothing pending: a removal runs at once
    io.remove_checkpoint(new)
    assert store.list() == []


def test_async_failed_save_keeps_the_old_checkpoint_and_teardown_raises(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    io = CommitStoreCheckpointIO(store, asynchronous=True)
    old, new = tmp_path / "ckpts" / "step=2.ckpt", tmp_path / "ckpts" / "step=4.ckpt"
    io.save_checkpoint(_ckpt(2), old)
    gate = Gate()
    # the gate holds the worker, then pickling fails on the lambda: the new one never lands
    io.save_checkpoint(_ckpt(4, gate=gate, bad=lambda: 1), new)
    assert gate.entered.wait(60)
    io.remove_checkpoint(old)
    gate.release.set()
    with pytest.raises(ConfigurationError, match=r"step=4\.ckpt"):
        io.teardown()
    assert [r.name for r in store.list()] == ["ckpts/step=2.ckpt"]  # kept: the new one failed
    assert store.verify().ok and not new.exists()
    io.teardown()  # raised once
    # a removal while nothing is pending and no save failed goes through
    io.remove_checkpoint(old)
    assert store.list() == []


def test_async_failure_is_raised_by_the_next_save(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    io = CommitStoreCheckpointIO(store, asynchronous=True)
    io.save_checkpoint(_ckpt(2, bad=lambda: 1), tmp_path / "a.ckpt")
    with pytest.raises(ConfigurationError, match=r"a\.ckpt"):
        for step in range(4, 400, 2):  # the failure is raised by a save once it ended
            io.save_checkpoint(_ckpt(step), tmp_path / f"s{step}.ckpt")
    io.teardown()  # raised once, by the save
    assert "a.ckpt" not in [r.name for r in store.list()]
    with pytest.raises(ConfigurationError):
        CommitStoreCheckpointIO(store, asynchronous="yes")  # type: ignore[arg-type]


def test_async_fit_killed_mid_background_write_resumes_from_a_whole_step(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    where = tmp_path / "killed-on.txt"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies by SIGKILL
        try:
            _kill_inside_third_last_save(where)
            _trainer(open_store(tmp_path), tmp_path, 8, asynchronous=True).fit(Tiny(), _data())
        except BaseException:
            (tmp_path / "child-error.txt").write_text(traceback.format_exc())
        finally:
            os._exit(3)  # reached only if the kill did not happen
    _, status = os.waitpid(pid, 0)
    error = tmp_path / "child-error.txt"
    assert not error.exists(), error.read_text()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    # killed by the worker thread, inside the background write of last.ckpt at step 6
    assert where.read_text().startswith("commitstore-async")
    assert store.verify().ok
    assert store.record("ckpts/last.ckpt").step == 4
    started = StartStep()
    trainer = _trainer(store, tmp_path, 8, started, asynchronous=True)
    trainer.fit(Tiny(), _data(), ckpt_path="last")
    assert started.start == 4 and trainer.global_step == 8
    assert store.verify().ok
    assert store.record("ckpts/last.ckpt").step == 8
    assert "ckpts/epoch=1-step=8.ckpt" in [r.name for r in store.list()]


def _kill_inside_third_last_save(where: Path) -> None:
    """In this (child) process: SIGKILL once 1000 bytes of the third ``last.ckpt`` (step 6) are
    staged; the killing thread's name is written to ``where`` first."""
    import threading

    original = Stage.write
    stages: list[Stage] = []  # held: an id is never reused for another stage

    def write(self: Stage, b: Any) -> int:
        n = original(self, b)
        if self.name.endswith("last.ckpt"):
            if not any(s is self for s in stages):
                stages.append(self)
            if len(stages) == 3 and self.tell() > 1000:
                where.write_text(threading.current_thread().name)
                os.kill(os.getpid(), signal.SIGKILL)
        return n

    Stage.write = write  # type: ignore[method-assign]
