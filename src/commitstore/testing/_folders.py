"""Conformance, folder artifacts: ``stage_dir`` publishes a whole folder or nothing, a folder
written through two handles (``begin_folder``/``join_folder``) commits once, and an empty folder
is an artifact. Assertions read the storage through the target's backdoor."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from commitstore import ConfigurationError
from commitstore.backends import Backend
from commitstore.testing.target import record_path, staging_files, xxh

if TYPE_CHECKING:
    from commitstore.testing.target import Target


class FolderConformance:
    """Mixed into :class:`StoreConformance`; uses its ``target`` fixture."""

    def test_stage_dir_publishes_whole_folder(self, target: Target) -> None:
        with target.store.stage_dir("hf/checkpoint-30") as d:
            (d / "model.safetensors").write_bytes(b"m" * 1000)
            (d / "sub").mkdir()
            (d / "sub" / "opt.bin").write_bytes(b"o" * 10)
            assert target.door.read("hf/checkpoint-30/model.safetensors") is None
        assert target.door.read("hf/checkpoint-30/model.safetensors") == b"m" * 1000
        assert target.door.read("hf/checkpoint-30/sub/opt.bin") == b"o" * 10
        doc = json.loads(target.door.read(record_path("hf/checkpoint-30")) or b"")
        assert doc["kind"] == "dir" and doc["step"] == 30 and doc["size"] == 1010
        assert {(f["path"], f["digest"]) for f in doc["files"]} == {
            ("model.safetensors", xxh(b"m" * 1000)),
            ("sub/opt.bin", xxh(b"o" * 10)),
        }
        assert staging_files(target.door) == []

    def test_folder_written_by_two_handles_commits_once(self, target: Target) -> None:
        backend = target.store._backend
        if (
            backend.capabilities.staging_names
            and type(backend).publish_folder is Backend.publish_folder
        ):
            with pytest.raises(ConfigurationError, match="no multi-writer folder"):
                target.store.begin_folder("multi/step_5")  # a strategy without one says so
            return
        folder = target.store.begin_folder("multi/step_5", metadata={"ranks": 2})
        a = target.reopen().join_folder(folder.token).write_bytes("a.bin", b"A" * 1000)
        b = folder.write_bytes("sub/b.bin", b"B" * 10)
        assert target.store.list() == []
        assert target.door.read(record_path("multi/step_5")) is None
        rec = folder.commit([a, b])
        assert target.door.read("multi/step_5/a.bin") == b"A" * 1000
        assert target.door.read("multi/step_5/sub/b.bin") == b"B" * 10
        doc = json.loads(target.door.read(record_path("multi/step_5")) or b"")
        assert doc["kind"] == "dir" and doc["step"] == 5 and doc["metadata"] == {"ranks": 2}
        assert {(f["path"], f["digest"]) for f in doc["files"]} == {
            ("a.bin", xxh(b"A" * 1000)),
            ("sub/b.bin", xxh(b"B" * 10)),
        }
        assert rec == target.store.record("multi/step_5")
        assert staging_files(target.door) == []
        assert target.store.verify(level="full").ok

    def test_empty_folder_artifact(self, target: Target) -> None:
        with target.store.stage_dir("empty_7"):
            pass
        visible = target.store._backend.capabilities.empty_folders
        assert target.door.is_dir("empty_7") or not visible
        rec = target.store.record("empty_7")
        assert rec.kind == "dir"
        assert rec.files == ()
        assert target.store.verify("empty_7").ok
        target.store.delete("empty_7")
        assert not target.door.is_dir("empty_7")
        assert target.store.verify("empty_7").results[0].status in ("missing", "no_record")

    def test_stage_dir_exception_publishes_nothing(self, target: Target) -> None:
        before = target.door.files()
        with pytest.raises(KeyError), target.store.stage_dir("hf/checkpoint-40") as d:
            (d / "model.safetensors").write_bytes(b"m" * 1000)
            raise KeyError("boom")
        assert target.door.files() == before
