"""Old or new, never neither: every failure and crash point of a commit after its pending record.

The commit path writes the new record as a pending record first, publishes the data, publishes
the record, then drops the pending record (``_commit.Committer.commit``). These tests make each
step after the first fail (a typed error from the storage, or a real SIGKILL of the writing
process) and check, through a backdoor and through a fresh store, that the name verifies and
reads as exactly one version, and that gc settles what is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from commitstore import AlreadyExistsError, InsufficientSpaceError, open_store
from commitstore import _commit as commit_module
from commitstore.backends.rename.posix import LocalBackend
from commitstore.testing import LocalBackdoor, S3Backdoor, Target, pending_paths, record_path, xxh

from .helpers.s3servers import BUCKET, MotoServer

ROOT_DIR = Path(__file__).resolve().parent.parent
OLD, NEW = b"old version " * 5000, b"the new version " * 4000


def pending_path(name: str) -> str:
    """Where docs/format.md puts the pending record of ``name`` (beside its record)."""
    return record_path(name).replace("/.commitstore.rec.", "/.commitstore.new.")


@pytest.fixture
def fail_record_write(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Make the storage refuse the next record write (not the pending record) with ENOSPC,
    whether the record is written anew or is the pending record renamed onto it (local disks:
    ``publish_small_from``)."""

    def arm(name: str) -> None:
        original = commit_module.put_small
        renamed = LocalBackend.publish_small_from

        def put_small(backend: Any, parts: tuple[str, ...], body: bytes, mode: Any) -> Any:
            if "/".join(parts) == record_path(name):
                raise InsufficientSpaceError("no space left while writing the record")
            return original(backend, parts, body, mode)

        def publish_small_from(
            self: LocalBackend, src: tuple[str, ...], dst: tuple[str, ...], *, mode: Any
        ) -> Any:
            if "/".join(dst) == record_path(name):
                raise InsufficientSpaceError("no space left while publishing the record")
            return renamed(self, src, dst, mode=mode)

        monkeypatch.setattr(commit_module, "put_small", put_small)
        monkeypatch.setattr(LocalBackend, "publish_small_from", publish_small_from)

    return arm


def local(tmp_path: Path) -> Target:
    root = tmp_path / "store"
    return Target(open_store(root), LocalBackdoor(root), lambda: open_store(root))


def s3(server: MotoServer) -> Target:
    prefix = f"v{time.monotonic_ns()}"
    url, opts = server.url(prefix), server.options()
    return Target(
        open_store(url, **opts),
        S3Backdoor(server.client(), BUCKET, prefix),
        lambda: open_store(url, **opts),
    )


def check_new_version_stands(t: Target, name: str, data: bytes) -> None:
    """The name verifies and reads as ``data`` through a fresh store; gc makes it final."""
    fresh = t.reopen()
    assert t.door.read(name) == data
    assert fresh.verify(name).ok
    assert fresh.verify().ok
    assert fresh.read_bytes(name) == data
    with fresh.open(name) as f:
        assert f.read() == data
    latest = fresh.latest()
    assert latest is not None
    assert (latest.name, latest.digest) == (name, xxh(data))
    report = fresh.gc(min_age=0)
    assert [i.kind for i in report.removed] == ["pending"]
    assert pending_paths(t.door, name) == []
    assert fresh.record(name).digest == xxh(data)  # the pending record became the record
    assert fresh.verify().ok


@pytest.mark.parametrize("where", ["local", "s3"])
def test_overwrite_whose_record_write_fails_verifies_as_new(
    where: str, tmp_path: Path, moto: MotoServer, fail_record_write: Callable[[str], None]
) -> None:
    t = local(tmp_path) if where == "local" else s3(moto)
    t.store.put_bytes("step_10.pt", OLD)
    fail_record_write("step_10.pt")
    rec = t.store.put_bytes("step_10.pt", NEW, overwrite=True)  # returned: the new version
    assert rec.outcome is not None and rec.outcome.durable is False
    assert any(n.startswith("record:") and "pending record" in n for n in rec.outcome.notes)
    assert pending_paths(t.door, "step_10.pt") != []
    check_new_version_stands(t, "step_10.pt", NEW)


