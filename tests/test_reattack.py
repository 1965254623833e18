"""Findings of the second attack on the documented guarantees, each provoked for real:

- ``adopt`` over a name whose interrupted commit left its own pending record (the data matches
  it): that record, alias flag and metadata included, becomes the record; adopt never makes one
  up (a made-up record lost the alias, and prune then deleted it);
- a prune plan with a folder artifact and an artifact inside its path (possible on object stores,
  where the checks run when staging starts): prune deletes what it may and reports the refusal,
  instead of raising and deleting nothing (automatic retention stopped for good);
- ``adopt`` with a symlink among the unrecorded names rejects the link and adopts the rest;
- a create-only commit over an interrupted commit's data first makes that commit's own pending
  record the record, then refuses ("already committed"), never advising an overwrite.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch

from commitstore import AlreadyExistsError, open_store
from commitstore.digest import digest_bytes, manifest_digest
from commitstore.layout import intent_parts, record_parts, validate_name
from commitstore.records import FileRecord, Record, encode_record


def _torch_bytes(value: float) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.full((4,), value)}, buf)
    return buf.getvalue()


def _interrupt_after_data(root: Path, name: str) -> None:
    """The state a commit stopped between its data and its record leaves (the crash table):
    the data under the name, its record only as the pending record."""
    rec = root.joinpath(*record_parts(validate_name(name)))
    rec.rename(root.joinpath(*intent_parts(validate_name(name))))


def _age(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(dirpath, f), (1e9, 1e9))


def test_adopt_restores_an_interrupted_commits_own_record(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    data = _torch_bytes(1.0)
    store.put_bytes("last.ckpt", data, alias=True, metadata={"epoch": 3})
    _interrupt_after_data(root, "last.ckpt")
    report = store.adopt()
    assert report.adopted == ()
    assert "interrupted commit" in report.rejected["last.ckpt"]
    rec = store.record("last.ckpt")
    assert rec.alias and rec.metadata == {"epoch": 3} and rec.digest == digest_bytes(data)
    for step in (4, 5):
        store.put_bytes(f"step_{step}.pt", _torch_bytes(step))
    _age(root)
    store.prune(keep_last=1)
    assert "last.ckpt" in [r.name for r in store.list()]  # an alias is never pruned


def test_prune_reports_a_refused_folder_delete_and_deletes_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("step_1.pt", b"one", step=1)
    store.put_bytes("eval/extra.pt", b"kept by keep", step=2)
    # a folder record over "eval" that claims eval/a.bin (as a second writer on an object store
    # can leave: both committed, the checks having run when each started)
    (root / "eval" / "a.bin").write_bytes(b"a")
    entry = ("a.bin", 1, digest_bytes(b"a"))
    folder = Record(
        name="eval",
        step=1,
        size=1,
        digest=manifest_digest([entry]),
        kind="dir",
        files=(FileRecord(*entry),),
    )
    raw = encode_record(folder)
    root.joinpath(*record_parts(("eval",))).write_bytes(raw)
    _age(root)
    report = store.prune(keep_last=1, keep=["eval/extra.pt"], min_age=0)
    target = report.targets[0]
    assert "step_1.pt" in target.deleted
    assert "eval" in target.skipped and "refused" in target.skipped["eval"]
    assert (root / "eval" / "extra.pt").read_bytes() == b"kept by keep"


def test_adopt_rejects_a_symlink_and_adopts_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("ok.pt", _torch_bytes(0.0))
    (root / "aa.pt").write_bytes(_torch_bytes(1.0))
    (root / "mm_link.pt").symlink_to("/etc/hostname")
    (root / "zz.pt").write_bytes(_torch_bytes(2.0))
    report = store.adopt()
    assert set(report.adopted) == {"aa.pt", "zz.pt"}
    assert "mm_link.pt" in report.rejected


def test_a_create_over_an_interrupted_commit_restores_its_record_first(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    data = _torch_bytes(7.0)
    store.put_bytes("step_7.pt", data, metadata={"loss": 0.5})
    _interrupt_after_data(root, "step_7.pt")
    with pytest.raises(AlreadyExistsError, match="already committed"):
        store.put_bytes("step_7.pt", b"another version")
    rec = store.record("step_7.pt")  # the interrupted commit's own record, made the record
    assert rec.metadata == {"loss": 0.5} and rec.digest == digest_bytes(data)
    assert (root / "step_7.pt").read_bytes() == data
