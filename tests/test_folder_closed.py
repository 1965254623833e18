"""A multi-writer folder write once it is closed, and the paths of one folder: a late writer of
a committed (or aborted) write is refused before anything is uploaded, an upload that races the
commit is taken back, a file and a folder of one path are refused typed, and a folder commit
over an artifact committed below its name meanwhile is refused (object stores, where the files
go to their final keys). Storage is read through the backdoor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import (
    AlreadyExistsError,
    CommitError,
    NameConflictError,
    open_store,
)
from commitstore.testing import LocalBackdoor, S3Backdoor, record_path, xxh

from .helpers.s3servers import BUCKET, MotoServer


def _s3(moto: MotoServer, prefix: str) -> tuple[Any, S3Backdoor]:
    return open_store(moto.url(prefix), **moto.options()), S3Backdoor(moto.client(), BUCKET, prefix)


def _under(door: S3Backdoor, folder: str) -> list[str]:
    return sorted(f for f in door.files() if f.startswith(f"{folder}/"))


def test_a_writer_joined_while_open_is_refused_after_the_commit_s3(moto: MotoServer) -> None:
    store, door = _s3(moto, "closed-joined-early")
    folder = store.begin_folder("f")
    late = open_store(moto.url("closed-joined-early"), **moto.options()).join_folder(folder.token)
    folder.commit([folder.write_bytes("p0", b"zero")])
    with pytest.raises(AlreadyExistsError, match="committed"):
        late.write_bytes("p2", b"late")
    late.abort()
    assert _under(door, "f") == ["f/p0"]
    assert door.read("f/p0") == b"zero"


def test_join_refuses_a_committed_or_aborted_write_before_writing_s3(moto: MotoServer) -> None:
    store, door = _s3(moto, "closed-join")
    done = store.begin_folder("done")
    done.commit([done.write_bytes("a", b"a")])
    gone = store.begin_folder("gone")
    gone.write_bytes("a", b"a")
    gone.abort()
    markers = sorted(f for f in door.files() if f.startswith(".commitstore/folders"))
    other = open_store(moto.url("closed-join"), **moto.options())
    with pytest.raises(AlreadyExistsError, match="committed"):
        other.join_folder(done.token)
    with pytest.raises(CommitError, match="no longer open"):
        other.join_folder(gone.token)
    # nothing was written: no writer's marker, no file
    assert sorted(f for f in door.files() if f.startswith(".commitstore/folders")) == markers
    assert _under(door, "done") == ["done/a"] and _under(door, "gone") == []
    with pytest.raises(CommitError, match="aborted"):
        gone.write_bytes("b", b"b")  # the aborted handle itself: refused without any I/O


def test_an_upload_that_races_the_commit_is_taken_back_s3(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = "closed-race"
    store, door = _s3(moto, prefix)
    folder = store.begin_folder("f")
    p0 = folder.write_bytes("p0", b"zero")
    late = open_store(moto.url(prefix), **moto.options()).join_folder(folder.token)
    backend = late._c.backend  # the late writer's own backend: its upload starts after the commit
    real = backend.open_sink

    def commit_first(parts: Any, *, mode: Any) -> Any:
        if parts[-1] == "p2" and folder.record is None:  # the file's upload, not its marker
            folder.commit([p0])
        return real(parts, mode=mode)

    monkeypatch.setattr(backend, "open_sink", commit_first)
    with pytest.raises(CommitError, match="removed again"):
        late.write_bytes("p2", b"late")
    late.abort()
    assert _under(door, "f") == ["f/p0"]
    assert door.read(record_path("f")) is not None
    assert store.verify("f").ok


@contextlib.contextmanager
def _either(kind: str, tmp_path: Path, moto: MotoServer) -> Iterator[tuple[Any, Any]]:
    if kind == "local":
        yield open_store(tmp_path / "s"), LocalBackdoor(tmp_path / "s")
    else:
        yield _s3(moto, "closed-paths")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_one_writer_cannot_write_a_file_and_a_folder_of_one_path(
    kind: str, tmp_path: Path, moto: MotoServer
) -> None:
    with _either(kind, tmp_path, moto) as (store, door):
        folder = store.begin_folder("f")
        sub = folder.write_bytes("sub", b"1")
        with pytest.raises(NameConflictError, match="sub/x cannot be written, this writer wrote"):
            folder.write_bytes("sub/x", b"2")
        y = folder.write_bytes("d/y", b"3")
        with pytest.raises(NameConflictError, match="d cannot be written, this writer wrote d/y "):
            folder.write_bytes("d", b"4")
        folder.commit([sub, y])
        assert door.read("f/sub") == b"1" and door.read("f/d/y") == b"3"
        assert door.read("f/sub/x") is None


def test_two_writers_of_a_file_and_a_folder_of_one_path_fail_the_commit_typed_s3(
    moto: MotoServer,
) -> None:
    store, door = _s3(moto, "closed-two-paths")
    folder = store.begin_folder("f")
    other = open_store(moto.url("closed-two-paths"), **moto.options()).join_folder(folder.token)
    records = [folder.write_bytes("sub", b"1"), other.write_bytes("sub/x", b"2")]
    with pytest.raises(CommitError, match="sub is a file and also the folder of sub/x"):
        folder.commit(records)
    assert door.read(record_path("f")) is None
    folder.abort()
    assert _under(door, "f") == []


def test_a_folder_stage_dir_over_an_artifact_committed_below_it_meanwhile_s3(
    moto: MotoServer,
) -> None:
    prefix = "closed-stage-dir-below"
    store, door = _s3(moto, prefix)
    other = open_store(moto.url(prefix), **moto.options())
    with (
        pytest.raises(NameConflictError, match="other committed artifacts"),
        store.stage_dir("f", overwrite=True) as d,
    ):
        (d / "x").write_bytes(b"AAAA")
        other.put_bytes("f/x", b"BBBB")
    assert door.read("f/x") == b"BBBB" and door.read(record_path("f")) is None
    assert xxh(b"BBBB") == store.record("f/x").digest
    assert store.verify().ok
