"""``commitstore.hf`` with a real ``transformers.Trainer`` on a tiny GPT-2 built from a config (no
download): every kept ``checkpoint-N`` is a committed folder that verifies, ``save_total_limit``
goes through prune, the folder is moved into the store (same inode, no copy), and training
resumes from the newest verified checkpoint after the newest one is damaged. The callback never
waits on the training thread: with the store's worker thread held at a gate, every ``on_save``
returns with nothing committed, the folder already out of the Trainer's reach; commits, mirror
copies and the ``save_total_limit`` prune land afterwards; a failed background commit puts the
folder back and is raised by ``on_train_end``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import commitstore.torch as cs_torch
from commitstore import (
    AlreadyExistsError,
    ConfigurationError,
    FolderWrite,
    NameConflictError,
    open_store,
)
from commitstore.hf import CommitStoreCallback, commit_folder, latest_checkpoint
from commitstore.testing import LocalBackdoor

from .helpers.gate import Gate


class _Data(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = torch.tensor([(i * 7 + k) % 50 for k in range(8)])
        return {"input_ids": ids, "labels": ids}


class _Seen(transformers.TrainerCallback):  # type: ignore[misc]
    """Placed before the store's callback: what the Trainer wrote, and where training began."""

    def __init__(self) -> None:
        self.inodes: dict[int, int] = {}
        self.first_step: int | None = None

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.inodes[state.global_step] = os.stat(folder / "model.safetensors").st_ino

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.first_step is None:
            self.first_step = state.global_step


def _trainer(out: Path, store: Any, max_steps: int, seen: _Seen, *after: Any, **kw: Any) -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        save_steps=2,
        save_total_limit=2,
        per_device_train_batch_size=4,
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=_Data(),
        callbacks=[seen, CommitStoreCallback(store, **kw), *after],
    )


