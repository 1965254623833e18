"""A file artifact replaced by a folder of the same name (``put_bytes("x")``, then
``stage_dir("x", overwrite=True)``) on S3: moto and ``rclone serve s3``.

``rclone serve s3`` keeps a real folder tree: an object ``x`` and keys below ``x/`` cannot
coexist, so copying the staged folder's files over ``x/...`` failed while the old file was still
there (CommitError, the replace left half done). The old file's object is now deleted first,
before the copies, under the versioned commit: from that delete on the staged copy is whole and
the name verifies as the new folder from it, so a writer SIGKILLed between the delete and the
first copy leaves the new version (gc completes it), never neither."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore.testing import S3Backdoor, Target, record_path

from .helpers.s3servers import BUCKET, S3Server

OLD = b"the old file artifact"
NEW = {"a.bin": b"new folder file a", "sub/b.bin": b"new folder file b"}


def target(server_name: str, request: pytest.FixtureRequest) -> Target:
    server: S3Server = request.getfixturevalue(server_name)
    prefix = f"ff{time.monotonic_ns()}"
    url = server.url(prefix)
    probe: Any = open_store(url, **server.options())._committer.backend
    opts = {**server.options(), "conditional_writes": probe.conditional_writes()}
    return Target(
        open_store(url, **opts),
        S3Backdoor(server.client(), BUCKET, prefix),
        lambda: open_store(url, **opts),
    )


def write_folder(store: CommitStore, name: str) -> None:
    with store.stage_dir(name, overwrite=True) as d:
        for rel, body in NEW.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)


def read_folder(store: CommitStore, name: str, out: Path) -> dict[str, bytes]:
    store.get_file(name, out)
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def under(t: Target, name: str) -> dict[str, bytes | None]:
    """The files stored at and below ``name``, read through the backdoor."""
    return {
        f[len(name) :].lstrip("/"): t.door.read(f)
        for f in t.door.files()
        if f == name or f.startswith(name + "/")
    }


def check_new_and_clean(t: Target, tmp_path: Path) -> None:
    fresh = t.reopen()
    assert fresh.verify("ckpt/x", level="full").ok
    out = tmp_path / f"out{time.monotonic_ns()}"
    assert read_folder(fresh, "ckpt/x", out) == NEW
    assert under(t, "ckpt/x") == NEW  # the old file's object is gone, the new files are in
    assert not [f for f in t.door.files() if f.startswith(".commitstore/staged/")]


@pytest.mark.parametrize("server_name", ["moto", "rclone"])
def test_a_file_artifact_replaced_by_a_folder(
    server_name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = target(server_name, request)
    t.store.put_bytes("ckpt/x", OLD)
    write_folder(t.store, "ckpt/x")
    check_new_and_clean(t, tmp_path)
    t.store.gc(min_age=0)
    check_new_and_clean(t, tmp_path)


def killed_after_the_old_file_went(t: Target) -> None:
    """A forked writer replaces ``ckpt/x`` with the folder and is SIGKILLed right after it
    deleted the old file's object (before any copy: the delete comes first)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(ready_r)
            store = t.reopen()
            backend: Any = store._committer.backend
            delete_key = backend.delete_key

            def stopping(parts: tuple[str, ...], key: str) -> None:
                delete_key(parts, key)
                if parts == ("ckpt", "x"):
                    os.write(ready_w, b"k")
                    time.sleep(600)

            backend.delete_key = stopping
            write_folder(store, "ckpt/x")
            os.write(ready_w, b"d")
        except BaseException:
            os.write(ready_w, b"e")
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        got = os.read(ready_r, 1)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_r)
    assert got == b"k", f"the writer did not stop after deleting the old file ({got!r})"


@pytest.mark.parametrize("server_name", ["moto", "rclone"])
def test_a_writer_killed_after_deleting_the_old_file_leaves_the_new_folder(
    server_name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = target(server_name, request)
    t.store.put_bytes("ckpt/x", OLD)
    killed_after_the_old_file_went(t)
    assert under(t, "ckpt/x") == {}, "a copy ran before the old file was deleted"
    assert t.door.read(record_path("ckpt/x")) is not None  # the old record, unchanged
    fresh = t.reopen()
    assert fresh.verify("ckpt/x", level="full").ok  # the new version, from its staged copy
    assert read_folder(fresh, "ckpt/x", tmp_path / "staged") == NEW
    fresh.gc(min_age=0)  # rolls the replace forward
    check_new_and_clean(t, tmp_path)
