"""``adopt`` of folders written before commitstore (a Hugging Face ``checkpoint-N``): one folder
record after every file passed its structural check; a truncated or unparseable file rejects the
folder with its path; ``adopt()`` groups ``checkpoint-N`` folders; a folder commit still being
written (object store) is never adopted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch as safetensors_torch
import torch

from commitstore import open_store


def _hf_folder(path: Path) -> None:
    path.mkdir(parents=True)
    safetensors_torch.save_file(
        {"w": torch.arange(64, dtype=torch.float32)}, path / "model.safetensors"
    )
    torch.save({"step": 1, "m": torch.ones(8)}, path / "optimizer.pt")
    (path / "config.json").write_text(json.dumps({"n_layer": 1}))
    (path / "sub").mkdir()
    (path / "sub" / "trainer_state.json").write_text("{}")


def test_adopt_a_checkpoint_folder(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _hf_folder(root / "checkpoint-10")
    store = open_store(str(root))
    report = store.adopt("checkpoint-10")
    assert report.adopted == ("checkpoint-10",) and not report.rejected
    rec = store.record("checkpoint-10")
    assert rec.kind == "dir" and rec.step == 10 and rec.metadata == {"adopted": True}
    assert [f.path for f in rec.files] == [
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "sub/trainer_state.json",
    ]
    assert store.verify(level="full").ok
    assert store.latest() == rec
    assert store.adopt("checkpoint-10").rejected == {"checkpoint-10": "already has a record"}


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("model.safetensors", "model.safetensors: tensor 'w' data runs past the end"),
        ("optimizer.pt", "optimizer.pt: no end-of-central-directory record"),
        ("config.json", "config.json: not valid JSON"),
    ],
)
def test_a_truncated_file_rejects_the_folder(tmp_path: Path, damage: str, reason: str) -> None:
    root = tmp_path / "store"
    _hf_folder(root / "checkpoint-20")
    f = root / "checkpoint-20" / damage
    f.write_bytes(f.read_bytes()[:-7])
    store = open_store(str(root))
    report = store.adopt("checkpoint-20")
    assert report.adopted == ()
    assert report.rejected["checkpoint-20"].startswith(reason)
    assert store.list() == []


def test_adopt_all_groups_checkpoint_folders_and_unknown_formats_need_trust(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    _hf_folder(root / "run" / "checkpoint-5")
    _hf_folder(root / "run" / "checkpoint-6")
    (root / "run" / "checkpoint-6" / "merges.txt").write_text("a b\n")
    torch.save({"x": 1}, root / "single.pt")
    store = open_store(str(root))
    report = store.adopt()
    assert sorted(report.adopted) == ["run/checkpoint-5", "single.pt"]
    assert report.rejected == {
        "run/checkpoint-6": "merges.txt: unknown format (adopt with trust=True)"
    }
    assert store.adopt("run/checkpoint-6", trust=True).adopted == ("run/checkpoint-6",)
    names = [r.name for r in store.list()]  # the unstepped single.pt sits by its commit time
    assert sorted(names) == ["run/checkpoint-5", "run/checkpoint-6", "single.pt"]
    assert names.index("run/checkpoint-5") < names.index("run/checkpoint-6")
    assert store.verify(level="full").ok


def test_a_folder_commit_in_progress_is_not_adopted(moto: Any) -> None:
    store = open_store(moto.url("adopt-busy"), **moto.options())
    folder = store.begin_folder("checkpoint-7")
    first = folder.write_bytes("config.json", b"{}")
    report = store.adopt()
    assert report.adopted == ()
    assert report.rejected == {"checkpoint-7": "a folder commit is writing it (not adopted)"}
    second = store.join_folder(folder.token).write_bytes("b.json", b"[]")
    assert store.list() == []  # on an object store the files are in place: the record commits
    rec = folder.commit([first, second])
    assert [f.path for f in rec.files] == ["b.json", "config.json"]
    assert store.verify(level="full").ok
    assert store.adopt() == type(report)((), {})  # the marker went with the commit
