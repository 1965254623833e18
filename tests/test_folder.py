"""The multi-writer folder commit (``begin_folder`` / ``join_folder``): files written through
several store handles into one staging area, one record as the commit point; what ``commit``
checks; tokens; what each backend refuses; gc of what dead writers leave."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from commitstore import (
    AlreadyExistsError,
    CommitError,
    ConfigurationError,
    FileRecord,
    InvalidNameError,
    open_store,
)


def _staging(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".commitstore.tmp.")]


def test_two_handles_one_commit_and_replace(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store, other = open_store(str(root)), open_store(str(root))
    store.put_bytes("ckpt-1", b"old")
    folder = store.begin_folder("run/ckpt-2", step=2, metadata={"k": 1})
    a = other.join_folder(folder.token).write_bytes("shard/a.bin", b"A" * 10)
    b = folder.write_bytes("b.bin", b"B" * 3)
    assert [r.name for r in store.list()] == ["ckpt-1"]
    assert not (root / "run" / "ckpt-2").exists() and _staging(root)
    rec = folder.commit([b, a])
    assert (rec.name, rec.step, rec.kind, rec.size) == ("run/ckpt-2", 2, "dir", 13)
    assert rec.metadata == {"k": 1} and rec == store.record("run/ckpt-2")
    assert (root / "run" / "ckpt-2" / "shard" / "a.bin").read_bytes() == b"A" * 10
    assert store.verify(level="full").ok and not _staging(root)
    with pytest.raises(AlreadyExistsError):
        store.begin_folder("run/ckpt-2")
    again = store.begin_folder("run/ckpt-2", overwrite=True)
    new = again.commit([again.write_bytes("c.bin", b"C")])
    assert [f.path for f in new.files] == ["c.bin"]
    assert sorted(p.name for p in (root / "run" / "ckpt-2").iterdir()) == ["c.bin"]
    assert store.verify(level="full").ok


def test_commit_checks_the_staging_area(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = open_store(str(root))
    folder = store.begin_folder("f")
    a = folder.write_bytes("a", b"12345")
    folder.write_bytes("extra", b"x")
    with pytest.raises(CommitError, match="extra: not expected"):
        folder.commit([a])
    with pytest.raises(CommitError, match="b: missing"):
        folder.commit([a, FileRecord("b", 1, a.digest), FileRecord("extra", 1, a.digest)])
    with pytest.raises(CommitError, match="1 bytes stored, 2 recorded"):
        folder.commit([a, FileRecord("extra", 2, a.digest)])
    # same size, other bytes: only the full check reads them again
    (staged,) = [p for p in _staging(root) if p.is_dir()]
    (staged / "a").write_bytes(b"54321")
    extra = FileRecord("extra", 1, folder.write_bytes("x2", b"x").digest)
    (staged / "x2").unlink()
    with pytest.raises(CommitError, match="a: digest"):
        folder.commit([a, extra], check="full")
    assert store.list() == []
    folder.abort()
    assert not _staging(root)
    with pytest.raises(ConfigurationError):
        folder.commit([])


def test_tokens_and_paths_are_checked(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s1"))
    folder = store.begin_folder("x")
    for bad in ["", "{}", json.dumps({"v": 1, "id": "zz"}), 5]:
        with pytest.raises(ConfigurationError):
            store.join_folder(bad)  # type: ignore[arg-type]
    doc = json.loads(folder.token)
    doc["name"] = "../escape"
    with pytest.raises(ConfigurationError):
        store.join_folder(json.dumps(doc))
    with pytest.raises(ConfigurationError, match="not for this store"):
        open_store(str(tmp_path / "s2")).join_folder(folder.token)
    with pytest.raises(InvalidNameError):
        folder.open_file("../up")
    with pytest.raises(InvalidNameError):
        store.begin_folder(".commitstore.tmp.x")
    with pytest.raises(ConfigurationError):
        store.begin_folder("y", step=-1)


def test_backends_without_a_multi_writer_commit_refuse(moto: Any) -> None:
    with pytest.raises(ConfigurationError, match="no multi-writer folder commit"):
        open_store("memory:///cs-folder").begin_folder("x")
    s3 = open_store(moto.url("folder-refuse"), **moto.options())
    with pytest.raises(ConfigurationError, match="object store"):
        s3.begin_folder("x", overwrite=True)


def test_gc_keeps_young_leftovers_and_removes_old_ones(tmp_path: Path, moto: Any) -> None:
    root = tmp_path / "store"
    local = open_store(str(root))
    s3 = open_store(moto.url("folder-gc"), **moto.options())
    for store in (local, s3):
        folder = store.begin_folder("dead")
        folder.write_bytes("a", b"abc")  # and the writer dies: no commit
        folder._release()  # as its death would: the kernel drops its liveness lock
        kept = store.gc(min_age=3600)
        assert kept.removed == () and [k.reason for k in kept.kept] == ["younger than min_age"]
        assert store.list() == []
        assert [i.kind for i in store.gc(min_age=0).removed] == [
            "staging" if store is local else "folder"
        ]
        assert store.gc(min_age=0).removed == ()
        assert store.verify().results == ()
    assert not _staging(root)


def test_importing_commitstore_imports_no_framework() -> None:
    code = (
        "import sys, commitstore, commitstore._folderwrite; "
        "print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_mirrors_get_the_folder_only_after_its_commit(tmp_path: Path) -> None:
    mirror = open_store(str(tmp_path / "mirror"))
    store = open_store(str(tmp_path / "primary"), mirrors=[mirror], mirror_mode="sync")
    folder = store.begin_folder("ck/step_3")
    a = folder.write_bytes("a.bin", b"a" * 100)
    store.flush()
    assert mirror.list() == [] and not (tmp_path / "mirror" / "ck").exists()
    assert store.prune(keep_last=0, min_age=0).deleted == ()  # prune sees nothing of it
    rec = folder.commit([a])
    assert mirror.record("ck/step_3") == rec
    assert mirror.verify(level="full").ok
