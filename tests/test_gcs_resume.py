"""GCS uploads of a local file that resume after the writer was SIGKILLed (fake-gcs-server).

fake-gcs-server puts a proxy's endpoint in its session URIs, so every chunk goes through that
proxy. A writer subprocess ``put_file``s a file through it, slowed, one chunk at a time; once its
resume state says enough chunks were acknowledged and none is in flight, the writer stops there,
the proxy stops forwarding, the writer is SIGKILLed and the proxy closed. (A writer killed with a
chunk in flight, which fake-gcs-server cannot be asked about, starts over:
``tests/test_gcs_resume_races.py``.) The next ``put_file`` goes
through a new proxy on the same port that counts the bytes sent. Assertions read the bucket
through the backdoor (raw JSON API).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitError, open_store
from commitstore.testing import GcsBackdoor, Target, record_path

from .helpers import resumekill
from .helpers.faultproxy import FaultProxy
from .helpers.gcsserver import BUCKET, FakeGcs
from .helpers.resumekill import NAME, ROOT_DIR, random_file, read_state
from .helpers.samba import free_port

MiB = 1024 * 1024
SIZE = 10 * MiB
CHUNK = MiB
CHUNKS = SIZE // CHUNK
LANDED = 8  # the kill comes once 8 of the 10 chunks landed (80%)
OVERHEAD = 1 * MiB  # headers, the state rewrites, the record, the pending records, the probe


class Proxied:
    """fake-gcs-server whose session URIs name a proxy's port (no proxy listens there until
    :meth:`proxy` starts one)."""

    def __init__(self, base: Path) -> None:
        self.proxy_port = free_port()
        self.server = FakeGcs(base, external=f"http://127.0.0.1:{self.proxy_port}")

    def proxy(self) -> FaultProxy:
        return FaultProxy(self.server.port, port=self.proxy_port)

    def options(self) -> dict[str, Any]:
        endpoint = f"http://127.0.0.1:{self.proxy_port}"
        return {**self.server.options(), "endpoint_url": endpoint, "chunk_size": CHUNK}


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    p = Proxied(tmp_path_factory.mktemp("fakegcs-proxied"))
    try:
        yield p
    finally:
        p.server.stop()


@pytest.fixture
def t(proxied: Proxied) -> Target:
    prefix = f"t{time.monotonic_ns()}"
    url = proxied.server.url(prefix)
    return Target(
        None,  # type: ignore[arg-type]  # every store is opened through a proxy, in a test
        GcsBackdoor(proxied.server.endpoint, BUCKET, prefix),
        lambda: open_store(url, **proxied.options()),
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return random_file(tmp_path / "source.bin", SIZE)


def door(t: Target) -> GcsBackdoor:
    assert isinstance(t.door, GcsBackdoor)
    return t.door


def states(t: Target) -> list[str]:
    return resumekill.states(door(t))


def landed(t: Target) -> int:
    """The chunks the resume state says were acknowledged (0 before it exists)."""
    found = states(t)
    data = door(t).read(found[0]) if found else None
    if not data:
        return 0
    sent: int = json.loads(data)["gcs"]["sent"]
    return sent // CHUNK


def kill_mid_upload(
    proxied: Proxied, t: Target, src: Path, before: bytes | None = None
) -> dict[str, Any]:
    """Run a ``put_file`` writer of ``src`` as ``NAME`` through a slowed proxy; right after its
    state says ``LANDED`` chunks were acknowledged (none in flight) the writer stops, the proxy
    stops forwarding, the writer is SIGKILLed and the proxy closed. Returns the state left
    (nothing was published: ``NAME`` still holds ``before``)."""
    slow = proxied.proxy()
    slow.set(delay=0.01, faulty=None)
    url = proxied.server.url(door(t).prefix)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.putwriter", url, NAME, str(src)],
            cwd=ROOT_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "WRITER_STORE_OPTIONS": json.dumps(proxied.options()),
                "WRITER_GCS_AT": f"pause-at-acked:{LANDED}",
            },
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            assert proc.stdout.readline().strip() == "paused"
            slow.freeze()  # nothing more reaches the server
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    finally:
        slow.stop()
    assert landed(t) == LANDED
    assert door(t).read(NAME) == before
    if before is None:
        assert door(t).read(record_path(NAME)) is None
    (where,) = states(t)
    state: dict[str, Any] = json.loads(door(t).read(where) or b"")
    assert state["gcs"]["sent"] == len(state["gcs"]["crc32c"]) * CHUNK  # none in flight
    return state


def put_counted(proxied: Proxied, t: Target, src: Path) -> int:
    """``put_file`` of ``src`` as ``NAME`` in this process, through a proxy that counts the
    bytes sent; returns them. The commit is byte-identical to ``src`` and verifies in full, and
    no state is left."""
    proxy = proxied.proxy()
    try:
        record = t.reopen().put_file(NAME, src, overwrite=True)
        assert record.size == SIZE
        sent = proxy.received
        report = t.reopen().verify(NAME)
        assert report.ok, report
    finally:
        proxy.stop()
    assert door(t).read(NAME) == src.read_bytes()  # byte-identical to the source
    assert states(t) == []
    return sent


def test_resume_sends_only_the_missing_chunks(proxied: Proxied, t: Target, source: Path) -> None:
    state = kill_mid_upload(proxied, t, source)
    assert state["key"].endswith(NAME) and state["part_size"] == CHUNK
    assert state["upload_id"].startswith(f"http://127.0.0.1:{proxied.proxy_port}/upload/")
    sent = put_counted(proxied, t, source)
    assert sent <= SIZE // 4 + OVERHEAD, f"{sent} bytes sent to resume"


def test_changed_source_starts_over(proxied: Proxied, t: Target, source: Path) -> None:
    kill_mid_upload(proxied, t, source)
    data = bytearray(source.read_bytes())
    data[CHUNK + 7] ^= 0xFF  # a byte in an acknowledged chunk; the same size
    source.write_bytes(bytes(data))
    sent = put_counted(proxied, t, source)
    assert sent >= SIZE  # every chunk sent again
    assert door(t).read(NAME) == bytes(data)


def _garbage(state: dict[str, Any], proxied: Proxied, t: Target) -> dict[str, Any] | bytes:
    return b'{"schema": "commitstore.resume/1", "gcs": {"crc32c": [tr'


def _wrong_checksums(state: dict[str, Any], proxied: Proxied, t: Target) -> dict[str, Any]:
    state["gcs"]["crc32c"] = dict.fromkeys(state["gcs"]["crc32c"], "0badc0de")
    return state


def _more_sent(state: dict[str, Any], proxied: Proxied, t: Target) -> dict[str, Any]:
    # claims one more chunk than the server took, with the source's own CRC32C for it
    import google_crc32c

    chunks = state["gcs"]["crc32c"]
    n = state["gcs"]["sent"] // CHUNK + 1
    body = Path(state["__source"]).read_bytes()[(n - 1) * CHUNK : n * CHUNK]
    chunks[str(n)] = google_crc32c.Checksum(body).digest().hex()  # type: ignore[no-untyped-call]
    state["gcs"]["sent"] = n * CHUNK
    return state


def _other_session(state: dict[str, Any], proxied: Proxied, t: Target) -> dict[str, Any]:
    # another name's session, holding the same first chunks' bytes
    other_key = f"{door(t).prefix}/other.pt"
    location = _start_session(proxied, other_key)
    body = Path(state["__source"]).read_bytes()[: state["gcs"]["sent"]]
    _request("PUT", location, body, {"Content-Range": f"bytes 0-{len(body) - 1}/*"})
    state["upload_id"] = location
    return state


def _foreign_host(state: dict[str, Any], proxied: Proxied, t: Target) -> dict[str, Any]:
    # the same session path on another endpoint: never sent to
    state["upload_id"] = state["upload_id"].replace("127.0.0.1", "localhost")
    return state


def _other_chunk_size(state: dict[str, Any], proxied: Proxied, t: Target) -> dict[str, Any]:
    # the same chunks' CRC32Cs, named for chunks of another size
    state["part_size"] = 2 * CHUNK
    state["gcs"]["sent"] = len(state["gcs"]["crc32c"]) * 2 * CHUNK
    return state


def _create_only(state: dict[str, Any], proxied: Proxied, t: Target) -> dict[str, Any]:
    # a session started as create-only is not the one an overwrite resumes
    state["gcs"]["create_only"] = True
    return state


def _start_session(proxied: Proxied, key: str) -> str:
    from urllib.parse import quote

    url = (
        f"{proxied.server.endpoint}/upload/storage/v1/b/{BUCKET}/o"
        f"?uploadType=resumable&name={quote(key, safe='')}"
    )
    headers = _request("POST", url, json.dumps({"name": key}).encode(), {})
    location = str(headers["Location"])
    return location.replace(f":{proxied.proxy_port}/", f":{proxied.server.port}/")


def _request(method: str, url: str, body: bytes, headers: dict[str, str]) -> Any:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.headers
    except urllib.error.HTTPError as exc:  # 308: the chunk was taken
        if exc.code != 308:
            raise
        return exc.headers


@pytest.mark.parametrize(
    "hostile",
    [
        _garbage,
        _wrong_checksums,
        _more_sent,
        _other_session,
        _foreign_host,
        _other_chunk_size,
        _create_only,
    ],
    ids=lambda f: f.__name__,
)
def test_hostile_state_never_commits_bad_bytes(
    proxied: Proxied, t: Target, source: Path, hostile: Any
) -> None:
    kill_mid_upload(proxied, t, source)
    where, state = read_state(door(t), source)
    edited = hostile(state, proxied, t)
    if isinstance(edited, dict):
        edited.pop("__source", None)
        if hostile is _other_session:
            edited["upload_id"] = edited["upload_id"].replace(
                f":{proxied.server.port}/", f":{proxied.proxy_port}/"
            )
        edited = json.dumps(edited).encode()
    door(t).write(where, edited)
    if hostile is _more_sent:
        # fake-gcs-server answers no status query: the offset comes from the state, and the
        # finalisation's check (size and CRC32C of what it holds) refuses the wrong object
        proxy = proxied.proxy()
        try:
            with pytest.raises(CommitError, match="post-upload check failed"):
                t.reopen().put_file(NAME, source, overwrite=True)
        finally:
            proxy.stop()
        assert door(t).read(NAME) is None  # taken back
        assert door(t).read(record_path(NAME)) is None
        assert states(t) == []
    sent = put_counted(proxied, t, source)  # byte-identical, whatever the state said
    assert sent >= SIZE  # nothing the state names is trusted: every chunk sent again
    if hostile is _other_session:
        assert door(t).read("other.pt") is None  # the other name's session was not finalised


def test_gc_removes_the_state(proxied: Proxied, t: Target, source: Path) -> None:
    kill_mid_upload(proxied, t, source)
    proxy = proxied.proxy()
    try:
        assert t.reopen().gc().removed == ()  # younger than an hour
        assert len(states(t)) == 1
        report = t.reopen().gc(min_age=0)
    finally:
        proxy.stop()
    kinds = sorted(i.kind for i in report.removed if i.kind != "pending")
    assert kinds == ["resume"], report
    assert states(t) == []
    sent = put_counted(proxied, t, source)  # starts over cleanly
    assert sent >= SIZE


def test_no_status_query_never_risks_a_committed_object(
    proxied: Proxied, t: Target, source: Path
) -> None:
    """fake-gcs-server answers no status query, so a resume could only take the state's word
    for the offset, checked by the finalisation after it replaced what stood under the name. A
    state claiming a chunk the server never took, over a committed version of the name: the put
    starts over (every chunk sent) and commits the file; the old version was never at risk."""
    proxy = proxied.proxy()
    try:
        t.reopen().put_bytes(NAME, b"the committed version")
    finally:
        proxy.stop()
    kill_mid_upload(proxied, t, source, before=b"the committed version")
    where, state = read_state(door(t), source)
    edited = _more_sent(state, proxied, t)
    edited.pop("__source", None)
    door(t).write(where, json.dumps(edited).encode())
    sent = put_counted(proxied, t, source)
    assert sent >= SIZE  # not resumed: an object stood under the name
