"""Hostile resources on storage and in arguments: files far larger than any record at a record's
path, compressed cache shards that expand without bound, damaged files ``adopt`` parses, special
files as sources, read-only mounts, symlinked folders and loose option values. Every answer is a
typed one, bounded in memory and time, and nothing committed is lost.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitstore import (
    ConfigurationError,
    IntegrityError,
    InvalidNameError,
    Retention,
    StorageError,
    open_store,
)
from commitstore._recordcache import DIRECT_MAX, SHARDS
from commitstore._recordcache import SCHEMA as CACHE_SCHEMA
from commitstore.backends import PutMode
from commitstore.errors import StoragePathError
from commitstore.maintenance.adopt import structure_problem
from commitstore.records import MAX_RECORD_BYTES
from commitstore.testing import xxh

from .helpers.azurite import Azurite
from .helpers.blocking import mkfifo, returns
from .helpers.gcsserver import FakeGcs
from .helpers.requestproxy import RequestProxy
from .helpers.s3servers import BUCKET, MotoServer

REPO = Path(__file__).resolve().parents[1]
GiB = 1 << 30


def _child(script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` in a child Python (this checkout's ``src`` first) and return the JSON
    object it prints last."""
    path = f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        check=False,
        # one malloc arena: each thread's own would reserve 64 MiB of the address space limited
        env={**os.environ, "PYTHONPATH": path, "MALLOC_ARENA_MAX": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


# -- records, pending records and markers larger than any record -----------------------------
_BOUNDED_READS = """
import json, os, resource, sys
import commitstore

root, what = sys.argv[1], sys.argv[2]
store = commitstore.open_store(root)

def vm() -> int:
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))

def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("rchar:"))

limit = vm() + 256 * 1024 * 1024  # far less than the 1 GiB planted
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
before = rchar()
try:
    if what == "record":
        got = repr(store.record("a.bin"))
    elif what == "verify_name":
        got = [(r.name, r.status) for r in store.verify("a.bin").results]
    elif what == "verify_all":
        got = [(r.name, r.status) for r in store.verify().results]
    elif what == "latest":
        got = repr(store.latest())
    elif what == "gc":
        got = repr(store.gc(min_age=0))
    elif what == "overwrite":
        got = repr(store.put_bytes("a.bin", b"version 2", overwrite=True))
    result = {"ok": got}
except BaseException as exc:
    result = {"error": type(exc).__name__, "status": getattr(exc, "status", None),
              "message": str(exc)[:300]}
result["read"] = rchar() - before
print(json.dumps(result))
"""


@pytest.mark.parametrize("what", ["record", "verify_name", "verify_all", "latest"])
def test_a_sparse_gigabyte_at_a_record_path_is_refused_unread(tmp_path: Path, what: str) -> None:
    store = open_store(str(tmp_path))
    store.put_bytes("a.bin", b"hello")
    store.put_bytes("b.bin", b"world")
    record = tmp_path / ".commitstore" / "records" / ".commitstore.rec.a.bin.json"
    os.truncate(record, GiB)  # sparse: costs no disk
    got = _child(_BOUNDED_READS, str(tmp_path), what)
    assert got["read"] < MAX_RECORD_BYTES, got
    if what == "record":
        assert got["error"] == "IntegrityError" and got["status"] == "bad_record", got
        assert str(GiB) in got["message"]
    elif what in ("verify_name", "verify_all"):
        assert ["a.bin", "bad_record"] in got["ok"], got
    else:
        assert "b.bin" in got["ok"], got  # the other artifact is still found
    assert store.read_bytes("b.bin") == b"world"


def test_a_sparse_gigabyte_pending_record_is_not_read_by_gc_or_a_commit(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    store.put_bytes("a.bin", b"hello")
    pending = tmp_path / ".commitstore" / "records" / ".commitstore.new.a.bin.json"
    pending.write_bytes(b"")
    os.truncate(pending, GiB)
    old = time.time() - 7200
    os.utime(pending, (old, old))
    got = _child(_BOUNDED_READS, str(tmp_path), "gc")
    assert got["read"] < MAX_RECORD_BYTES, got
    assert "error" not in got, got
    assert not pending.exists()  # a pending record too large to be one is dropped, as damaged
    # a commit over the name reads the pending record of an earlier commit first
    pending.write_bytes(b"")
    os.truncate(pending, GiB)
    store.put_bytes("a.bin", b"again", overwrite=True)
    assert store.read_bytes("a.bin") == b"again"


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_special_file_at_a_pending_record_path_never_sticks_the_name(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO or a symlink where a pending record goes is a damaged pending record:
    a commit of the name goes on and gc drops it, never opening it (a FIFO would block). They
    raised IntegrityError ("not a regular file") from gc and from every commit of the name."""
    store = open_store(str(tmp_path))
    store.put_bytes("a.bin", b"hello")
    pending = tmp_path / ".commitstore" / "records" / ".commitstore.new.a.bin.json"

    def plant() -> None:
        if kind == "fifo":
            mkfifo(pending)
        else:
            pending.symlink_to(tmp_path / "elsewhere.json")
            (tmp_path / "elsewhere.json").write_bytes(b"{}")

    plant()
    returns(lambda: store.put_bytes("a.bin", b"again", overwrite=True))
    assert store.read_bytes("a.bin") == b"again"
    if not os.path.lexists(pending):
        plant()
    report = returns(lambda: store.gc(min_age=0))
    assert not os.path.lexists(pending), report
    assert [i.kind for i in report.removed] == ["pending"], report
    assert store.verify().ok
    assert store.read_bytes("a.bin") == b"again"


def test_a_commit_over_a_gigabyte_record_with_a_pending_one_reads_neither_whole(
    tmp_path: Path,
) -> None:
    """An earlier commit's pending record that the data matches is made the record before a new
    commit of the name (``promote_earlier``): the record it compares with is a sparse 1 GiB
    file, refused from its size and replaced, never read."""
    store = open_store(str(tmp_path))
    store.put_bytes("a.bin", b"hello")
    records = tmp_path / ".commitstore" / "records"
    record = records / ".commitstore.rec.a.bin.json"
    (records / ".commitstore.new.a.bin.json").write_bytes(record.read_bytes())
    os.truncate(record, GiB)
    got = _child(_BOUNDED_READS, str(tmp_path), "overwrite")
    assert "error" not in got, got
    assert got["read"] < MAX_RECORD_BYTES, got
    assert store.read_bytes("a.bin") == b"version 2"
    assert record.stat().st_size < 4096


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_a_scan_reader_refuses_a_record_grown_since_the_listing_unread(tmp_path: Path) -> None:
    """A scan checks each record's listed size first; a record that grew after the listing
    is refused by the reader from its ``fstat``, before a byte of it is read."""
    store = open_store(str(tmp_path))
    store.put_bytes("a.bin", b"hello")
    record = tmp_path / ".commitstore" / "records" / ".commitstore.rec.a.bin.json"
    os.truncate(record, GiB)
    with store._backend.small_reads(
        (".commitstore", "records"), max_bytes=MAX_RECORD_BYTES
    ) as read:
        before = _rchar()
        with pytest.raises(ValueError, match=f"{GiB} bytes"):
            read((record.name,))
        assert _rchar() - before < 4096


@pytest.fixture(scope="module")
def proxy(moto: MotoServer) -> Any:
    p = RequestProxy(moto.port)
    yield p
    p.stop()


def test_an_s3_record_object_over_the_bound_is_never_downloaded(
    moto: MotoServer, proxy: RequestProxy
) -> None:
    prefix = f"big{time.monotonic_ns()}"
    opts = {**moto.options(), "endpoint_url": proxy.endpoint}
    store = open_store(moto.url(prefix), **opts)
    store.put_bytes("a.bin", b"hello")
    size = 3 * MAX_RECORD_BYTES
    key = f"{prefix}/.commitstore/records/.commitstore.rec.a.bin.json"
    moto.client().put_object(Bucket=BUCKET, Key=key, Body=b" " * size)
    proxy.count()
    with pytest.raises(IntegrityError) as err:
        store.record("a.bin")
    assert err.value.status == "bad_record"
    assert str(size) in str(err.value)
    assert proxy.relayed < MAX_RECORD_BYTES, proxy.relayed
    proxy.count()
    assert [(r.name, r.status) for r in store.verify().results] == [("a.bin", "bad_record")]
    assert proxy.relayed < MAX_RECORD_BYTES, proxy.relayed


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        server.stop()


def _proxied_store(kind: str, request: pytest.FixtureRequest) -> tuple[Any, RequestProxy]:
    """A fresh store on the ``kind`` server, every request through a counting proxy."""
    prefix = f"big{time.monotonic_ns()}"
    if kind == "gcs":
        gcs: FakeGcs = request.getfixturevalue("gcs")
        proxy = RequestProxy(int(gcs.endpoint.rsplit(":", 1)[1]))
        opts = {**gcs.options(), "endpoint_url": proxy.endpoint}
        url = gcs.url(prefix)
    else:
        az: Azurite = request.getfixturevalue("azurite")
        proxy = RequestProxy(az.port)
        conn = az.connection_string.replace(f":{az.port}/", f":{proxy.port}/")
        opts, url = {"connection_string": conn}, az.url(prefix)
    request.addfinalizer(proxy.stop)
    return open_store(url, **opts), proxy


def _plant(store: Any, parts: tuple[str, ...], data: bytes) -> None:
    sink = store._backend.open_sink(parts, mode=PutMode.REPLACE)
    sink.write(memoryview(data))
    sink.publish(size=len(data), digest=xxh(data))


@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_gcs_and_azure_record_objects_are_read_by_a_bounded_range(
    kind: str, request: pytest.FixtureRequest
) -> None:
    store, proxy = _proxied_store(kind, request)
    store.put_bytes("a.bin", b"hello")
    store.put_bytes("e.bin", b"empty record")
    records = (".commitstore", "records")
    _plant(store, (*records, ".commitstore.rec.a.bin.json"), b" " * (2 * MAX_RECORD_BYTES))
    _plant(store, (*records, ".commitstore.rec.e.bin.json"), b"")
    proxy.count()
    with pytest.raises(IntegrityError) as err:
        store.record("a.bin")
    assert err.value.status == "bad_record"
    assert proxy.relayed < MAX_RECORD_BYTES + 1024 * 1024, proxy.relayed
    # an empty object cannot hold a range's first byte: it is read whole, and is a bad record
    with pytest.raises(IntegrityError) as err:
        store.record("e.bin")
    assert err.value.status == "bad_record"
    assert {(r.name, r.status) for r in store.verify().results} == {
        ("a.bin", "bad_record"),
        ("e.bin", "bad_record"),
    }


# -- record-cache shards that expand without bound ------------------------------------------
def _gzip_bomb(expanded: int) -> bytes:
    """A valid one-member gzip of ``expanded`` spaces (a multiple of 1 MiB), about a
    thousandth of that size, built without compressing it all: the deflate blocks of each
    MiB are identical once the compressor is reset between them."""
    chunk = b" " * (1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    n = expanded >> 20
    crc = 0
    for _ in range(n):
        crc = zlib.crc32(chunk, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, expanded & 0xFFFFFFFF)
    return header + block * n + deflate.flush() + trailer


_SCAN_UNDER_A_LIMIT = """
import json, resource, sys
import commitstore

url, opts = sys.argv[1], json.loads(sys.argv[2])
store = commitstore.open_store(url, **opts)
with open("/proc/self/status") as f:
    vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
limit = vm + 768 * 1024 * 1024  # less than the 1 GiB one shard expands to
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    result = {"names": [r.name for r in store.list()]}
except BaseException as exc:
    result = {"error": type(exc).__name__, "message": str(exc)[:300]}
print(json.dumps(result))
"""


def test_a_gzip_bomb_cache_shard_is_ignored_unexpanded_and_rewritten(moto: MotoServer) -> None:
    prefix = f"bomb{time.monotonic_ns()}"
    store = open_store(moto.url(prefix), **moto.options())
    names = [f"c/step_{i:04d}.pt" for i in range(DIRECT_MAX + 4)]
    for i, name in enumerate(names):
        store.put_bytes(name, bytes([i + 1]) * (i + 10))
    bomb = _gzip_bomb(GiB)
    assert len(bomb) < 2 * 1024 * 1024
    client = moto.client()
    shards = [f"{prefix}/.commitstore/cache/records/{s:02x}.json.gz" for s in range(SHARDS)]
    for key in shards:
        client.put_object(Bucket=BUCKET, Key=key, Body=bomb)
    got = _child(_SCAN_UNDER_A_LIMIT, moto.url(prefix), json.dumps(moto.options()))
    assert got == {"names": names}, got
    # the shards the scan fetched records for were rewritten whole (and small) again
    rewritten = 0
    for key in shards:
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        if body != bomb:
            doc = json.loads(gzip.decompress(body))
            assert doc["schema"] == CACHE_SCHEMA
            rewritten += 1
    assert rewritten > 0
    assert [r.name for r in store.list()] == names


# -- adopt's parsers on damaged files ----------------------------------------------------------
def _safetensors(header: object, data: bytes = b"\0" * 16) -> bytes:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(raw)) + raw + data


def _zip_bytes(*, force_zip64: bool = False, members: int = 2) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for i in range(members):
            with z.open(f"archive/data/{i}", "w", force_zip64=force_zip64) as m:
                m.write(bytes([i]) * (40 + i))
    return buf.getvalue()


def _with_cd_extra(zip_data: bytes, extra: bytes) -> bytes:
    """``zip_data`` (one stored member, no zip64) with ``extra`` as its central directory
    entry's extra field and its local header offset deferred to zip64 (0xFFFFFFFF)."""
    cd_at = zip_data.index(b"PK\x01\x02")
    eocd_at = zip_data.index(b"PK\x05\x06")
    entry = bytearray(zip_data[cd_at:eocd_at])
    name_len, extra_len = struct.unpack("<HH", entry[28:32])
    assert extra_len == 0
    entry[30:32] = struct.pack("<H", len(extra))
    entry[42:46] = struct.pack("<L", 0xFFFFFFFF)
    entry = entry[: 46 + name_len] + extra + entry[46 + name_len :]
    eocd = bytearray(zip_data[eocd_at:])
    eocd[12:16] = struct.pack("<L", len(entry))
    return zip_data[:cd_at] + bytes(entry) + bytes(eocd)


DAMAGED: dict[str, bytes] = {
    # data_offsets that are not integers (compared with ints: TypeError)
    "offsets.safetensors": _safetensors({"t": {"dtype": "F32", "data_offsets": ["0", 4]}}),
    "offsets_null.safetensors": _safetensors({"t": {"data_offsets": [None, None]}}),
    # a header nested deeper than the JSON parser recurses (RecursionError)
    "deep.safetensors": _safetensors(b"[" * 200_000 + b"]" * 200_000),
    "deep.json": b"[" * 200_000 + b"]" * 200_000,
    # a zip64 extra field whose length is not a multiple of 8 (struct.error)
    "extra.pt": _with_cd_extra(_zip_bytes(members=1), struct.pack("<HH", 1, 5) + b"\0" * 5),
    # an end of central directory saying zip64, 4 bytes into the file (a negative seek)
    "early.pt": b"PK\x03\x04"
    + b"PK\x05\x06"
    + struct.pack("<4H2LH", 0, 0, 0xFFFF, 0xFFFF, 0, 0, 0),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_adopt_reports_damaged_files_it_cannot_parse(tmp_path: Path, name: str) -> None:
    data = DAMAGED[name]
    assert isinstance(structure_problem(name, io.BytesIO(data), trust=False), str)
    store = open_store(str(tmp_path))
    (tmp_path / name).write_bytes(data)
    report = store.adopt()
    assert report.adopted == () and set(report.rejected) == {name}, report
    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    (folder / name).write_bytes(data)
    (folder / "config.json").write_bytes(b"{}")
    report = store.adopt("checkpoint-7")
    assert report.adopted == () and report.rejected["checkpoint-7"].startswith(name), report
    assert store.list() == []


def _valid_files() -> dict[str, bytes]:
    return {
        "model.safetensors": _safetensors(
            {
                "__metadata__": {"format": "pt"},
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
            }
        ),
        "model.pt": _zip_bytes(),
        "model64.pt": _zip_bytes(force_zip64=True),
        "config.json": json.dumps({"a": [1, 2, {"b": None}], "c": "d"}).encode(),
    }


VALID = _valid_files()


@pytest.mark.parametrize("name", sorted(VALID))
def test_adopt_parsers_pass_the_valid_files_the_fuzzing_starts_from(name: str) -> None:
    assert structure_problem(name, io.BytesIO(VALID[name]), trust=False) is None


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(sorted(VALID)),
    cut=st.floats(min_value=0, max_value=1),
    flips=st.lists(st.tuples(st.floats(min_value=0, max_value=1), st.integers(1, 255)), max_size=4),
)
def test_adopt_parsers_answer_typed_for_truncated_and_flipped_files(
    name: str, cut: float, flips: list[tuple[float, int]]
) -> None:
    data = bytearray(VALID[name])
    for where, xor in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= xor
    damaged = bytes(data[: int(cut * len(data))] if cut < 1 else data)
    answer = structure_problem(name, io.BytesIO(damaged), trust=False)
    assert answer is None or isinstance(answer, str)
    if not flips and len(damaged) < len(VALID[name]):
        assert answer is not None  # a truncated file is never adopted


# -- special files as put sources ---------------------------------------------------------------
@pytest.mark.usefixtures("unblock_fifos")
def test_a_fifo_or_a_device_as_put_source_is_refused_without_blocking(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    fifo = tmp_path / "source.fifo"
    mkfifo(fifo)
    with pytest.raises(ConfigurationError, match="not a regular file"):
        returns(lambda: store.put_file("a.bin", fifo))
    link = tmp_path / "link"
    link.symlink_to(fifo)  # a symlink to one is one too
    with pytest.raises(ConfigurationError, match="not a regular file"):
        returns(lambda: store.put_file("a.bin", link))
    with pytest.raises(ConfigurationError, match="not a regular file"):
        returns(lambda: store.put_file("a.bin", "/dev/zero"))  # would never end
    assert store.list() == []
    regular = tmp_path / "regular.bin"
    regular.write_bytes(b"payload")
    assert store.put_file("a.bin", regular).size == 7
    assert store.read_bytes("a.bin") == b"payload"


# -- checks on a read-only mount ------------------------------------------------------------------
@pytest.fixture
def read_only_view(tmp_path: Path) -> Any:
    """``(rw, ro)``: a store folder and a read-only bind mount of it (unmounted after)."""
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    mounted = False

    def mount() -> Path:
        nonlocal mounted
        subprocess.run(["mount", "--bind", str(rw), str(ro)], check=True)
        mounted = True
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        return ro

    try:
        yield rw, mount
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=False)


@pytest.mark.parametrize("lock_file", [True, False], ids=["lock-file", "no-lock-file"])
def test_a_damaged_artifact_on_a_read_only_mount_is_an_integrity_error(
    read_only_view: Any, lock_file: bool
) -> None:
    rw, mount = read_only_view
    writer = open_store(str(rw))
    writer.put_bytes("a.bin", b"hello world")
    writer.put_bytes("b.bin", b"whole")
    writer.put_bytes("c.bin", b"to be cut short")
    with open(rw / "a.bin", "r+b") as f:
        f.write(b"J")  # same size, other bytes
    os.truncate(rw / "c.bin", 3)
    lock = rw / ".commitstore" / "lock"
    assert lock.exists()
    if not lock_file:
        lock.unlink()
    ro = mount()
    with pytest.raises(OSError) as refused:
        (ro / "x").write_bytes(b"")
    assert refused.value.errno == errno.EROFS
    store = open_store(str(ro))
    statuses = {r.name: r.status for r in store.verify().results}
    assert statuses == {"a.bin": "hash_mismatch", "b.bin": "ok", "c.bin": "size_mismatch"}
    assert store.verify("a.bin").results[0].status == "hash_mismatch"
    for name, status in (("a.bin", "hash_mismatch"), ("c.bin", "size_mismatch")):
        with pytest.raises(IntegrityError) as err:
            store.read_bytes(name)
        assert err.value.status == status
        with pytest.raises(IntegrityError):
            store.open(name)
        with pytest.raises(IntegrityError):
            store.get_file(name, rw.parent / f"out-{name}")
        assert not (rw.parent / f"out-{name}").exists()
    assert store.read_bytes("b.bin") == b"whole"
    latest = store.latest()
    assert latest is not None and latest.name == "b.bin"
    assert lock.exists() == lock_file  # nothing created
    if lock_file:  # the read-only mount's check still excludes a writer of the rw mount
        with store._backend.read_lock():
            fd = os.open(lock, os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)


# -- a storage state is a storage error, not a name error ------------------------------------------
def test_a_symlinked_folder_or_a_file_on_a_path_is_a_storage_error(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    store = open_store(str(root))
    store.put_bytes("file", b"an artifact")
    os.symlink(outside, root / "link")
    (root / "plain").write_bytes(b"put there by another tool")
    calls: dict[str, tuple[Callable[[], object], int]] = {
        "put link/a": (lambda: store.put_bytes("link/a", b"x"), errno.ELOOP),
        "put plain/a": (lambda: store.put_bytes("plain/a", b"x"), errno.ENOTDIR),
    }
    for what, (call, code) in calls.items():
        with pytest.raises(StorageError) as err:
            call()
        assert err.value.errno == code, what
        assert isinstance(err.value, StoragePathError), what
    with pytest.raises(StorageError) as err, store.stage_dir("link/deeper/x") as d:
        (d / "f").write_bytes(b"x")
    assert err.value.errno == errno.ELOOP
    # names alone are still InvalidNameError, and never a StorageError
    with pytest.raises(InvalidNameError) as bad:
        store.put_bytes("../escape", b"x")
    assert not isinstance(bad.value, StorageError)
    assert list(outside.iterdir()) == []
    assert store.read_bytes("file") == b"an artifact"


# -- option validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        {"readback": "maybe"},
        {"readback": 1},
        {"readback": None},
        {"strategy": "fast"},
        {"strategy": True},
    ],
    ids=repr,
)
def test_local_storage_options_are_strict_before_any_io(tmp_path: Path, options: Any) -> None:
    root = tmp_path / "never"
    (key,) = options
    with pytest.raises(ConfigurationError, match=f"storage option {key} must"):
        open_store(str(root), **options)
    assert not root.exists()


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("s3://bucket/p", {"part_size": True}),
        ("s3://bucket/p", {"max_inflight": "4"}),
        ("s3://bucket/p", {"conditional_writes": "yes"}),
        ("s3://bucket/p", {"sign_payload": 0}),
        ("gs://bucket/p", {"chunk_size": 2.5}),
        ("gs://bucket/p", {"conditional_writes": 1}),
        ("az://container/p", {"max_inflight": False}),
        ("az://container/p", {"client_options": ["retry_total"]}),
        ("smb://host/share/p", {"readback": "maybe"}),
        ("smb://host/share/p", {"port": True}),
        ("smb://host/share/p", {"timeout": float("nan")}),
        ("webdav+http://host/p", {"verify": 0}),
        ("sftp://host/p", {"readback": "false"}),
    ],
    ids=repr,
)
def test_remote_storage_options_are_strict(url: str, options: Any) -> None:
    (key,) = options
    with pytest.raises(ConfigurationError, match=f"storage option {key} must"):
        open_store(url, **options)  # refused before the factory connects to anything


