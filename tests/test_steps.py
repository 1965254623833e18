"""Steps and order: explicit steps win, then the frameworks' name patterns, else no step (ordered
by commit time among the stepped ones); aliases (``last.ckpt``) are never pruned and not counted by
``keep_last``; the record format change reads old records and keeps their bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commitstore import ConfigurationError, Retention, open_store
from commitstore.layout import infer_step
from commitstore.records import RecordFormatError, decode_record, encode_record

STEPS = {
    "step_0810.pt": 810,
    "step=300.ckpt": 300,
    "epoch=2-step=300.ckpt": 300,
    "epoch=2-step=300-v1.ckpt": 300,
    "model-step300-bf16.pt": 300,
    "run/step300/model.pt": 300,
    "checkpoint-500": 500,
    "checkpoint-500/model.safetensors": 500,
    "global_step42/mp_rank_00_model_states.pt": 42,
    "ckpt/global_step=7.pt": 7,
    "Step_9.bin": 9,
    "last.ckpt": None,
    "last-v1.ckpt": None,
    "model-bf16.pt": None,
    "ckpt_100.pt": None,
    "mystep3.pt": None,
    "steps100.pt": None,
    "final.pt": None,
    "step_" + "9" * 70: None,
    f"step_{2**63}": None,
    f"step_{2**63 - 1}": 2**63 - 1,
}


@pytest.mark.parametrize(("name", "step"), sorted(STEPS.items()))
def test_step_from_the_frameworks_patterns(name: str, step: int | None) -> None:
    assert infer_step(name) == step


def test_explicit_step_wins_and_is_recorded(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert store.put_bytes("model-step300-bf16.pt", b"a").step == 300
    assert store.put_bytes("epoch=1-step=20.ckpt", b"b", step=7).step == 7
    assert store.put_bytes("last.ckpt", b"c", step=0).step == 0
    assert store.put_bytes("final.pt", b"d").step is None
    with pytest.raises(ConfigurationError):
        store.put_bytes("x.pt", b"e", step=-1)


def test_unstepped_artifacts_order_by_commit_time(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for name in ("config.json", "step_1.pt", "step_2.pt", "notes.txt", "step_3.pt", "final.pt"):
        store.put_bytes(name, name.encode())
    order = [r.name for r in store.list()]
    assert order == ["config.json", "step_1.pt", "step_2.pt", "notes.txt", "step_3.pt", "final.pt"]
    latest = store.latest()
    assert latest is not None and latest.name == "final.pt"


def test_alias_is_never_pruned_and_not_counted(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for step in range(1, 6):
        store.put_bytes(f"step_{step}.pt", b"s" * step)
        store.put_bytes("last.ckpt", b"l" * step, overwrite=True, alias=True)
    assert store.record("last.ckpt").alias
    assert not store.record("step_5.pt").alias
    report = store.prune(keep_last=2, min_age=0)
    assert sorted(r.name for r in store.list()) == ["last.ckpt", "step_4.pt", "step_5.pt"]
    assert sorted(report.targets[0].deleted) == ["step_1.pt", "step_2.pt", "step_3.pt"]
    # keep_last=0: the newest verifying non-alias artifact is still guarded, the alias kept.
    store.prune(keep_last=0, min_age=0)
    assert sorted(r.name for r in store.list()) == ["last.ckpt", "step_5.pt"]
    assert store.read_bytes("last.ckpt") == b"lllll"


def test_alias_with_automatic_retention_and_mirrors(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    store = open_store(
        tmp_path / "p",
        mirrors=[str(mirror)],
        mirror_mode="sync",
        retention=Retention(keep_last=1, min_age=0),
    )
    store.put_bytes("last.ckpt", b"first", alias=True)
    for step in (1, 2, 3):
        store.put_bytes(f"step_{step}.pt", b"x")
    for s in (store, open_store(mirror)):
        assert sorted(r.name for r in s.list()) == ["last.ckpt", "step_3.pt"]
    raw = (tmp_path / "p" / ".commitstore/records/.commitstore.rec.last.ckpt.json").read_bytes()
    assert raw == (mirror / ".commitstore/records/.commitstore.rec.last.ckpt.json").read_bytes()
    assert json.loads(raw)["alias"] is True
    store.close()


def test_alias_option_is_checked_before_any_io(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigurationError):
            store.put_bytes("last.ckpt", b"x", alias=bad)
    assert not (tmp_path / "s").exists()  # no I/O: not even the store's root was made
    with pytest.warns(UserWarning, match="no store at"):
        assert store.list() == []


def test_records_without_alias_keep_their_bytes(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    rec = store.put_bytes("step_1.pt", b"x")
    raw = (tmp_path / ".commitstore/records/.commitstore.rec.step_1.pt.json").read_bytes()
    doc = json.loads(raw)
    assert "alias" not in doc  # the format of records written before aliases existed
    assert decode_record(raw) == rec and encode_record(rec) == raw
    aliased = decode_record(json.dumps({**doc, "alias": True}).encode())
    assert aliased.alias and decode_record(encode_record(aliased)) == aliased
    assert decode_record(json.dumps({**doc, "alias": False}).encode()).alias is False
    bads: list[object] = ["yes", 1, None, []]
    for bad in bads:
        with pytest.raises(RecordFormatError):
            decode_record(json.dumps({**doc, "alias": bad}).encode())
