"""Storage failures on the store's own folders come out typed, provoked for real: a tmpfs out of
inodes (ENOSPC), a read-only bind mount (EROFS), permissions enforced on a child that dropped root
(EACCES), and a FUSE mount whose folder fsync fails (EIO) after the record is renamed into place.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import commitstore
from commitstore import (
    CommitStoreError,
    InsufficientSpaceError,
    Retention,
    StorageError,
    open_store,
)
from commitstore.testing import LocalBackdoor, record_path, xxh

from .helpers.fusemount import FaultMount

NOBODY = 65534


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


@pytest.fixture
def inode_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with very few inodes: creating anything more fails with ENOSPC."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    _mount("-t", "tmpfs", "-o", "size=4m,nr_inodes=64", "tmpfs", str(mnt))
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def _exhaust_inodes(where: Path) -> int:
    where.mkdir()
    n = 0
    while True:
        try:
            (where / f"f{n}").touch()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return n
        n += 1


def test_enospc_creating_the_stores_own_folder_is_insufficient_space(inode_fs: Path) -> None:
    root = inode_fs / "s"
    LocalBackdoor(root).write("a.bin", b"old data, no record")  # no .commitstore/ yet
    store = open_store(root)
    assert _exhaust_inodes(inode_fs / "filler") > 0
    # delete and adopt take the publish lock, whose folder and file must be created.
    for call in (lambda: store.delete("a.bin"), lambda: store.adopt(trust=True)):
        with pytest.raises(InsufficientSpaceError) as info:
            call()
        assert info.value.errno == errno.ENOSPC
        assert isinstance(info.value.__cause__, OSError)
    assert LocalBackdoor(root).read("a.bin") == b"old data, no record"


def test_enospc_filling_a_folder_copy_is_insufficient_space(inode_fs: Path, tmp_path: Path) -> None:
    """A folder artifact restored from a mirror into a primary whose disk runs out of inodes
    mid-folder: InsufficientSpaceError (not a raw OSError), nothing published, no staging
    left behind by the failed copy's abort."""
    mirror = tmp_path / "m"
    with open_store(mirror).stage_dir("fold") as d:
        for i in range(80):
            (d / f"d{i}").mkdir()
            (d / f"d{i}" / "f").write_bytes(b"x" * 100)
    root = inode_fs / "p"
    with open_store(root, mirrors=[str(mirror)]) as store:
        store.put_bytes("seed", b"s")
        with pytest.raises(InsufficientSpaceError) as info:
            store.restore("fold")
        assert info.value.errno == errno.ENOSPC
    door = LocalBackdoor(root)
    assert door.read("seed") == b"s"
    assert door.read(record_path("fold")) is None
    assert not (root / "fold").exists()
    assert [f for f in door.files() if ".commitstore.tmp" in f] == []