def test_new_name_whose_record_write_fails_raises_and_is_withdrawn(
    tmp_path: Path, fail_record_write: Callable[[str], None]
) -> None:
    """No reader finds a name without a record: the commit is withdrawn and raises (a writer
    killed at that point is the case gc completes: ``test_sigkill_at_each_step...``)."""
    t = local(tmp_path)
    fail_record_write("step_20.pt")
    with pytest.raises(InsufficientSpaceError):
        t.store.put_bytes("step_20.pt", NEW)
    result = t.reopen().verify("step_20.pt").results[0]
    assert result.status == "missing"
    assert not t.reopen().gc(min_age=0).removed
    assert t.door.read(record_path("step_20.pt")) is None


def test_folder_overwrite_whose_record_write_fails_verifies_as_new(
    tmp_path: Path, fail_record_write: Callable[[str], None]
) -> None:
    t = local(tmp_path)
    with t.store.stage_dir("hf/checkpoint-5") as d:
        (d / "model.bin").write_bytes(OLD)
    fail_record_write("hf/checkpoint-5")
    with t.store.stage_dir("hf/checkpoint-5", overwrite=True) as d:  # returns: the new version
        (d / "model.bin").write_bytes(NEW)
        (d / "config.json").write_bytes(b"{}")
    fresh = t.reopen()
    assert fresh.verify("hf/checkpoint-5").ok
    assert t.door.read("hf/checkpoint-5/config.json") == b"{}"
    out = tmp_path / "out"
    fresh.gc(min_age=0)
    fresh.get_file("hf/checkpoint-5", out)
    assert (out / "model.bin").read_bytes() == NEW
    assert fresh.record("hf/checkpoint-5").size == len(NEW) + 2


def test_mirror_copy_whose_record_write_fails_verifies_as_new_on_the_mirror(
    tmp_path: Path, fail_record_write: Callable[[str], None]
) -> None:
    primary, mirror = local(tmp_path / "p"), local(tmp_path / "m")
    mirror.store.put_bytes("step_30.pt", OLD)
    primary.store.put_bytes("step_30.pt", NEW)
    fail_record_write("step_30.pt")
    with open_store(primary.store.url, mirrors=[mirror.store], mirror_mode="sync") as both:
        report = both.sync()
    # delivered, not failed: the copy's data is published and verifies (not durable yet)
    assert "step_30.pt" not in report.mirrors[0].failed
    assert "step_30.pt" in report.mirrors[0].repaired
    check_new_version_stands(mirror, "step_30.pt", NEW)