def test_trainer_checkpoints_commit_prune_and_resume(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    store = open_store(str(root))
    seen = _Seen()
    trainer = _trainer(out, store, 6, seen)
    assert trainer.args.save_total_limit == 2  # building the Trainer changed no argument
    trainer.train()
    names = [r.name for r in store.list()]
    assert names == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2 through prune
    for rec in store.list():
        assert rec.kind == "dir" and rec.step == int(rec.name.split("-")[1])
        assert "model.safetensors" in [f.path for f in rec.files]
        assert store.verify(rec.name, level="full").ok
        # moved, not copied: the Trainer's own file is the committed one
        assert os.stat(root / rec.name / "model.safetensors").st_ino == seen.inodes[rec.step]
    assert not list(out.glob("checkpoint-*"))  # nothing left behind in output_dir
    assert not [p for p in root.iterdir() if p.name.startswith(".commitstore.tmp.")]
    newest = latest_checkpoint(store)
    assert newest == root / "checkpoint-6"

    weights = root / "checkpoint-6" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    resume = latest_checkpoint(store)
    assert resume == root / "checkpoint-4"

    seen2 = _Seen()
    trainer2 = _trainer(out, store, 8, seen2)
    trainer2.train(resume_from_checkpoint=str(resume))
    assert seen2.first_step == 4 and trainer2.state.global_step == 8
    assert [r.name for r in store.list()] == ["checkpoint-6", "checkpoint-8"]
    assert store.verify(level="full").ok  # the damaged checkpoint-6 was saved again, whole


def test_output_dir_inside_the_store_commits_in_place(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = open_store(str(root))
    seen = _Seen()
    _trainer(root, store, 4, seen).train()
    assert [r.name for r in store.list()] == ["checkpoint-2", "checkpoint-4"]
    assert store.verify(level="full").ok


def test_commit_folder_copies_across_stores_and_checks_arguments(tmp_path: Path, moto: Any) -> None:
    src = tmp_path / "checkpoint-3"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"\0" * 100)
    s3 = open_store(moto.url("hf"), **moto.options())
    rec = commit_folder(s3, src, "checkpoint-3", step=3)
    assert [f.path for f in rec.files] == ["config.json", "sub/w.bin"]
    assert not src.exists()
    assert s3.verify(level="full").ok
    got = latest_checkpoint(s3, local_dir=tmp_path / "fetched")
    assert got == tmp_path / "fetched" / "checkpoint-3"
    assert (got / "sub" / "w.bin").read_bytes() == b"\0" * 100
    with pytest.raises(ConfigurationError):
        latest_checkpoint(s3)
    with pytest.raises(ConfigurationError):
        CommitStoreCallback("nope")  # type: ignore[arg-type]


class _Probe(transformers.TrainerCallback):  # type: ignore[misc]
    """Placed after the store's callback: what is committed and what ``output_dir`` holds when
    ``on_save`` returned; opens ``gate`` at the save of step ``last``."""

    def __init__(self, store: Any, gate: Gate, last: int) -> None:
        self.store, self.gate, self.last = store, gate, last
        self.listed: dict[int, list[str]] = {}
        self.local: dict[int, list[str]] = {}

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        step = state.global_step
        self.listed[step] = [r.name for r in self.store.list()]
        self.local[step] = sorted(p.name for p in Path(args.output_dir).iterdir())
        if step == self.last:
            self.gate.release.set()


def test_on_save_never_waits_for_the_commit_mirrors_or_prune(tmp_path: Path) -> None:
    root, out, mirror = tmp_path / "store", tmp_path / "out", tmp_path / "mirror"
    store = open_store(str(root), mirrors=[str(mirror)], async_inflight=8)
    gate = Gate()
    held = cs_torch.save_async({"g": gate}, store, "held.pt")  # holds the worker thread
    assert gate.entered.wait(60)
    probe = _Probe(store, gate, last=6)
    trainer = _trainer(out, store, 6, _Seen(), probe)
    trainer.train()  # on_train_end waited for every commit
    # every on_save returned with nothing of it committed: the worker was held all along
    assert probe.listed == {2: [], 4: [], 6: []}
    for step, names in probe.local.items():
        assert f"checkpoint-{step}" not in names  # taken out of the Trainer's reach
        assert any(n.startswith(f".commitstore-pending.checkpoint-{step}.") for n in names)
    assert held.result(timeout=60).name == "held.pt"
    assert sorted(r.name for r in store.list()) == ["checkpoint-4", "checkpoint-6", "held.pt"]
    assert store.verify(level="full").ok
    assert not list(out.iterdir())  # nothing left in output_dir
    store.flush()
    copy = open_store(str(mirror))
    assert "checkpoint-6" in [r.name for r in copy.list()]
    assert copy.verify("checkpoint-6", level="full").ok
    store.close()


def test_a_failed_background_commit_puts_the_folder_back_and_is_raised(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    store = open_store(str(root))
    store.put_bytes("checkpoint-2", b"taken")  # the name is committed: overwrite=False fails
    before = store.record("checkpoint-2")
    trainer = _trainer(out, store, 2, _Seen(), overwrite=False)
    with pytest.raises(AlreadyExistsError, match="checkpoint-2"):
        trainer.train()  # raised by on_train_end
    assert store.record("checkpoint-2") == before
    assert (out / "checkpoint-2" / "model.safetensors").is_file()  # back, under its name
    assert not [p for p in out.iterdir() if p.name.startswith(".commitstore-pending.")]
    assert trainer.args.save_total_limit == 2


def test_synchronous_mode_commits_in_on_save(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    store = open_store(str(root))
    probe = _Probe(store, Gate(), last=4)
    _trainer(out, store, 4, _Seen(), probe, asynchronous=False).train()
    assert probe.listed == {2: ["checkpoint-2"], 4: ["checkpoint-2", "checkpoint-4"]}
    with pytest.raises(ConfigurationError):
        CommitStoreCallback(store, asynchronous=1)  # type: ignore[arg-type]


def test_a_folder_set_aside_by_a_killed_run_is_put_back_and_committed(tmp_path: Path) -> None:
    """What a run killed between on_save and its commit leaves: a whole checkpoint folder under
    its hidden name. The next run's callback puts it back and commits it."""
    root, out = tmp_path / "store", tmp_path / "out"
    store = open_store(str(root))
    seen = _Seen()
    _trainer(out, store, 2, seen, asynchronous=False).train()
    assert [r.name for r in store.list()] == ["checkpoint-2"]
    hidden = out / ".commitstore-pending.checkpoint-2.0a1b2c3d"
    shutil.copytree(root / "checkpoint-2", hidden)  # the Trainer's whole folder, set aside
    store.delete("checkpoint-2")  # as if its commit never happened
    files = sorted(p.name for p in hidden.iterdir())
    trainer = _trainer(out, store, 2, _Seen())
    cb = next(c for c in trainer.callback_handler.callbacks if isinstance(c, CommitStoreCallback))
    cb.on_train_begin(trainer.args, trainer.state, trainer.control)
    cb.wait()
    assert not hidden.exists()
    assert [r.name for r in store.list()] == ["checkpoint-2"]
    assert sorted(f.path for f in store.record("checkpoint-2").files) == files
    assert store.verify("checkpoint-2", level="full").ok


def test_commit_folder_never_moves_another_committed_artifact(tmp_path: Path) -> None:
    root = tmp_path / "s"
    door = _committed_store_for_hf(root)
    before = _snapshot(door)
    store = open_store(root)
    with pytest.raises(NameConflictError, match="artifact 'ckpt/step_1'"):
        commit_folder(store, root / "ckpt" / "step_1", "stolen")
    assert _snapshot(door) == before
    assert [r.status for r in store.verify(level="full").results] == ["ok", "ok"]


def _committed_store_for_hf(root: Path) -> LocalBackdoor:
    store = open_store(root)
    with store.stage_dir("ckpt/step_1") as d:
        (d / "model.bin").write_bytes(b"weights" * 1000)
    store.put_bytes("other.pt", b"o")
    return LocalBackdoor(root)


def _snapshot(door: LocalBackdoor) -> dict[str, bytes | None]:
    return {f: door.read(f) for f in door.files()}


def test_commit_folder_in_place_over_a_committed_folder_copies_and_keeps_it(
    tmp_path: Path,
) -> None:
    """The Trainer wrote into a committed folder again (output_dir is the store's root): the
    folder is copied into a new commit, never moved away from its record, and stays."""
    root = tmp_path / "s"
    store = open_store(root)
    with store.stage_dir("checkpoint-2") as d:
        (d / "w.bin").write_bytes(b"old")
    (root / "checkpoint-2" / "w.bin").write_bytes(b"new!")  # the Trainer saves step 2 again
    rec = commit_folder(store, root / "checkpoint-2", "checkpoint-2", step=2, overwrite=True)
    assert rec.size == 4
    assert (root / "checkpoint-2" / "w.bin").read_bytes() == b"new!"
    assert store.verify(level="full").ok


def test_commit_folder_in_place_keeps_the_commit_when_the_rename_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the one rename is not possible (another process holds the staging folder's
    creation lock), the in-place folder is copied into the commit and never removed after it:
    it is the committed folder."""
    root = tmp_path / "s"
    store = open_store(root)
    (root / "checkpoint-4").mkdir(parents=True)
    (root / "checkpoint-4" / "w.bin").write_bytes(b"w" * 10)
    monkeypatch.setattr(FolderWrite, "_move_in", lambda self, src: None)
    rec = commit_folder(store, root / "checkpoint-4", "checkpoint-4", step=4)
    assert rec.size == 10
    assert (root / "checkpoint-4" / "w.bin").read_bytes() == b"w" * 10
    assert store.verify(level="full").ok


def test_output_dir_inside_the_store_must_be_the_folder_of_the_names(tmp_path: Path) -> None:
    """With ``prefix="run1/"`` the Trainer's folders must be ``<root>/run1/checkpoint-N``: an
    output_dir at the root would write into (and set aside) other artifacts' folders."""
    root = tmp_path / "store"
    store = open_store(str(root))
    store.put_bytes("checkpoint-2/keep.bin", b"another run's")
    with pytest.raises(ConfigurationError, match="not the folder of the names"):
        _trainer(root, store, 4, _Seen(), prefix="run1/").train()
    assert store.read_bytes("checkpoint-2/keep.bin") == b"another run's"
    seen = _Seen()
    _trainer(root / "run1", store, 4, seen, prefix="run1/").train()
    assert sorted(r.name for r in store.list()) == [
        "checkpoint-2/keep.bin",
        "run1/checkpoint-2",
        "run1/checkpoint-4",
    ]
    assert store.verify(level="full").ok