@pytest.fixture
def readonly(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(writable folder, the same folder through a read-only bind mount)."""
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    _mount("--bind", str(rw), str(ro))
    try:
        _mount("-o", "remount,ro,bind", str(ro))
        yield rw, ro
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=True)


def test_readonly_store_gives_storage_error_with_errno(readonly: tuple[Path, Path]) -> None:
    rw, ro = readonly
    open_store(rw).put_bytes("a.bin", b"committed")
    store = open_store(ro)
    assert store.read_bytes("a.bin") == b"committed"  # reading works
    with pytest.raises(StorageError) as info:
        store.delete("a.bin")  # the publish lock opens .commitstore/lock for writing
    assert info.value.errno == errno.EROFS and isinstance(info.value, OSError)
    assert str(ro) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert LocalBackdoor(rw).read("a.bin") == b"committed"


def _as_nobody(fn: Callable[[], object]) -> dict[str, object]:
    """Run ``fn`` in a forked child that dropped root (so permissions apply); what it returned
    or raised, as JSON."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                out: dict[str, object] = {"returned": repr(fn())}
            except BaseException as exc:
                out = {
                    "raised": type(exc).__name__,
                    "typed": isinstance(exc, CommitStoreError),
                    "errno": getattr(exc, "errno", None),
                    "message": str(exc),
                    "cause": type(exc.__cause__).__name__ if exc.__cause__ else None,
                }
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    result: dict[str, object] = json.loads(data)
    return result


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder a dropped-privileges child can reach (pytest's tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="commitstore-perm-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def test_permission_denied_reads_are_storage_errors(shared_dir: Path) -> None:
    root = shared_dir / "s"
    store = open_store(root)
    store.put_bytes("a.bin", b"x" * 100)
    (root / ".commitstore").chmod(0o700)  # root's only: nobody cannot look inside
    for call in (store.list, lambda: store.record("a.bin"), lambda: store.read_bytes("a.bin")):
        out = _as_nobody(call)
        assert out.get("typed") is True, out
        assert out["errno"] == errno.EACCES and out["cause"] == "PermissionError", out


def test_retention_failure_never_fails_the_commit(shared_dir: Path) -> None:
    root = shared_dir / "s"
    open_store(root).put_bytes("old/step_1", b"1" * 100)
    for path in (root, root / ".commitstore", root / ".commitstore" / "records"):
        os.chown(path, NOBODY, NOBODY)
    os.chown(root / ".commitstore" / "lock", NOBODY, NOBODY)
    # old/step_1's record folder stays root's: pruning it fails with EACCES.
    store = open_store(root, retention=Retention(keep_last=1, min_age=0))
    out = _as_nobody(lambda: store.put_bytes("step_2", b"2" * 100))
    assert "raised" not in out, out
    assert "Record(name='step_2'" in str(out["returned"])
    door = LocalBackdoor(root)
    assert door.read("step_2") == b"2" * 100
    assert json.loads(door.read(record_path("step_2")) or b"")["digest"] == xxh(b"2" * 100)
    assert door.read(record_path("old/step_1")) is not None  # retention really failed
    # As root the same retention succeeds: the permission was what failed, not the policy.
    store.put_bytes("step_3", b"3")
    assert door.read(record_path("old/step_1")) is None


@pytest.fixture(scope="module")
def fault_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultMount]:
    m = FaultMount(tmp_path_factory.mktemp("faultfs-typed"))
    try:
        yield m
    finally:
        m.stop()


@pytest.mark.parametrize("where", ["records", "data"])
def test_folder_fsync_failure_after_the_rename_still_commits(
    fault_mount: FaultMount, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    sub = f"s-{where}"
    root = fault_mount.mnt / sub
    store = open_store(root, strategy="local")  # local policy: a folder fsync EIO is not tolerated
    store.put_bytes("dd/warmup", b"w")
    match = f"/{sub}/.commitstore/records/dd" if where == "records" else f"/{sub}/dd"
    fault_mount.set(fsyncdir_eio={"match": match})
    try:
        with caplog.at_level(logging.WARNING, logger="commitstore"):
            rec = store.put_bytes("dd/ckpt", b"c" * 1000)
    finally:
        fault_mount.clear()
    assert rec.digest == xxh(b"c" * 1000)
    door = LocalBackdoor(fault_mount.backing / sub)
    assert door.read("dd/ckpt") == b"c" * 1000
    assert json.loads(door.read(record_path("dd/ckpt")) or b"")["digest"] == rec.digest
    assert [f for f in door.files() if ".commitstore.new." in f or ".tmp." in f] == []
    assert store.verify("dd/ckpt").ok
    warned = [r.getMessage() for r in caplog.records if "durability unconfirmed" in r.getMessage()]
    assert warned and "is published" in warned[0], caplog.text


def test_read_errors_of_an_open_file_are_storage_errors(fault_mount: FaultMount) -> None:
    root = fault_mount.mnt / "s-read"
    store = open_store(root, strategy="bridge")  # drops cached pages: reads reach the mount
    data = b"r" * 100_000
    store.put_bytes("r/a.bin", data)
    fault_mount.set(read_eio={"match": "/s-read/r/a.bin"})
    try:
        for call in (
            lambda: store.read_bytes("r/a.bin"),
            lambda: store.open("r/a.bin", verify="none").read(),
            lambda: store.get_file("r/a.bin", root.parent / "out-read.bin"),
        ):
            with pytest.raises(StorageError) as info:
                call()
            assert info.value.errno == errno.EIO and "a.bin" in str(info.value)
    finally:
        fault_mount.clear()
    assert store.read_bytes("r/a.bin") == data
    assert not (root.parent / "out-read.bin").exists()


def test_put_file_of_a_missing_or_unreadable_source_is_typed(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    with pytest.raises(commitstore.NotFoundError, match="no such local file"):
        store.put_file("a.pt", tmp_path / "missing.bin")
    with pytest.raises(commitstore.ConfigurationError, match="stage_dir"):
        store.put_file("b.pt", tmp_path)  # a folder: a bad argument, refused before its open
    with pytest.warns(UserWarning, match="no store at"):
        assert store.list() == []
    assert not (tmp_path / "store").exists()  # failed writes created nothing, not even the root


def test_an_error_is_unavailable_by_its_words_never_by_digits_inside_a_url() -> None:
    from commitstore.backends.object._transport import is_unavailable

    url = "http://127.0.0.1:1/o?name=probe-c59325036347&upload_id=1664c872305"
    assert not is_unavailable(OSError(f"Forbidden: {url}"))  # "503" only inside the URL
    assert not is_unavailable(OSError("Forbidden: key ab5030cd"))
    assert is_unavailable(OSError(f"503 Service Unavailable: {url}"))
    assert is_unavailable(OSError("An error occurred (SlowDown) when calling PutObject"))


def test_a_dropped_connection_to_a_port_with_412_in_it_is_unavailable_not_a_conflict() -> None:
    """The fake GCS server once listened on port 41251: the text of a connection cut mid-chunk
    held "412", and the upload was reported as "already exists" (a create-only conflict)."""
    from aiohttp import ClientOSError

    from commitstore.backends.object._transport import says_status
    from commitstore.backends.object.gcs import errors as _gcserrors

    url = "http://127.0.0.1:41251/upload/storage/v1/b/b/o?uploadType=resumable&upload_id=a412b"
    cut = ClientOSError(None, f"Can not write request body for {url}")
    err = _gcserrors.translate(cut, "uploading", "gs://b/k")
    assert isinstance(err, commitstore.BackendUnavailableError), err
    assert not says_status(OSError(f"Forbidden: {url}"), 412)
    assert not says_status(OSError("key ab412cd, version 1.412"), 412)
    assert says_status(OSError(f"412 Precondition Failed: {url}"), 412)
    assert says_status(OSError("HTTP status 412"), 412)
    refused = OSError(f"412 Precondition Failed: {url}")
    assert isinstance(
        _gcserrors.translate(refused, "uploading", "x"), commitstore.AlreadyExistsError
    )
