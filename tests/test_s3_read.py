"""Pipelined ranged reads on S3 (``backends/object/s3/reads.py``), against moto and rclone.

Small ranges (256 KiB, 3 in flight) so that test-sized artifacts cross many range boundaries.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import BackendUnavailableError, CommitStoreError, NotFoundError, open_store
from commitstore.backends.object.s3.backend import S3Backend
from commitstore.backends.object.s3.reads import S3RangedReader

from .helpers.requestproxy import RequestProxy
from .helpers.s3servers import BUCKET, MotoServer, S3Server

MiB = 1024 * 1024
BLOCK = 256 * 1024
READ_OPTS: dict[str, Any] = {"read_part_size": BLOCK, "read_inflight": 3}


@pytest.fixture(params=["moto", "rclone"])
def server(request: pytest.FixtureRequest) -> S3Server:
    got: S3Server = request.getfixturevalue(request.param)
    return got


def _store(server: S3Server, **options: Any) -> Any:
    return open_store(
        server.url(f"r{time.monotonic_ns()}"), **server.options(), **READ_OPTS, **options
    )


def _data(size: int, seed: int = 0) -> bytes:
    return random.Random(size * 2 + seed).randbytes(size)


def _reader(store: Any, name: str) -> S3RangedReader:
    backend = store._backend
    assert isinstance(backend, S3Backend)
    f = backend.open_read(tuple(name.split("/")))
    assert isinstance(f, S3RangedReader)
    return f


SIZES = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK, 7 * BLOCK + 12345]


def test_bytes_and_hash_around_range_boundaries(server: S3Server, tmp_path: Path) -> None:
    store = _store(server)
    for size in SIZES:
        data = _data(size)
        store.put_bytes(f"a{size}", data)
        dest = tmp_path / f"a{size}"
        store.get_file(f"a{size}", dest)
        assert dest.read_bytes() == data, size
        with store.open(f"a{size}") as f:
            assert f.read() == data, size
            # A seek back into the middle, then reads across the next boundary.
            f.seek(max(0, size - BLOCK - 3))
            assert f.read(BLOCK + 1) == data[max(0, size - BLOCK - 3) :][: BLOCK + 1]
        with _reader(store, f"a{size}") as r:
            assert r.requested == 0  # nothing is fetched before the first read
            assert r.read() == data
            assert r.requested == size  # one copy: no range past the end, none twice


def test_bytes_of_a_corrupted_object_fail_the_hash(moto: MotoServer, tmp_path: Path) -> None:
    store = _store(moto)
    data = _data(3 * BLOCK + 5)
    store.put_bytes("c", data)
    key = f"{store._backend.prefix}/c"
    moto.client().put_object(Bucket=BUCKET, Key=key, Body=data[:-1] + b"\0")
    with pytest.raises(CommitStoreError):
        store.get_file("c", tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_overwrite_during_a_pipelined_read_raises_typed(server: S3Server, tmp_path: Path) -> None:
    store = _store(server)
    size = 12 * BLOCK
    old, new = _data(size), _data(size, 1)
    store.put_bytes("o", old)
    key = f"{store._backend.prefix}/o"
    r = _reader(store, "o")
    etag = r.etag
    assert r.read(BLOCK) == old[:BLOCK]
    # The overwrite lands mid-read: part of the object is not requested yet.
    assert r.requested < size
    server.client().put_object(Bucket=BUCKET, Key=key, Body=new)
    assert server.client().head_object(Bucket=BUCKET, Key=key)["ETag"] != etag
    got = bytearray(old[:BLOCK])
    with pytest.raises(NotFoundError, match="replaced while it was read") as info:
        while chunk := r.read(BLOCK):
            got += chunk
    assert info.value.__cause__ is not None
    assert len(got) < size  # no mixed copy was handed out whole
    assert bytes(got) == old[: len(got)]  # and every byte handed out is the old version's
    r.close()

    # Through get_file: the overwrite lands at its first progress report (after the first 8 MiB
    # read of the copy); nothing appears.
    size = 10 * MiB
    old, new = _data(size), _data(size, 1)
    store.put_bytes("p", old)
    pkey = f"{store._backend.prefix}/p"
    landed: list[int] = []

    def overwrite(done: int) -> None:
        if not landed:
            server.client().put_object(Bucket=BUCKET, Key=pkey, Body=new)
            landed.append(done)

    with pytest.raises(NotFoundError, match="replaced while it was read"):
        store.get_file("p", tmp_path / "p", progress=overwrite)
    assert landed and 0 < landed[0] < size
    assert not (tmp_path / "p").exists()


def _threads() -> set[threading.Thread]:
    """Threads other than the request proxy's own (one per connection)."""
    return {t for t in threading.enumerate() if not any(f in t.name for f in ("_serve", "_relay"))}


def _tasks(store: Any) -> set[asyncio.Task[Any]]:
    loop = store._backend.fs.loop

    async def running() -> set[asyncio.Task[Any]]:
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    got: set[asyncio.Task[Any]] = asyncio.run_coroutine_threadsafe(running(), loop).result()
    return got


@pytest.fixture(scope="module")
def proxy(moto: MotoServer) -> Iterator[RequestProxy]:
    p = RequestProxy(moto.port)
    try:
        yield p
    finally:
        p.stop()