def test_a_failure_before_the_data_step_leaves_the_old_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = local(tmp_path)
    t.store.put_bytes("step_40.pt", OLD)
    st = t.store.stage("step_40.pt", overwrite=True)
    st.write(NEW)
    sink: Any = st._sink  # the staged file: make its publish fail before the rename

    def refuse(**_kw: Any) -> Any:
        raise InsufficientSpaceError("no space left while flushing")

    monkeypatch.setattr(sink, "publish", refuse)
    with pytest.raises(InsufficientSpaceError):
        st.commit()
    fresh = t.reopen()
    assert fresh.read_bytes("step_40.pt") == OLD
    assert fresh.verify().ok
    fresh.gc(min_age=0)  # the pending record of the failed commit is dropped (roll back)
    assert t.door.read(pending_path("step_40.pt")) is None
    assert fresh.read_bytes("step_40.pt") == OLD


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from commitstore import _commit, open_store
    from commitstore.backends.rename.posix import LocalBackend

    root, name, when = sys.argv[1], sys.argv[2], sys.argv[3]
    original = _commit.put_small

    def put_small(backend, parts, body, mode):
        leaf = parts[-1]
        if when == "before-record" and leaf.startswith(".commitstore.rec."):
            os.kill(os.getpid(), signal.SIGKILL)  # data published, record not yet
        result = original(backend, parts, body, mode)
        if when == "after-pending" and leaf.startswith(".commitstore.new."):
            os.kill(os.getpid(), signal.SIGKILL)  # pending record written, data not yet
        return result

    _commit.put_small = put_small
    renamed = LocalBackend.publish_small_from

    def publish_small_from(self, src, dst, *, mode):  # the record as the pending one renamed
        if when == "before-record" and dst[-1].startswith(".commitstore.rec."):
            os.kill(os.getpid(), signal.SIGKILL)  # data published, record not yet
        return renamed(self, src, dst, mode=mode)

    LocalBackend.publish_small_from = publish_small_from
    in_place = LocalBackend.put_pending

    def put_pending(self, parts, body):  # local disks write the pending record in place
        result = in_place(self, parts, body)
        if when == "after-pending":
            os.kill(os.getpid(), signal.SIGKILL)  # pending record written, data not yet
        return result

    LocalBackend.put_pending = put_pending
    open_store(root).put_bytes(name, b"the new version " * 4000, overwrite=True)
    """
)


@pytest.mark.crash
@pytest.mark.parametrize("when", ["after-pending", "before-record"])
def test_sigkill_at_each_step_leaves_old_or_new(tmp_path: Path, when: str) -> None:
    t = local(tmp_path)
    t.store.put_bytes("step_50.pt", OLD)
    env = {**os.environ, "PYTHONPATH": f"{ROOT_DIR / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, str(tmp_path / "store"), "step_50.pt", when],
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # killed at that step, not before
    assert t.door.read(pending_path("step_50.pt")) is not None
    expected = OLD if when == "after-pending" else NEW
    fresh = t.reopen()
    assert fresh.verify().ok
    assert fresh.read_bytes("step_50.pt") == expected
    fresh.gc(min_age=0)
    assert t.door.read(pending_path("step_50.pt")) is None
    assert fresh.record("step_50.pt").digest == xxh(expected)
    assert fresh.verify().ok


@pytest.mark.parametrize("where", ["local", "s3"])
def test_no_artifact_is_committed_inside_a_committed_folder(
    where: str, tmp_path: Path, moto: MotoServer
) -> None:
    t = local(tmp_path) if where == "local" else s3(moto)
    with t.store.stage_dir("ckpt-100") as d:
        (d / "model.bin").write_bytes(OLD)
    for overwrite in (False, True):
        with pytest.raises(AlreadyExistsError, match="inside the committed artifact ckpt-100"):
            t.store.put_bytes("ckpt-100/notes.txt", b"notes", overwrite=overwrite)
        with (
            pytest.raises(AlreadyExistsError),
            t.store.stage_dir("ckpt-100/sub", overwrite=overwrite),
        ):
            pass
    assert t.door.read("ckpt-100/notes.txt") is None
    assert t.reopen().verify().ok
    assert [r.name for r in t.reopen().list()] == ["ckpt-100"]


@pytest.mark.parametrize("left", ["empty", "torn", "none"])
def test_a_crash_inside_the_in_place_pending_write_leaves_the_old_version(
    tmp_path: Path, left: str
) -> None:
    """Local disks write the pending record in place (``LocalBackend.put_pending``), so a
    crash before its syncs complete can leave it empty, torn (part of the new record) or not
    there, beside the new data's staging file (the data rename waits for those syncs). The
    name verifies and reads as the old version, and gc removes what is left."""
    scratch = open_store(tmp_path / "scratch")
    scratch.put_bytes("step_60.pt", NEW)
    new_record = LocalBackdoor(tmp_path / "scratch").read(record_path("step_60.pt")) or b""
    t = local(tmp_path)
    t.store.put_bytes("step_60.pt", OLD)
    planted = {"empty": b"", "torn": new_record[: len(new_record) // 2]}
    if left in planted:
        t.door.write(pending_path("step_60.pt"), planted[left])
    t.door.write(".commitstore.tmp.0123456789abcdef.step_60.pt", NEW)
    fresh = t.reopen()
    assert fresh.verify().ok
    assert fresh.read_bytes("step_60.pt") == OLD
    fresh.gc(min_age=0)
    assert t.door.read(pending_path("step_60.pt")) is None
    assert not [f for f in t.door.files() if ".commitstore.tmp." in f]
    assert fresh.record("step_60.pt").digest == xxh(OLD)
