"""S3 strategy against two independent S3 servers on 127.0.0.1: moto and ``rclone serve s3``.

The backdoor is boto3 (the reference client), never s3fs or commitstore.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import AlreadyExistsError, CommitError, ConfigurationError, open_store
from commitstore.testing import (
    S3Backdoor,
    StoreConformance,
    Target,
    pending_paths,
    record_path,
    xxh,
)

from .helpers.faultproxy import (
    FaultProxy,
    check_persistent_fault,
    check_transient_fault,
    through_proxy,
)
from .helpers.recordcache import check_record_cache
from .helpers.s3servers import BUCKET, MotoServer, RcloneS3, S3Server

MiB = 1024 * 1024
ROOT_DIR = Path(__file__).resolve().parent.parent


def make_target(server: S3Server, **options: object) -> Target:
    prefix = f"t{time.monotonic_ns()}"
    # Small parts and single-PUT limit, so that test-sized artifacts exercise multipart uploads.
    opts = {**server.options(), "part_size": 5 * MiB, "single_put_max": 5 * MiB, **options}
    url = server.url(prefix)
    return Target(
        open_store(url, **opts),
        S3Backdoor(server.client(), BUCKET, prefix),
        lambda: open_store(url, **opts),
    )


def pending(t: Target) -> list[dict[str, object]]:
    """Multipart uploads neither completed nor aborted under the target's prefix."""
    assert isinstance(t.door, S3Backdoor)
    return t.door.pending_uploads()


class TestMotoConformance(StoreConformance):
    @pytest.fixture
    def target(self, moto: MotoServer) -> Target:
        return make_target(moto)


class TestRcloneConformance(StoreConformance):
    @pytest.fixture
    def target(self, rclone: RcloneS3) -> Target:
        return make_target(rclone)


@pytest.fixture(params=["moto", "rclone"])
def s3(request: pytest.FixtureRequest) -> tuple[S3Server, Target]:
    server: S3Server = request.getfixturevalue(request.param)
    return server, make_target(server)


def test_conditional_writes_are_probed_not_assumed(moto: MotoServer, rclone: RcloneS3) -> None:
    for server, expected in ((moto, True), (rclone, False)):
        t = make_target(server)
        t.store.put_bytes("step_1", b"x")  # overwrite=False: needs the capability
        assert t.store.describe()["conditional_writes"] is expected


def test_multipart_upload_is_the_commit(s3: tuple[S3Server, Target]) -> None:
    server, t = s3
    data = os.urandom(23 * MiB + 5)
    st = t.store.stage("big/step_0007.pt")
    for i in range(0, len(data), 3 * MiB):
        st.write(data[i : i + 3 * MiB])
        assert t.door.read("big/step_0007.pt") is None
    assert len(S3Backdoor(server.client(), BUCKET, "").pending_uploads()) >= 1
    rec = st.commit()
    assert t.door.read("big/step_0007.pt") == data
    assert rec.digest == xxh(data)
    assert pending(t) == []


def test_exception_mid_stage_leaves_nothing(s3: tuple[S3Server, Target]) -> None:
    _, t = s3
    with pytest.raises(RuntimeError), t.store.stage("step_0009.pt") as st:
        st.write(os.urandom(12 * MiB))
        raise RuntimeError("training crashed mid-save")
    assert t.door.files() == []
    assert pending(t) == []


