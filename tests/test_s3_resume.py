"""S3 uploads of a local file that resume after the writer was SIGKILLed (moto, rclone serve s3).

A writer subprocess ``put_file``s a file through a slowed proxy, one part at a time; once the
backdoor lists enough parts the proxy stops forwarding and the writer is killed (no sleep is the
timing). The next ``put_file`` goes through a proxy that counts the bytes sent. Assertions read
the bucket through the backdoor (boto3).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store
from commitstore.testing import S3Backdoor, Target, record_path

from .helpers.faultproxy import FaultProxy
from .helpers.s3servers import BUCKET, S3Server

MiB = 1024 * 1024
ROOT_DIR = Path(__file__).resolve().parent.parent
SIZE = 30 * MiB
PART = 5 * MiB
PARTS = SIZE // PART
LANDED = 5  # the kill comes once 5 of the 6 parts landed (~83%)
OVERHEAD = 2 * MiB  # requests' headers, the state, the record, the pending records
NAME = "run/step_0007.pt"
STATE_DIR = ".commitstore/resume/"


def make_target(server: S3Server, endpoint: str | None = None) -> tuple[Target, dict[str, Any]]:
    prefix = f"t{time.monotonic_ns()}"
    opts: dict[str, Any] = {**server.options(), "part_size": PART, "single_put_max": PART}
    url = server.url(prefix)
    return (
        Target(
            open_store(url, **opts),
            S3Backdoor(server.client(), BUCKET, prefix),
            lambda: open_store(url, **opts),
        ),
        opts,
    )


@pytest.fixture(params=["moto", "rclone"])
def s3(request: pytest.FixtureRequest) -> tuple[S3Server, Target]:
    server: S3Server = request.getfixturevalue(request.param)
    return server, make_target(server)[0]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "source.bin"
    path.write_bytes(os.urandom(SIZE))
    return path


def door(t: Target) -> S3Backdoor:
    assert isinstance(t.door, S3Backdoor)
    return t.door


def uploads(t: Target) -> list[dict[str, Any]]:
    return door(t).pending_uploads()


def states(t: Target) -> list[str]:
    return [f for f in door(t).files() if f.startswith(STATE_DIR)]


def kill_mid_upload(server: S3Server, t: Target, src: Path) -> dict[str, Any]:
    """Run a ``put_file`` writer of ``src`` as ``NAME`` through a slowed proxy, one part at a
    time; once ``LANDED`` parts are on the server the proxy stops forwarding and the writer is
    SIGKILLed. Returns the unfinished upload (nothing was published)."""
    slow = FaultProxy(server.port)
    slow.set(delay=0.005, faulty=None)
    options = {"part_size": PART, "single_put_max": PART, "max_inflight": 1}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.putwriter", t.store.url, NAME, str(src)],
            cwd=ROOT_DIR,
            stdout=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                **server.env(),
                "AWS_ENDPOINT_URL": slow.endpoint,
                "WRITER_STORE_OPTIONS": json.dumps({**options, "endpoint_url": slow.endpoint}),
            },
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + 60
            landed = 0
            while time.monotonic() < deadline and landed < LANDED and proc.poll() is None:
                ups = uploads(t)
                if ups:
                    landed = door(t).parts_uploaded(str(ups[0]["Key"]), str(ups[0]["UploadId"]))
                time.sleep(0.02)
            slow.freeze()  # nothing more reaches the server
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        assert landed >= LANDED, f"only {landed} parts landed"
    finally:
        slow.stop()
    assert door(t).read(NAME) is None
    assert door(t).read(record_path(NAME)) is None
    (up,) = uploads(t)
    assert door(t).parts_uploaded(str(up["Key"]), str(up["UploadId"])) < PARTS
    assert len(states(t)) == 1
    return up


def put_counted(
    server: S3Server,
    t: Target,
    src: Path,
    *,
    keep: Sequence[dict[str, Any]] = (),
) -> int:
    """``put_file`` of ``src`` as ``NAME`` in this process, through a proxy that counts the
    bytes sent; returns them. The commit is byte-identical to ``src`` and verifies in full; the
    uploads ``keep`` (none by default) are the only ones left pending, and no state is left."""
    proxy = FaultProxy(server.port)
    try:
        opts = {**server.options(), "part_size": PART, "single_put_max": PART}
        store = open_store(t.store.url, **{**opts, "endpoint_url": proxy.endpoint})
        record = store.put_file(NAME, src, overwrite=True)
        assert record.size == SIZE
        sent = proxy.received
    finally:
        proxy.stop()
    assert door(t).read(NAME) == src.read_bytes()  # byte-identical to the source
    report = t.reopen().verify(NAME)
    assert report.ok, report
    assert sorted(u["UploadId"] for u in uploads(t)) == sorted(u["UploadId"] for u in keep)
    assert states(t) == []
    return sent


def test_resume_sends_only_the_missing_parts(s3: tuple[S3Server, Target], source: Path) -> None:
    server, t = s3
    kill_mid_upload(server, t, source)
    state = json.loads(door(t).read(states(t)[0]) or b"")
    assert state["key"].endswith(NAME) and state["part_size"] == PART
    sent = put_counted(server, t, source)
    assert sent <= SIZE // 4 + OVERHEAD, f"{sent} bytes sent to resume"


def test_changed_source_starts_over(s3: tuple[S3Server, Target], source: Path) -> None:
    server, t = s3
    kill_mid_upload(server, t, source)
    data = bytearray(source.read_bytes())
    data[PART + 7] ^= 0xFF  # a byte in an uploaded part; the same size
    source.write_bytes(bytes(data))
    sent = put_counted(server, t, source)
    assert sent >= SIZE  # every part sent again
    assert door(t).read(NAME) == bytes(data)


def _garbage(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    return b'{"schema": "commitstore.resume/1", "parts": [tr'


def _edited_parts(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    # a part it took left out, a part the server lacks put in
    listed = {n: md5 for n, md5 in state["parts"].items() if n != "1"}
    state["parts"] = {**listed, str(PARTS): "0" * 32}
    return json.dumps(state).encode()


def _out_of_range(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    state["parts"] = {**state["parts"], "10001": "1" * 32}
    return json.dumps(state).encode()


def _wrong_checksums(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    state["parts"] = dict.fromkeys(state["parts"], "f" * 32)
    return json.dumps(state).encode()


def _other_upload(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    # another name's upload holding the same first part's bytes
    key = f"{door(t).prefix}/other.pt"
    other = door(t).client.create_multipart_upload(Bucket=BUCKET, Key=key)
    body = Path(state["__source"]).read_bytes()[:PART]
    door(t).client.upload_part(
        Bucket=BUCKET, Key=key, UploadId=other["UploadId"], PartNumber=1, Body=body
    )
    state["upload_id"] = other["UploadId"]
    state.pop("__source")
    return json.dumps(state).encode()


@pytest.mark.parametrize(
    "hostile",
    [_garbage, _out_of_range, _edited_parts, _wrong_checksums, _other_upload],
    ids=lambda f: f.__name__,
)
def test_hostile_state_never_commits_bad_bytes(
    s3: tuple[S3Server, Target], source: Path, hostile: Any
) -> None:
    server, t = s3
    up = kill_mid_upload(server, t, source)
    (where,) = states(t)
    state = json.loads(door(t).read(where) or b"")
    state["__source"] = str(source)
    door(t).write(where, hostile(state, server, t))
    other = [u for u in uploads(t) if u["UploadId"] != up["UploadId"]]
    if hostile is _other_upload:
        # the other name's upload is never used nor aborted
        client = door(t).client
        for u in other:
            assert door(t).parts_uploaded(str(u["Key"]), str(u["UploadId"])) == 1
        sent_other = put_counted(server, t, source, keep=[*other, up])
        assert sent_other >= SIZE
        for u in other:
            assert door(t).parts_uploaded(str(u["Key"]), str(u["UploadId"])) == 1
            client.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
        return
    # a state that does not parse names no upload: the killed one stays pending, for gc
    unknown = hostile in (_garbage, _out_of_range)
    sent = put_counted(server, t, source, keep=[up] if unknown else [])
    if hostile is _wrong_checksums:
        assert sent >= SIZE * (LANDED - 1) // PARTS  # the parts it lists are sent again
    if unknown:
        assert sent >= SIZE


def test_gc_removes_the_state_and_aborts_the_upload(
    s3: tuple[S3Server, Target], source: Path
) -> None:
    server, t = s3
    up = kill_mid_upload(server, t, source)
    assert t.reopen().gc().removed == ()  # younger than an hour
    assert len(states(t)) == 1
    report = t.reopen().gc(min_age=0)
    kinds = sorted(i.kind for i in report.removed if i.kind != "pending")
    assert kinds == ["resume", "upload"], report
    assert uploads(t) == []
    assert states(t) == []
    assert up["UploadId"] not in [u["UploadId"] for u in uploads(t)]
    sent = put_counted(server, t, source)  # starts over cleanly
    assert sent >= SIZE


@pytest.fixture(autouse=True)
def _no_leftovers(s3: tuple[S3Server, Target]) -> Iterator[None]:
    yield
    _, t = s3
    for u in uploads(t):
        door(t).client.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