def _proxied(moto: MotoServer, proxy: RequestProxy, **extra: Any) -> Any:
    opts = {**moto.options(), **READ_OPTS, "endpoint_url": proxy.endpoint, **extra}
    return open_store(moto.url(f"r{time.monotonic_ns()}"), **opts)


def test_one_copy_counted_at_the_proxy(
    moto: MotoServer, proxy: RequestProxy, tmp_path: Path
) -> None:
    store = _proxied(moto, proxy)
    size = 5 * BLOCK + 777
    data = _data(size)
    store.put_bytes("n", data)
    proxy.count()
    store.get_file("n", tmp_path / "n")
    assert (tmp_path / "n").read_bytes() == data
    gets = [line for line in proxy.log if line.startswith("GET ") and "/n" in line]
    # One GET of the record, then the ranges of the data, each byte once: three of BLOCK, then
    # two of up to a third of the budget (4/3 x BLOCK with 3 in flight): 5.
    ranged = [line for line in gets if "/.commitstore" not in line]
    assert len(ranged) == 5, proxy.log
    assert proxy.relayed >= size
    assert proxy.relayed - size < 64 * 1024, (proxy.relayed, size)  # heads and the record only


def test_a_long_sequential_read_asks_for_fewer_larger_ranges_in_the_same_memory(
    moto: MotoServer, proxy: RequestProxy, tmp_path: Path
) -> None:
    """With 6 ranges in flight, the budget is 7 x BLOCK: the window opens with ranges of BLOCK
    (three: two, and one more once the first is in), then every range consumed in order doubles
    the next ones' length up to a third of the budget (7/3 x BLOCK). A serial server (moto reads
    the whole object per request) pays per request: 20 x BLOCK comes in 3 + 8 = 11 requests, not
    20, each byte once, never more than the budget held."""
    opts = {**moto.options(), "read_part_size": BLOCK, "read_inflight": 6}
    opts["endpoint_url"] = proxy.endpoint
    store = open_store(moto.url(f"r{time.monotonic_ns()}"), **opts)
    size = 20 * BLOCK
    data = _data(size)
    store.put_bytes("long", data)
    proxy.count()
    store.get_file("long", tmp_path / "long")
    assert (tmp_path / "long").read_bytes() == data
    ranged = [line for line in proxy.log if line.startswith("GET ") and "/.commitstore" not in line]
    assert len(ranged) == 11, proxy.log
    assert proxy.relayed - size < 64 * 1024, (proxy.relayed, size)  # each byte once
    with _reader(store, "long") as r:
        assert r.read() == data
        assert r.requested == size
        assert 2 * BLOCK < r.peak_held <= 7 * BLOCK  # larger ranges, in the same memory
        # A seek starts the window again: short ranges for a random-access reader.
        r.seek(3 * BLOCK + 5)
        before = r.requested
        assert r.read(10) == data[3 * BLOCK + 5 :][:10]
        assert r.requested - before == 3 * BLOCK  # two, and one more once the first is in


@pytest.mark.parametrize("how", ["error", "drop"])
def test_failed_range_raises_typed_and_leaves_nothing_running(
    moto: MotoServer,
    proxy: RequestProxy,
    tmp_path: Path,
    how: str,
) -> None:
    store = _proxied(moto, proxy, retries=1)  # one attempt per request (the store's retries)
    store._backend.fs.retries = 1  # s3fs's own retries of a dropped connection, with backoff
    size = 9 * BLOCK
    store.put_bytes("f", _data(size))
    with _reader(store, "f") as warm:  # the loop and its connections exist before counting
        warm.read(1)
    threads, tasks = _threads(), _tasks(store)
    # Request 1 is the HEAD; request 4 is the third range: it and every later one fail.
    proxy.fail(4, how, sticky=True)
    r = _reader(store, "f")
    got = 0
    with pytest.raises(CommitStoreError) as info:
        while chunk := r.read(BLOCK):
            got += len(chunk)
    r.close()
    assert proxy.hit, ("the fault never fired", info.value, proxy.log)
    proxy.count()
    assert isinstance(info.value, BackendUnavailableError), repr(info.value)
    assert info.value.__cause__ is not None
    assert 0 < got < size
    assert _tasks(store) == tasks  # no request left running on the loop
    assert _threads() == threads  # and no thread started
    with pytest.raises(CommitStoreError):
        proxy.fail(2, how, sticky=True)
        store.get_file("f", tmp_path / "f")
    proxy.count()
    assert not (tmp_path / "f").exists()
    assert _tasks(store) == tasks and _threads() == threads


def test_early_close_cancels_the_ranges_in_flight(moto: MotoServer) -> None:
    store = _store(moto)
    size = 9 * BLOCK
    store.put_bytes("e", _data(size))
    tasks = _tasks(store)
    r = _reader(store, "e")
    r.read(10)
    assert r.requested > BLOCK  # more than the range consumed was in flight
    r.close()
    assert _tasks(store) == tasks
    with pytest.raises(ValueError):
        r.read(1)


def test_read_options_are_checked(moto: MotoServer) -> None:
    from commitstore import ConfigurationError

    for bad in ({"read_part_size": 60000}, {"read_inflight": 0}, {"read_inflight": "4"}):
        with pytest.raises(ConfigurationError):
            open_store(moto.url("x"), **{**moto.options(), **bad})