def test_two_writers_create_only_exactly_one_wins(moto: MotoServer) -> None:
    t = make_target(moto)
    results: list[str] = []
    barrier = threading.Barrier(2)
    payloads = [b"A" * 7 * MiB, b"B" * 7 * MiB]

    def writer(i: int) -> None:
        store = t.reopen()
        st = store.stage("race.bin")
        st.write(payloads[i])
        barrier.wait()
        try:
            st.commit()
            results.append(f"won{i}")
        except AlreadyExistsError:
            results.append("lost")

    threads = [threading.Thread(target=writer, args=(i,)) for i in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(results)[0] == "lost"
    winner = int(next(r for r in results if r.startswith("won"))[-1])
    assert t.door.read("race.bin") == payloads[winner]
    assert pending(t) == []


def test_sigkill_mid_upload_publishes_nothing(s3: tuple[S3Server, Target]) -> None:
    """A writer SIGKILLed mid-upload publishes nothing. It reaches the server through a proxy
    that slows each forwarded chunk, and is killed once a part has landed: the upload is in
    flight when the kill comes (unslowed, a fast server took the rest of the parts and the
    completion in the time the test took to look)."""
    server, t = s3
    t.store.put_bytes("step_0001.pt", b"whole")
    slow = FaultProxy(server.port)
    # each of the (up to 4) connections ~1.3 MiB/s: the first parts (5 MiB, the smallest S3
    # takes) land after ~4 s, the second round of parts needs as long again, which is the
    # window for the kill
    slow.set(delay=0.05, faulty=None)
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.writer",
                t.store.url,
                "step_0002.pt",
                "1",
                str(64 * MiB),
            ],
            cwd=ROOT_DIR,
            stdout=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                **server.env(),
                "AWS_ENDPOINT_URL": slow.endpoint,
                "WRITER_STORE_OPTIONS": json.dumps(
                    {"single_put_max": 5 * MiB, "part_size": 5 * MiB, "endpoint_url": slow.endpoint}
                ),
            },
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        assert isinstance(t.door, S3Backdoor)
        deadline = time.monotonic() + 60
        landed = 0
        while time.monotonic() < deadline and not landed:  # mid-upload: a part has landed
            ups = pending(t)
            if ups:
                landed = t.door.parts_uploaded(str(ups[0]["Key"]), str(ups[0]["UploadId"]))
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert landed, "no part landed within 60 s"

        proc.wait(30)
    finally:
        slow.stop(cut=True)  # the dead writer's bytes queued in the proxy go nowhere
    assert t.door.read("step_0002.pt") is None
    assert t.door.read(record_path("step_0002.pt")) is None
    assert len(pending(t)) == 1  # left for gc / the bucket lifecycle rule
    # The writer's pending record may or may not be there, depending on how far the upload
    # got before the kill: gc takes it away too.
    had_intent = bool(pending_paths(t.door, "step_0002.pt"))
    latest = t.reopen().latest()
    assert latest is not None
    assert latest.name == "step_0001.pt"
    # gc aborts that upload, and never one under a sibling prefix ("t123x" next to "t123").
    sibling = t.door.client.create_multipart_upload(Bucket=BUCKET, Key=t.door.prefix + "x/other")
    assert t.reopen().gc().removed == ()  # younger than an hour
    report = t.reopen().gc(min_age=0)
    removed = [(i.kind, i.path.rsplit("/", 1)[1]) for i in report.removed]
    assert [r for r in removed if r[0] != "pending"] == [("upload", "step_0002.pt")]
    assert {r for r in removed if r[0] == "pending"} == (
        {("pending", ".commitstore.new.step_0002.pt.json")} if had_intent else set()
    )
    assert pending(t) == []
    assert pending_paths(t.door, "step_0002.pt") == []
    others = t.door.client.list_multipart_uploads(Bucket=BUCKET, Prefix=t.door.prefix + "x/")
    assert [u["UploadId"] for u in others.get("Uploads", [])] == [sibling["UploadId"]]
    t.door.client.abort_multipart_upload(
        Bucket=BUCKET, Key=t.door.prefix + "x/other", UploadId=sibling["UploadId"]
    )


@pytest.fixture
def proxied(moto: MotoServer) -> Iterator[tuple[Target, FaultProxy]]:
    # One store throughout: the first put (through_proxy's) also runs the conditional-write probe.
    with through_proxy(moto.port, lambda proxy: _via(proxy, moto)) as pair:
        yield pair