def test_bools_are_not_numbers_nor_numbers_bools(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    store.put_bytes("a.bin", b"kept")
    calls: dict[str, Callable[[], object]] = {
        "prune min_age=True": lambda: store.prune(keep_last=0, min_age=True),
        "prune dry_run='yes'": lambda: store.prune(keep_last=0, min_age=0, dry_run="yes"),  # type: ignore[arg-type]
        "gc min_age=False": lambda: store.gc(min_age=False),
        "gc dry_run=1": lambda: store.gc(dry_run=1),  # type: ignore[arg-type]
        "adopt trust='no'": lambda: store.adopt(trust="no"),  # type: ignore[arg-type]
        "put overwrite='no'": lambda: store.put_bytes("a.bin", b"new", overwrite="no"),
        "sync repair=1": lambda: store.sync(repair=1),  # type: ignore[arg-type]
        "Retention min_age=True": lambda: Retention(keep_last=1, min_age=True),
    }
    for what, call in calls.items():
        with pytest.raises(ConfigurationError):
            call()
            pytest.fail(what)
    assert store.read_bytes("a.bin") == b"kept"
    assert [r.name for r in store.list()] == ["a.bin"]
    # the valid forms still work
    assert store.prune(keep_last=1, min_age=0.0, dry_run=False).targets
    assert store.gc(min_age=0, dry_run=True).dry_run


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(sorted(VALID)),
    cut=st.floats(min_value=0, max_value=1),
    flips=st.lists(st.tuples(st.floats(min_value=0, max_value=1), st.integers(1, 255)), max_size=3),
)
def test_adopt_of_fuzzed_files_reports_or_adopts_through_a_real_store(
    tmp_path: Path, name: str, cut: float, flips: list[tuple[float, int]]
) -> None:
    data = bytearray(VALID[name])
    for where, xor in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= xor
    damaged = bytes(data[: int(cut * len(data))] if cut < 1 else data)
    folder = f"f{time.monotonic_ns()}"
    (tmp_path / folder).mkdir()
    (tmp_path / folder / name).write_bytes(damaged)
    store = open_store(str(tmp_path))
    report = store.adopt(f"{folder}/{name}")
    assert len(report.adopted) + len(report.rejected) == 1
    if report.adopted:
        assert store.verify(f"{folder}/{name}").ok


def test_a_checks_lock_excludes_writers_and_creates_nothing(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with open_store(str(fresh))._backend.read_lock():
        pass
    assert list(fresh.iterdir()) == []  # no .commitstore, no lock file
    store = open_store(str(tmp_path / "s"))
    store.put_bytes("a.bin", b"x")
    lock = tmp_path / "s" / ".commitstore" / "lock"
    with store._backend.read_lock():
        fd = os.open(lock, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
