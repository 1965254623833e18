"""A damaged records tree is ``bad_record`` wherever a read says so (a folder of it, or the
records folder itself, replaced by a symlink), and ``put_file`` of a folder is a bad argument."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

import commitstore
from commitstore import open_store


def test_put_file_of_a_folder_is_a_configuration_error_said_once(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    with pytest.raises(commitstore.ConfigurationError) as err:
        store.put_file("x.pt", folder)
    message = str(err.value)
    assert message.count(str(folder)) == 1, message
    assert "stage_dir" in message and "folder" in message
    assert not (tmp_path / "s").exists()  # refused before any write: not even the root


def _damaged(tmp_path: Path, where: str) -> tuple[commitstore.CommitStore, Path]:
    """A store with ``a/step_1.pt`` and ``b.pt`` whose records tree is damaged at ``where``:
    ``"folder"``: its folder ``a`` moved out and a symlink to it left in its place;
    ``"records"``: the records folder itself so replaced; ``"file"``: the folder ``a``
    replaced by a regular file."""
    root = tmp_path / "s"
    store = open_store(str(root))
    store.put_bytes("a/step_1.pt", b"A" * 100)
    store.put_bytes("b.pt", b"B" * 50)
    records = root / ".commitstore" / "records"
    moved = tmp_path / "elsewhere"
    if where == "records":
        os.rename(records, moved)
        records.symlink_to(moved)
    elif where == "folder":
        os.rename(records / "a", moved)
        (records / "a").symlink_to(moved)
    else:
        os.rename(records / "a", moved)
        (records / "a").write_bytes(b"not a folder")
    return store, root


@pytest.mark.parametrize("where", ["folder", "records", "file"])
def test_a_damaged_records_tree_is_bad_record_as_the_read_says(tmp_path: Path, where: str) -> None:
    store, _root = _damaged(tmp_path, where)
    with pytest.raises(commitstore.IntegrityError) as err:
        store.read_bytes("a/step_1.pt")
    assert err.value.status == "bad_record"
    report = store.verify()
    status = {r.name: r.status for r in report.results}
    assert not report.ok, report
    assert status["a/step_1.pt"] == "bad_record", report  # never "no record"
    assert "no_record" not in status.values(), report
    assert store.verify("a/step_1.pt").results[0].status == "bad_record"
    _records, bad = store.scan()  # what ls shows as bad_record rows
    if where == "folder":
        assert [b.name for b in bad] == [".commitstore/records/a"]
        assert status["b.pt"] == "ok"
    elif where == "records":
        assert [b.name for b in bad] == [".commitstore/records"]
        assert status["b.pt"] == "bad_record"  # its read says so too
        with pytest.raises(commitstore.IntegrityError, match="bad record"):
            store.read_bytes("b.pt")
    else:  # a regular file: a scan cannot tell it from another tool's file; verify can
        assert bad == []


def test_a_symlinked_records_folder_is_bad_in_scan_and_latest_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _root = _damaged(tmp_path, "records")
    _records, bad = store.scan()
    assert bad and bad[0].status == "bad_record" and "not a folder" in bad[0].detail
    with caplog.at_level(logging.WARNING, logger="commitstore"):
        assert store.latest() is None
    said = [r.getMessage() for r in caplog.records]
    assert any("bad_record" in m and ".commitstore/records" in m for m in said), said


def test_an_empty_store_and_a_foreign_file_in_the_records_folder_stay_ok(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(str(root))
    store.put_bytes("b.pt", b"B")
    (root / ".commitstore" / "records" / "notes.txt").write_bytes(b"someone's notes")
    report = store.verify()
    assert report.ok and [r.status for r in report.results] == ["ok"], report
    empty = open_store(str(tmp_path / "e"))
    empty.put_bytes("x.pt", b"x")
    empty.delete("x.pt")
    assert empty.verify().ok and empty.scan() == ([], [])