def _via(proxy: FaultProxy, server: S3Server, **options: object) -> Target:
    """A target on ``server`` whose store talks through ``proxy``; ``reopen`` returns it again."""
    prefix = f"p{time.monotonic_ns()}"
    opts: dict[str, Any] = {
        **server.options(),
        "endpoint_url": proxy.endpoint,
        "part_size": 5 * MiB,
        "single_put_max": 5 * MiB,
        **options,
    }
    store = open_store(server.url(prefix), **opts)
    return Target(store, S3Backdoor(server.client(), BUCKET, prefix), lambda: store)


@pytest.mark.parametrize("fault", ["cut_after", "reset_after"])
def test_transient_network_faults_are_retried(
    proxied: tuple[Target, FaultProxy], fault: str
) -> None:
    t, proxy = proxied
    check_transient_fault(t, proxy, fault, size=17 * MiB, at=2 * MiB)
    assert pending(t) == []


def test_persistent_network_fault_is_unavailable_and_publishes_nothing(
    proxied: tuple[Target, FaultProxy],
) -> None:
    t, proxy = proxied
    check_persistent_fault(t, proxy, size=12 * MiB, at=1 * MiB)
    assert pending(t) == []  # the abort is small enough to get through


@pytest.mark.parametrize("sign_payload", [False, True])
def test_bytes_corrupted_in_transit_are_refused(rclone: RcloneS3, sign_payload: bool) -> None:
    """One bit flipped on the wire, past TCP's checksum: the Content-MD5 every body carries (with
    or without a signed SHA-256) lets the server refuse it. ``rclone serve s3`` checks the MD5 and
    not the signed hash (which alone let a garbled body through); moto checks neither."""
    with through_proxy(rclone.port, lambda p: _via(p, rclone, sign_payload=sign_payload)) as (
        t,
        proxy,
    ):
        store, door = t.store, t.door
        for name, size in (("single.bin", 3 * MiB), ("multipart.bin", 12 * MiB)):
            proxy.set(flip_every=1 * MiB, faulty=None)
            with pytest.raises(CommitError):
                store.put_bytes(name, os.urandom(size))
            proxy.clear()
            assert door.read(name) is None
            assert door.read(record_path(name)) is None
        # Corrupted once: the retry sends the same bytes, intact.
        data = os.urandom(3 * MiB)
        proxy.set(flip_every=1 * MiB, flips=1, faulty=None)
        rec = store.put_bytes("retried.bin", data)
        assert proxy.flips == 0
        assert door.read("retried.bin") == data
        assert rec.digest == xxh(data)


def test_sign_payload_must_be_a_bool(moto: MotoServer) -> None:
    with pytest.raises(ConfigurationError, match="sign_payload"):
        open_store(moto.url("x"), **moto.options(), sign_payload="yes")


def test_record_cache_replaces_one_get_per_record(s3: tuple[S3Server, Target]) -> None:
    check_record_cache(s3[1])


def test_single_put_up_to_the_limit_then_multipart(s3: tuple[S3Server, Target]) -> None:
    server, _ = s3
    t = make_target(server, single_put_max=12 * MiB)
    t.store.put_bytes("small.bin", b"s" * (12 * MiB))
    t.store.put_bytes("large.bin", b"l" * (12 * MiB + 1))
    assert isinstance(t.door, S3Backdoor)
    client, prefix = server.client(), t.door.prefix
    small = client.head_object(Bucket=BUCKET, Key=f"{prefix}/small.bin")
    large = client.head_object(Bucket=BUCKET, Key=f"{prefix}/large.bin")
    if server.name == "moto":  # rclone serve s3 stores files and gives every object an MD5 ETag
        assert "-" not in small["ETag"], "at most single_put_max: one PutObject"
        assert large["ETag"].strip('"').endswith("-3"), "past it: multipart, 5 MiB parts"
    assert small["ContentLength"] == 12 * MiB
    assert pending(t) == []
    assert t.door.read("large.bin") == b"l" * (12 * MiB + 1)


