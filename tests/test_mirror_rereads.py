"""Copies from a local primary to S3 send their bodies from the primary's file (read again by
position) instead of holding them in memory, and the bytes stored are still the bytes hashed
against the record: a file changed in between is refused by the server (``rclone serve s3``
checks each body's Content-MD5) or, where the server checks nothing (moto), by the sink itself,
which hashes what each body served.

Against both S3 servers; the mirror is read back with boto3 (``S3Backdoor``), never through the
API under test.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore.backends.object.bodies import SourceWindow
from commitstore.backends.rename.posix._maphash import ReadFile
from commitstore.errors import IntegrityError, StorageError
from commitstore.mirrors.copy import held_in_memory
from commitstore.testing import S3Backdoor, record_path, xxh

from .helpers.s3servers import BUCKET, RcloneS3, S3Server
from .helpers.serverfixture import module_server

MiB = 1024 * 1024
rclone = module_server(RcloneS3, "rclone")
SHAPES = {"whole": 3 * MiB + 1, "parts": 11 * MiB + 3}
"""With 5 MiB parts and ``single_put_max``: one PutObject, and three parts."""


@pytest.fixture(params=["moto", "rclone"])
def server(request: pytest.FixtureRequest) -> S3Server:
    found: S3Server = request.getfixturevalue(request.param)
    return found


def _stores(tmp_path: Path, server: S3Server, **extra: Any) -> tuple[CommitStore, S3Backdoor]:
    """A local primary with one S3 mirror (5 MiB parts and single-PUT limit, ``extra``
    options), and the mirror's backdoor."""
    prefix = f"rereads-{time.monotonic_ns()}"
    mirror = open_store(
        server.url(prefix),
        **server.options(),
        part_size=5 * MiB,
        single_put_max=5 * MiB,
        **extra,
    )
    primary = open_store(tmp_path / "primary", mirrors=[mirror], mirror_mode="sync")
    return primary, S3Backdoor(server.client(), BUCKET, prefix)


def _log_bodies(mirror: CommitStore) -> list[tuple[str, str]]:
    """(S3 method, body type) of every request with a body for an artifact from now on."""
    backend: Any = mirror._backend
    send_body = backend.send_body
    sent: list[tuple[str, str]] = []

    async def logged(what: str, parts: tuple[str, ...], method: str, body: Any, **kw: Any) -> Any:
        if parts[0] != ".commitstore":
            sent.append((method, type(body).__name__))
        return await send_body(what, parts, method, body, **kw)

    backend.send_body = logged
    return sent


def _write_primary(tmp_path: Path, data: dict[str, bytes]) -> None:
    """Commit ``data`` on the primary's folder without mirrors (sync copies it afterwards)."""
    plain = open_store(tmp_path / "primary")
    for name, body in data.items():
        plain.put_bytes(name, body)


def test_copies_from_a_local_primary_send_their_bodies_from_the_file(
    tmp_path: Path, server: S3Server
) -> None:
    data = {f"{shape}.bin": os.urandom(size) for shape, size in SHAPES.items()}
    _write_primary(tmp_path, data)
    store, door = _stores(tmp_path, server)
    mirror = store.mirrors[0]
    sent = _log_bodies(mirror)
    report = store.sync()
    assert sorted(report.mirrors[0].copied) == sorted(data)
    windows = [("put_object", "SourceWindow")] + [("upload_part", "SourceWindow")] * 3
    assert sorted(sent) == sorted(windows), "a body was held in memory"
    # Replication of a new commit takes the same path.
    sent.clear()
    again = os.urandom(SHAPES["whole"])
    store.put_bytes("replicated.bin", again)
    assert sent == [("put_object", "SourceWindow")]
    for name, body in {**data, "replicated.bin": again}.items():
        assert door.read(name) == body
        assert door.read(record_path(name)) is not None
    assert door.pending_uploads() == []
    # Such copies reserve nothing against sync's memory budget; from a primary that cannot give
    # its bytes again (memory://), a copy to S3 reserves what its sink holds.
    rec = store.record("whole.bin")
    assert held_in_memory(store._committer, mirror._committer, rec) == 0
    elsewhere = open_store(f"memory://rereads-{time.monotonic_ns()}")
    assert held_in_memory(elsewhere._committer, mirror._committer, rec) == rec.size


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_primary_file_changed_after_it_was_hashed_is_never_published(
    tmp_path: Path, server: S3Server, shape: str
) -> None:
    """The primary's file changes in place (same size) right after the copy hashed its first
    bytes, before they are sent: the mirror gets nothing (no object, no record, no unfinished
    upload) and sync reports the primary's copy bad (it no longer matches its record)."""
    name, size = f"{shape}.bin", SHAPES[shape]
    data = os.urandom(size)
    _write_primary(tmp_path, {name: data})
    # One attempt per request (the store's retries): the SDK's retries of a refused body: no help
    store, door = _stores(tmp_path, server, retries=1)
    backend: Any = store.mirrors[0]._backend
    open_sink = backend.open_sink
    changed: list[bool] = []

    def changing_sink(parts: tuple[str, ...], **kwargs: Any) -> Any:
        sink = open_sink(parts, **kwargs)
        if parts[0] == ".commitstore":
            return sink
        write = sink.write

        def write_then_change(view: memoryview) -> None:
            write(view)
            if not changed:  # bytes 0-9 were hashed: change them under the copy
                with open(tmp_path / "primary" / name, "r+b") as f:
                    f.write(bytes(b ^ 0xFF for b in data[:10]))
                changed.append(True)

        sink.write = write_then_change
        return sink

    backend.open_sink = changing_sink
    report = store.sync()
    assert changed
    assert name in report.primary_bad
    assert report.mirrors[0].copied == ()
    assert door.read(name) is None
    assert door.read(record_path(name)) is None
    assert door.pending_uploads() == []


