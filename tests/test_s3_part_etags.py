"""Each part's answer is checked against the MD5 of its body; once a store has seen a part
answered with its MD5, later parts go without ``Content-MD5`` (the server hashes each body once).
Real moto and ``rclone serve s3``; the one wrapper below rewrites answers, never the bytes."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

import fsspec.asyn
import pytest

from commitstore import CommitError, CommitStore, open_store
from commitstore.testing import S3Backdoor, Target, xxh

from .helpers.faultproxy import through_proxy
from .helpers.s3servers import BUCKET, MotoServer, S3Server

MiB = 1024 * 1024


def _target(server: S3Server, endpoint: str | None = None) -> Target:
    prefix = f"pe{time.monotonic_ns()}"
    opts: dict[str, Any] = {
        **server.options(),
        "part_size": 5 * MiB,
        "single_put_max": 5 * MiB,
        "max_inflight": 1,  # parts one after the other: which ones carry Content-MD5 is fixed
    }
    if endpoint is not None:
        opts["endpoint_url"] = endpoint
    store = open_store(server.url(prefix), **opts)
    return Target(store, S3Backdoor(server.client(), BUCKET, prefix), lambda: store)


def _spy(
    store: CommitStore, answer: Callable[[str, dict[str, Any], Any], Any] | None = None
) -> list[tuple[str, bool]]:
    """Record (method, carried Content-MD5) of every body-carrying S3 call of ``store``;
    ``answer`` may rewrite what the server answered (the request is sent unchanged)."""
    fs: Any = store._backend.fs  # type: ignore[attr-defined]
    real = fs._call_s3
    seen: list[tuple[str, bool]] = []

    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        data_key = str(kwargs.get("Key", "")).rsplit("/", 1)[-1].endswith(".bin")
        if method in ("upload_part", "put_object") and data_key:  # not records, caches, probes
            seen.append((method, "ContentMD5" in kwargs))
        if answer is not None:
            kwargs = answer(method, kwargs, None) or kwargs
        got = await real(method, *args, **kwargs)
        return got if answer is None else answer(method, kwargs, got) or got

    fs._call_s3 = call
    fs.call_s3 = lambda method, *a, **kw: fsspec.asyn.sync(fs.loop, call, method, *a, **kw)
    return seen


@pytest.mark.parametrize("name", ["moto", "rclone"])
def test_parts_after_one_md5_answer_go_without_content_md5(
    name: str, request: pytest.FixtureRequest
) -> None:
    server: S3Server = request.getfixturevalue(name)
    t = _target(server)
    seen = _spy(t.store)
    first, second = os.urandom(12 * MiB + 3), os.urandom(11 * MiB)
    t.store.put_bytes("a.bin", first)
    assert seen == [("upload_part", True), ("upload_part", False), ("upload_part", False)]
    seen.clear()
    t.store.put_bytes("b.bin", second)
    assert seen == [("upload_part", False)] * 3
    small = os.urandom(1000)
    seen.clear()
    t.store.put_bytes("c.bin", small)
    assert seen == [("put_object", True)]  # a PutObject is the commit: always checked
    assert t.door.read("a.bin") == first and t.door.read("b.bin") == second
    assert t.store.record("b.bin").digest == xxh(second)
    assert t.store.verify("b.bin", level="full").ok


def test_a_part_garbled_without_content_md5_is_sent_again_checked(moto: MotoServer) -> None:
    """moto checks no Content-MD5, so before parts were checked by their answers a bit flipped
    on the wire was stored and committed; now the part's ETag shows it and it is sent again."""

    with through_proxy(moto.port, lambda p: _target(moto, p.endpoint)) as (t, proxy):
        t.store.put_bytes("warm.bin", os.urandom(6 * MiB))  # a part answered with its MD5
        seen = _spy(t.store)
        data = os.urandom(11 * MiB)
        proxy.set(flip_every=1 * MiB, flips=1, faulty=None)
        rec = t.store.put_bytes("garbled.bin", data)
        assert proxy.flips == 0, "the bit was flipped"
        assert ("upload_part", True) in seen, "the garbled part went again, checked"
        assert t.door.read("garbled.bin") == data
        assert rec.digest == xxh(data)


def test_a_part_stored_garbled_twice_fails_the_commit(moto: MotoServer) -> None:
    with through_proxy(moto.port, lambda p: _target(moto, p.endpoint)) as (t, proxy):
        t.store.put_bytes("warm.bin", os.urandom(6 * MiB))
        proxy.set(flip_every=1 * MiB, faulty=None)
        with pytest.raises(CommitError, match="not the MD5 of the body sent"):
            t.store.put_bytes("garbled.bin", os.urandom(11 * MiB))
        proxy.clear()
        assert t.door.read("garbled.bin") is None


def test_a_server_whose_part_etags_are_not_md5s_gets_content_md5_on_every_part(
    moto: MotoServer,
) -> None:
    """As a KMS-encrypted bucket answers: part ETags that are not the bodies' MD5s (the answers
    are rewritten here, and mapped back in the completion, which the real server checks)."""
    t = _target(moto)
    other: dict[str, str] = {}

    def answer(method: str, kwargs: dict[str, Any], got: Any) -> Any:
        if got is None:  # the request: the completion names the server's own ETags
            if method == "complete_multipart_upload":
                parts = kwargs["MultipartUpload"]["Parts"]
                back = [{**p, "ETag": other[p["ETag"]]} for p in parts]
                return {**kwargs, "MultipartUpload": {"Parts": back}}
            return None
        if method == "upload_part":
            fake = '"' + hashlib.sha256(got["ETag"].encode()).hexdigest()[:32] + '"'
            other[fake] = got["ETag"]
            return {**got, "ETag": fake}
        return None

    seen = _spy(t.store, answer)
    data = os.urandom(11 * MiB)
    t.store.put_bytes("a.bin", data)
    # the first part went twice (the second time checked), then every part carries Content-MD5
    assert seen == [("upload_part", True)] * 4
    assert t.store._backend.part_etags_md5 is False  # type: ignore[attr-defined]
    seen.clear()
    t.store.put_bytes("b.bin", data)
    assert seen == [("upload_part", True)] * 3
    assert t.door.read("a.bin") == data and t.door.read("b.bin") == data