def _log_calls(t: Target) -> list[tuple[str, str]]:
    """(method, key) of every S3 call the store's backend makes from now on, in order."""
    fs: Any = t.store._backend.fs  # type: ignore[attr-defined]
    calls: list[tuple[str, str]] = []
    sync_call, async_call = fs.call_s3, fs._call_s3

    def counted(method: str, *a: Any, **k: Any) -> Any:
        calls.append((method, str(k.get("Key", ""))))
        return sync_call(method, *a, **k)

    async def counted_async(method: str, *a: Any, **k: Any) -> Any:
        calls.append((method, str(k.get("Key", ""))))
        return await async_call(method, *a, **k)

    fs.call_s3, fs._call_s3 = counted, counted_async
    return calls


@pytest.mark.parametrize("size", [3 * MiB, 6 * MiB + 1], ids=["one-put", "multipart"])
def test_completion_etag_of_the_sent_md5s_replaces_the_head(
    s3: tuple[S3Server, Target], size: int
) -> None:
    """Both servers answer the completion with the ETag derived from the bodies' MD5s (each one
    checked by the server against its Content-MD5), so a replace needs no HEAD of the object
    afterwards; create-only, where the server honours it, still HEADs (it also detects a writer
    that replaced the object right after)."""
    _server, t = s3
    data = os.urandom(size)
    calls = _log_calls(t)
    t.store.put_bytes("a.bin", data, overwrite=True)
    key = f"{t.door.prefix}/a.bin"  # type: ignore[attr-defined]
    assert [m for m, k in calls if k == key and m != "upload_part"] in (
        ["put_object"],
        ["create_multipart_upload", "complete_multipart_upload"],
    ), calls
    assert t.door.read("a.bin") == data
    calls.clear()
    t.store.put_bytes("b.bin", data)
    after = [m for m, k in calls if k == f"{t.door.prefix}/b.bin"]  # type: ignore[attr-defined]
    last = max(i for i, m in enumerate(after) if m in ("put_object", "complete_multipart_upload"))
    honoured = bool(t.store.describe()["conditional_writes"])
    assert ("head_object" in after[last:]) is honoured, after
    assert t.door.read("b.bin") == data


def test_an_unattested_completion_is_checked_with_a_head(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose completion ETag does not follow S3's MD5 convention (KMS-encrypted
    buckets, some gateways) gets the fresh HEAD: the sink falls back to stating the object."""
    from commitstore.backends.object.s3.upload import S3Upload

    monkeypatch.setattr(S3Upload, "attested", lambda self, written: False)
    t = make_target(moto)
    calls = _log_calls(t)
    data = os.urandom(6 * MiB + 1)
    t.store.put_bytes("a.bin", data, overwrite=True)
    key = f"{t.door.prefix}/a.bin"  # type: ignore[attr-defined]
    assert [m for m, k in calls if k == key and m != "upload_part"][-2:] == [
        "complete_multipart_upload",
        "head_object",
    ]
    assert t.door.read("a.bin") == data


@pytest.mark.parametrize(
    "size", [3 * MiB, 6 * MiB + 1, 17 * MiB + 3], ids=["one-put", "held-part", "parts"]
)
def test_body_md5s_are_computed_while_the_bodies_fill(
    s3: tuple[S3Server, Target], size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink hashes each body (whole object, the held buffer that becomes the first part,
    parts filled from writes) as it fills it, so nothing is hashed between the last write and
    the send. Writes straddle part boundaries; ``rclone serve s3`` refuses a body whose
    Content-MD5 does not match, and the completion ETag still attests the object."""
    from commitstore.backends.object.s3 import upload as s3upload

    def hashed_at_send(body: object) -> bytes:
        raise AssertionError("a body's MD5 was computed at send time")

    monkeypatch.setattr(s3upload, "body_md5", hashed_at_send)
    _server, t = s3
    data = os.urandom(size)
    calls = _log_calls(t)
    with t.store.stage("a.bin", overwrite=True) as st:
        for at in range(0, size, MiB + 7):
            st.write(data[at : at + MiB + 7])
    key = f"{t.door.prefix}/a.bin"  # type: ignore[attr-defined]
    assert "head_object" not in [m for m, k in calls if k == key], "completion not attested"
    assert t.door.read("a.bin") == data
