"""commitstore.torch and store.fetch: torch.save into one commit, verified loads that read the
artifact once (counted at the server for S3), mmap of a verified local copy cached by digest, on a
local, an S3 (moto through the counting proxy) and an SMB (Samba) store; and ``import commitstore``
never importing the frameworks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import commitstore.torch as cs_torch
from commitstore import (
    CommitStore,
    CommitStoreError,
    ConfigurationError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
    open_store,
)
from commitstore.backends import PutMode
from commitstore.digest import digest_bytes

from .helpers.faultproxy import FaultProxy
from .helpers.s3servers import MotoServer
from .helpers.samba import PASSWORD, SambaServer

MiB = 1024 * 1024
torch.set_num_threads(1)


def _state(seed: int, n: int = 64 * 1024) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g), "step": seed}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["step"] == b["step"] and bool(torch.equal(a["w"], b["w"]))


@pytest.fixture(scope="module")
def samba(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SambaServer]:
    server = SambaServer(tmp_path_factory.mktemp("samba"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    p = FaultProxy(moto.port)
    try:
        yield p
    finally:
        p.stop()


def _s3(moto: MotoServer, proxy: FaultProxy) -> CommitStore:
    opts = {**moto.options(), "endpoint_url": proxy.endpoint}
    return open_store(moto.url(f"t{time.monotonic_ns()}"), **opts)


def _stores(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> CommitStore:
    if kind == "local":
        return open_store(tmp_path / "store")
    if kind == "s3":
        return _s3(request.getfixturevalue("moto"), request.getfixturevalue("proxy"))
    samba: SambaServer = request.getfixturevalue("samba")
    return open_store(samba.url(f"t{time.monotonic_ns()}"), password=PASSWORD)


@pytest.mark.parametrize("kind", ["local", "s3", "smb"])
def test_save_then_load_mmap_newest_that_verifies(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = _stores(kind, tmp_path, request)
    cache = tmp_path / "cache"
    for step in (100, 200):
        rec = cs_torch.save(_state(step), store, f"ckpt/model-step{step}-bf16.pt")
        assert rec.step == step
    loaded, rec = cs_torch.load_with_record(store, mmap=True, cache_dir=cache)
    assert rec.name == "ckpt/model-step200-bf16.pt" and _same(loaded, _state(200))
    # The newest is damaged (same size): skipped with a warning, the next one loads.
    cs_torch.save(_state(300), store, "ckpt/model-step300-bf16.pt")
    raw = bytearray(store.read_bytes("ckpt/model-step300-bf16.pt"))
    raw[len(raw) // 2] ^= 0xFF
    _overwrite_raw(store, "ckpt/model-step300-bf16.pt", bytes(raw))
    loaded, rec = cs_torch.load_with_record(store, mmap=True, cache_dir=cache)
    assert rec.step == 200 and _same(loaded, _state(200))
    with pytest.raises(IntegrityError):
        cs_torch.load(store, "ckpt/model-step300-bf16.pt", mmap=True, cache_dir=cache)
    # Nothing but whole copies in the cache: the two verified versions' files, no staging.
    names = sorted(p.name for p in cache.iterdir())
    assert len(names) == 1, names  # step 200 was fetched once, then found in the cache
    assert names[0].startswith(store.record("ckpt/model-step200-bf16.pt").digest.split(":")[1])
    plain = cs_torch.load(store, "ckpt/model-step100-bf16.pt")
    assert _same(plain, _state(100))


def _overwrite_raw(store: CommitStore, name: str, data: bytes) -> None:
    """Replace the artifact's bytes behind the store's back (bit rot), keeping its record."""
    sink = store._backend.open_sink(tuple(name.split("/")), mode=PutMode.REPLACE)
    sink.write(memoryview(data))
    sink.publish(size=len(data), digest=digest_bytes(data))


def test_s3_resume_reads_the_artifact_once(
    moto: MotoServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    store = _s3(moto, proxy)
    size = 3 * MiB
    state = {"w": torch.arange(size // 4, dtype=torch.int32)}
    cs_torch.save({"w": torch.zeros(4)}, store, "step_1.pt")
    rec = cs_torch.save(state, store, "step_2.pt")
    assert rec.size > size
    store.list()  # the record cache is warm: what follows is the resume itself
    before = proxy.served
    loaded = cs_torch.load(store, mmap=True, cache_dir=tmp_path / "cache")
    first = proxy.served - before
    assert torch.equal(loaded["w"], state["w"])
    # One download of the artifact, plus listings and records (a few KiB), not two or three.
    assert rec.size <= first < rec.size + 256 * 1024, (first, rec.size)
    before = proxy.served
    again = cs_torch.load(store, mmap=True, cache_dir=tmp_path / "cache")
    second = proxy.served - before
    assert torch.equal(again["w"], state["w"])
    assert second < 64 * 1024, second  # the cached copy: records only, no artifact bytes
    before = proxy.served
    cs_torch.load(store, "step_2.pt")  # no mmap: one read into memory
    third = proxy.served - before
    assert rec.size <= third < rec.size + 64 * 1024, (third, rec.size)


def test_fetch_caches_by_digest_and_never_caches_bad_bytes(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    cache = tmp_path / "cache"
    store.put_bytes("a.pt", b"x" * 1000)
    path = store.fetch("a.pt", cache)
    assert path.read_bytes() == b"x" * 1000 and path.parent == cache
    assert path.name == f"{store.record('a.pt').digest.split(':')[1]}.1000.pt"
    # A cached file of the wrong size is not trusted: fetched again.
    path.write_bytes(b"short")
    assert store.fetch("a.pt", cache).read_bytes() == b"x" * 1000
    # Same size, other bytes: trusted by name and size, unless rehash=True.
    path.write_bytes(b"y" * 1000)
    assert store.fetch("a.pt", cache).read_bytes() == b"y" * 1000
    assert store.fetch("a.pt", cache, rehash=True).read_bytes() == b"x" * 1000
    # A new version gets a new cache name; damaged data is never cached.
    store.put_bytes("a.pt", b"z" * 1000, overwrite=True)
    (tmp_path / "store" / "a.pt").write_bytes(b"q" * 1000)
    with pytest.raises(IntegrityError):
        store.fetch("a.pt", cache)
    assert sorted(p.name for p in cache.iterdir()) == [path.name]
    # Typed errors, before any I/O.
    with pytest.raises(InvalidNameError):
        store.fetch("../a.pt", cache)
    with pytest.raises(ConfigurationError):
        store.fetch("a.pt", 42)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        store.fetch("missing.pt", cache)
    with store.stage_dir("folder") as d:
        (d / "f").write_bytes(b"f")
    with pytest.raises(ConfigurationError):
        store.fetch("folder", cache)


def test_torch_errors_are_typed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(tmp_path / "store")
    with pytest.raises(ConfigurationError):
        cs_torch.save({"f": lambda: 1}, store, "lambda.pt")
    assert store.list() == []  # a failed pickle publishes nothing
    assert not any(p.name != ".commitstore" for p in (tmp_path / "store").iterdir())
    with pytest.raises(NotFoundError):
        cs_torch.load(store)
    store.put_bytes("notes.txt", b"not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="commitstore"), pytest.raises(NotFoundError):
        cs_torch.load(store)
    assert "notes.txt" in caplog.text
    with pytest.raises(ConfigurationError):
        cs_torch.load(store, "x.pt", mmap="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        cs_torch.load("not a store", "x.pt")  # type: ignore[arg-type]
    # weights_only=True (the default) refuses a pickled class; False loads it.
    cs_torch.save({"p": Path("/x")}, store, "obj.pt")
    with pytest.raises(cs_torch.TorchLoadError, match=r"torch\.load failed"):
        cs_torch.load(store, "obj.pt")
    assert issubclass(cs_torch.TorchLoadError, CommitStoreError)
    assert cs_torch.load(store, "obj.pt", weights_only=False) == {"p": Path("/x")}


def test_importing_commitstore_imports_no_framework(tmp_path: Path) -> None:
    code = """
import json, sys
import commitstore
store = commitstore.open_store(sys.argv[1])
store.put_bytes("step_1.pt", b"x")
store.latest()
print(json.dumps(sorted(m for m in ("torch", "lightning", "transformers", "pytorch_lightning")
                        if m in sys.modules)))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert json.loads(out.stdout) == []