def _truncate(path: Path, data: bytes) -> None:
    os.truncate(path, len(data) // 2)


def _replace(path: Path, data: bytes) -> None:
    """What another writer's rename over the name does: a new file of the same size."""
    other = path.with_name(path.name + ".new")
    other.write_bytes(_other(data))
    os.replace(other, path)


def _overwrite(path: Path, data: bytes) -> None:
    """Another process's commit of other bytes over the name (``overwrite=True``)."""
    open_store(path.parent).put_bytes(path.name, _other(data), overwrite=True)


def _other(data: bytes) -> bytes:
    return bytes(b ^ 0x5A for b in data)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize(
    "change", [_truncate, _replace, _overwrite], ids=["truncated", "replaced", "overwritten"]
)
def test_a_primary_file_truncated_or_replaced_while_it_is_sent_is_never_published_partly(
    tmp_path: Path,
    server: S3Server,
    shape: str,
    change: Any,
) -> None:
    """The primary's file is cut to half, replaced by another file (a rename over it), or
    overwritten by another commit, once the first body of the copy is on its way: the copy
    fails loud, or (the old bytes still read through the descriptor the copy holds) publishes
    exactly the recorded old version; never a mix, no unfinished upload; the primary keeps its
    record (or, overwritten, its new version, whole)."""
    name, size = f"{shape}.bin", SHAPES[shape]
    data = os.urandom(size)
    _write_primary(tmp_path, {name: data})
    rec = open_store(tmp_path / "primary").record(name)
    raw_record = (tmp_path / "primary" / record_path(name)).read_bytes()
    store, door = _stores(tmp_path, server, retries=1)  # one attempt: the SDK's retries, no help
    backend: Any = store.mirrors[0]._backend
    send_body = backend.send_body
    changed: list[bool] = []

    async def change_then_send(
        what: str, parts: tuple[str, ...], method: str, body: Any, **kw: Any
    ) -> Any:
        if parts[0] != ".commitstore" and not changed:
            assert isinstance(body, SourceWindow)
            change(tmp_path / "primary" / name, data)
            changed.append(True)
        return await send_body(what, parts, method, body, **kw)

    backend.send_body = change_then_send
    report = store.sync()
    assert changed
    mirrored = door.read(name)
    if mirrored is None:
        assert report.mirrors[0].copied == ()
        detail = report.mirrors[0].failed.get(name) or report.primary_bad.get(name, "")
        assert "size_mismatch" in detail or "does not match" in detail, report
        assert door.read(record_path(name)) is None
    else:  # the old bytes, read through the copy's open descriptor: whole, and recorded
        assert change is not _truncate
        assert mirrored == data and xxh(mirrored) == rec.digest
        assert door.read(record_path(name)) == raw_record
    assert door.pending_uploads() == []
    primary = open_store(tmp_path / "primary")
    if change is _overwrite:  # the new version stands on the primary, whole
        assert primary.read_bytes(name) == _other(data)
        assert primary.verify(name, level="full").ok
    else:
        assert (tmp_path / "primary" / record_path(name)).read_bytes() == raw_record
        assert not primary.verify(name).ok, "the change is what it is"


def test_a_failed_read_of_the_primary_is_reported_as_one(
    tmp_path: Path, server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of the primary failing while a body is sent (EIO) is the error of the copy, as
    the storage's StorageError, not the lost connection the HTTP client makes of it."""
    name = "whole.bin"
    data = os.urandom(SHAPES["whole"])
    _write_primary(tmp_path, {name: data})
    # One attempt per request (the store's retries): the SDK's retries of a failed send: no help
    store, door = _stores(tmp_path, server, retries=1)

    def failing(self: ReadFile, offset: int, n: int) -> bytes:
        raise StorageError(5, "reading the primary failed: Input/output error", path=name)

    monkeypatch.setattr(ReadFile, "pread", failing)
    report = store.sync()
    failed = report.mirrors[0].failed
    assert "reading the primary failed" in failed[name], failed
    assert not report.primary_bad  # the primary's own check reads it whole
    assert door.read(name) is None
    assert door.read(record_path(name)) is None


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads: list[tuple[int, int]] = []

    def pread(self, offset: int, n: int) -> bytes:
        self.reads.append((offset, n))
        return self.data[offset : offset + n]


def test_a_window_attests_only_one_whole_reading_in_order() -> None:
    data = os.urandom(100_000)
    source = _Bytes(data)
    window = SourceWindow(source, 1000, 50_000, expected=xxh(data[1000:51_000]), shown="x")
    assert window.read(30_000) == data[1000:31_000]
    assert not window.intact()  # not read to its end
    assert window.read() == data[31_000:51_000]
    assert window.read() == b""
    assert window.intact()
    window.seek(0)  # a retry reads it again: attested again once read whole
    assert window.read(10) == data[1000:1010]
    assert not window.intact()
    assert window.read() == data[1010:51_000]
    assert window.intact()
    window.seek(20)  # out of order: never attested
    window.read()
    assert not window.intact()
    other = SourceWindow(source, 0, 100, expected=xxh(b"something else"), shown="x")
    other.read()
    assert not other.intact()  # read whole, but not what was hashed
    short = SourceWindow(source, 99_000, 5000, expected="", shown="x")
    with pytest.raises(IntegrityError, match="shrank"):
        short.read()
    assert isinstance(short.failure, IntegrityError)
