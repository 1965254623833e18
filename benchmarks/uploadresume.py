"""Upload resume: the bytes a ``put_file`` to S3 or GCS sends again after its writer was SIGKILLed.

A writer process (``tests.helpers.putwriter``) puts a file through a proxy; once about 80% of its
parts are on the server (polled through boto3, the server's own client) the proxy stops
forwarding and the writer is SIGKILLed and reaped. At once (no wait for the upload to age: the
writers beat at the default 60 s, and a resume never joins an upload that may be live, but the
killed writer's marker names its process, which is gone), a second writer process
puts the same file again through a counting proxy (``tests/helpers/faultproxy.py``): the bytes
it sent, against the bytes of one uninterrupted ``put_file`` of the same file under another
name through the same proxy, are the resumed-bytes ratio (ideal: the share of parts that had
not landed, plus requests' overhead).
Both commits are checked (``verify``). Measured against moto and ``rclone serve s3``, 256 MiB by
default, 8 MiB parts. Target: ratio <= (1 - landed share) + 0.02.

GCS (fake-gcs-server): the same, 8 MiB chunks; the server names the proxy's port in its session
URIs, so every chunk goes through the proxy; the writer stops right after its resume state says
``KILL_AT`` of the chunks were acknowledged and none is in flight (``WRITER_GCS_AT``: a chunk in
flight at the kill makes the resume start over there, as fake-gcs-server cannot be asked what
it holds), is SIGKILLed, and the proxy is closed before a new one takes its port.

Azure (Azurite): the same as S3, 8 MiB blocks staged one at a time; the blocks landed are the
blob's uncommitted block list (the server's own client). The connection string names the
proxy's port as the blob endpoint, so every request goes through it (the whole put's count,
at least the file's size, shows it). A resume needs no wait (an Azure upload has no owner to
be taken for live).

Mirror queue (moto): a process with a local primary and a background S3 mirror commits the file
and is SIGKILLed once ``KILL_AT`` of the mirror copy's parts landed (its copy was journaled as
owed when it was queued, docs/mirrors.md). At once, a new process opens the
same primary with the same mirror (through a counting proxy) and lets its queue finish
(``flush()``): the journal's owed copy is made, resuming the upload from the primary's file.
Baseline: the bytes a process sends to the mirror for one whole background copy of the same
file under another name. The owed journal must be empty afterwards and both mirror copies verify.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.azurite import ACCOUNT, KEY, Azurite, azure_backdoor
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.gcsserver import BUCKET as GCS_BUCKET
from tests.helpers.gcsserver import FakeGcs
from tests.helpers.s3servers import BUCKET, MotoServer, S3Server
from tests.helpers.samba import free_port

from commitstore import open_store
from commitstore.testing import AzureBackdoor, GcsBackdoor

from ._harness import MiB, verdict, write_results
from .s3 import SERVERS, running, write_source

ROOT = Path(__file__).resolve().parent.parent
PART = 8 * MiB
KILL_AT = 0.8
"""The share of parts on the server when the writer is killed."""
SLACK = 0.02
HEARTBEAT = 60.0
"""The writers' heartbeat, the default: by age alone the killed writer's upload would look live
for ``s3/upload.STALE_BEATS`` of them; the restarted writer resumes at once because the upload's
marker names the killed process (``backends/object/writerid.py``)."""
PREFIX = "uploadresume"


def _writer(
    url: str, name: str, source: Path, options: dict[str, Any], env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """A ``put_file`` writer process (``tests.helpers.putwriter``) of ``source`` as ``name``."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.putwriter", url, name, str(source)],
        cwd=ROOT,
        stdin=subprocess.PIPE,  # a writer told to pause waits for a line there
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {}), "WRITER_STORE_OPTIONS": json.dumps(options)},
    )


def _s3_writer(
    server: S3Server, url: str, name: str, source: Path, endpoint: str, **more: Any
) -> subprocess.Popen[str]:
    options = {
        "part_size": PART,
        "single_put_max": PART,
        "endpoint_url": endpoint,
        "heartbeat": HEARTBEAT,
        **more,
    }
    env = {**server.env(), "AWS_ENDPOINT_URL": endpoint}
    return _writer(url, name, source, options, env)


def _kill_when(
    label: str,
    proc: subprocess.Popen[str],
    slow: FaultProxy,
    landed: Callable[[], int],
    goal: float,
) -> None:
    """SIGKILL writer ``proc`` (through the slowed proxy ``slow``) once ``landed()`` reaches
    ``goal``; the proxy stops forwarding first, and is closed (the request in flight never
    completes)."""
    try:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            got = 0
            deadline = time.monotonic() + 900
            while got < goal and time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"{label}: the writer ended before the kill")
                got = landed()
                time.sleep(0.01)
            slow.freeze()  # nothing more reaches the server
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(60)
    finally:
        slow.stop()  # (moto answers one request at a time: the frozen one is dropped first)


NAMES = ("ckpt.pt", "full.pt")
"""The resumed put, then the whole one."""


def _counted(
    label: str,
    name: str,
    proxy: FaultProxy,
    start: Callable[[str, FaultProxy], subprocess.Popen[str]],
) -> tuple[int, float]:
    """(bytes sent through the counting ``proxy``, seconds) of a writer process of ``name``
    (``start(name, proxy)``), run to its end."""
    try:
        started = time.monotonic()
        proc = start(name, proxy)
        out, _ = proc.communicate(timeout=900)
        if proc.returncode != 0 or "done" not in out:
            raise RuntimeError(f"{label}: put_file of {name} failed")
        return proxy.received, time.monotonic() - started
    finally:
        proxy.stop()


def _measured(
    label: str,
    landed_words: str,
    *,
    size: int,
    total: int,
    landed: int,
    resumed: tuple[int, float],
    full: tuple[int, float],
) -> dict[str, Any]:
    """The measurement of one server: the bytes (and seconds) of the resumed put against one
    whole put, judged against the share of parts that had not landed at the kill."""
    (resumed_b, resumed_s), (full_b, full_s) = resumed, full
    _through_proxy(label, full, size)
    missing = 1 - landed / total
    ratio = resumed_b / full_b
    target = round(missing + SLACK, 4)
    print(
        f"  {label}: {landed}/{total} {landed_words} at the kill; resumed sent {resumed_b} / "
        f"{full_b} bytes, ratio {ratio:.4f} (ideal {missing:.4f}); {resumed_s:.1f} s vs "
        f"{full_s:.1f} s"
    )
    return {
        "ours": "put_file resumed",
        "baseline": "put_file whole",
        "artifact_bytes": size,
        "ours_bytes": resumed_b,
        "baseline_bytes": full_b,
        "ratio": ratio,
        "target": target,
        "verdict": verdict(ratio, [ratio, ratio], target),
        "parts": total,
        "parts_landed_at_kill": landed,
        "ideal": missing,
        "ours_s": round(resumed_s, 2),
        "baseline_s": round(full_s, 2),
    }


def _landed(client: Any, prefix: str) -> int:
    try:
        ups = client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
    except Exception as exc:  # rclone answers NoSuchUpload when there are none
        if "NoSuchUpload" in str(exc):
            return 0
        raise
    if not ups:
        return 0
    parts = client.list_parts(Bucket=BUCKET, Key=ups[0]["Key"], UploadId=ups[0]["UploadId"])
    return len(parts.get("Parts", []))


def _s3_case(cls: type[S3Server], tmp: Path, source: Path, size: int, total: int) -> dict[str, Any]:
    """Kill an S3 ``put_file`` at ``KILL_AT`` of its parts on a ``cls`` server, resume it once
    at once (its process is gone), put it whole: the measurement (see the module docstring)."""
    with running(cls, tmp) as server:
        url = f"s3://{BUCKET}/{PREFIX}"
        client = server.client()
        slow = FaultProxy(server.port)
        # one part at a time, slowed: the kill comes between two parts, well before the last
        slow.set(delay=0.005, faulty=None)
        proc = _s3_writer(server, url, "ckpt.pt", source, slow.endpoint, max_inflight=1)
        _kill_when(server.name, proc, slow, lambda: _landed(client, f"{PREFIX}/"), KILL_AT * total)
        landed = _landed(client, f"{PREFIX}/")
        if landed >= total:
            raise RuntimeError(f"{server.name}: every part landed before the kill")

        def put(name: str, proxy: FaultProxy) -> subprocess.Popen[str]:
            return _s3_writer(server, url, name, source, proxy.endpoint)

        counted = {n: _counted(server.name, n, FaultProxy(server.port), put) for n in NAMES}
        store = open_store(url, **server.options())
        for name in NAMES:
            if not store.verify(name).ok:
                raise RuntimeError(f"{server.name}: {name} does not verify")
    resumed, full = (counted[n] for n in NAMES)
    return _measured(
        cls.name, "parts landed", size=size, total=total, landed=landed, resumed=resumed, full=full
    )


def _gcs_writer(
    url: str, name: str, source: Path, options: dict[str, Any], at: str = ""
) -> subprocess.Popen[str]:
    """A GCS ``put_file`` writer; ``at``: where it stops (``WRITER_GCS_AT``, none by default)."""
    return _writer(url, name, source, options, {"WRITER_GCS_AT": at})


def _gcs_acked(door: GcsBackdoor) -> int:
    """The chunks the one resume state under the prefix says were acknowledged."""
    found = [f for f in door.files() if f.startswith(".commitstore/resume/")]
    data = door.read(found[0]) if found else None
    return int(json.loads(data)["gcs"]["sent"]) // PART if data else 0


def _gcs_case(base: Path, source: Path, size: int, total: int) -> dict[str, Any]:
    """Kill a GCS ``put_file`` at ``KILL_AT`` of its chunks, resume it, put it whole: the
    measurement (see the module docstring)."""
    proxy_port = free_port()
    server = FakeGcs(base, external=f"http://127.0.0.1:{proxy_port}")
    try:
        url = server.url(PREFIX)
        options = {
            **server.options(),
            "endpoint_url": f"http://127.0.0.1:{proxy_port}",
            "chunk_size": PART,
        }
        door = GcsBackdoor(server.endpoint, GCS_BUCKET, PREFIX)
        slow = FaultProxy(server.port, port=proxy_port)
        slow.set(delay=0.005, faulty=None)
        try:
            # the kill comes right after the state says ``goal`` chunks were acknowledged and
            # none is in flight (one in flight, which fake-gcs-server cannot be asked about,
            # makes the resume start over); the final chunk is the commit
            goal = min(-(-int(KILL_AT * total * 1000) // 1000), total - 2)
            proc = _gcs_writer(url, "ckpt.pt", source, options, f"pause-at-acked:{goal}")
            try:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                if proc.stdout.readline().strip() != "paused":
                    raise RuntimeError("gcs: the writer ended before the kill")
                slow.freeze()  # nothing more reaches the server
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(60)
        finally:
            slow.stop()  # the chunk in flight never completes
        landed = _gcs_acked(door)
        if landed >= total:
            raise RuntimeError("gcs: every chunk landed before the kill")

        def put(name: str, proxy: FaultProxy) -> subprocess.Popen[str]:
            return _writer(url, name, source, options)

        counted = {
            n: _counted("gcs", n, FaultProxy(server.port, port=proxy_port), put) for n in NAMES
        }
        for name in NAMES:
            if door.read(name) != source.read_bytes():
                raise RuntimeError(f"gcs: {name} is not the source's bytes")
    finally:
        server.stop()
    resumed, full = (counted[n] for n in NAMES)
    return _measured(
        "gcs",
        "chunks acknowledged",
        size=size,
        total=total,
        landed=landed,
        resumed=resumed,
        full=full,
    )


def _via(port: int) -> str:
    """The connection string of Azurite's account, its blob endpoint 127.0.0.1:``port``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};"
    )


def _staged(door: AzureBackdoor, name: str) -> int:
    """How many uncommitted blocks of ``name`` the server holds."""
    from azure.core.exceptions import ResourceNotFoundError

    blob = door.container.get_blob_client(f"{door.prefix}/{name}")
    try:
        _committed, uncommitted = blob.get_block_list("uncommitted")
    except ResourceNotFoundError:  # no block staged yet
        return 0
    return len(uncommitted)


def _azure_case(base: Path, source: Path, size: int, total: int) -> dict[str, Any]:
    """Kill an Azure ``put_file`` at ``KILL_AT`` of its blocks on Azurite, resume it, put it
    whole: the measurement (see the module docstring)."""
    base.mkdir()
    server = Azurite(base)
    try:
        url = server.url(PREFIX)
        door = azure_backdoor(server, PREFIX)
        slow = FaultProxy(server.port)
        slow.set(delay=0.005, faulty=None)  # one block at a time, slowed
        options = {"connection_string": _via(slow.port), "block_size": PART, "max_inflight": 1}
        proc = _writer(url, "ckpt.pt", source, options)
        _kill_when("azure", proc, slow, lambda: _staged(door, "ckpt.pt"), KILL_AT * total)
        landed = _staged(door, "ckpt.pt")
        if landed >= total:
            raise RuntimeError("azure: every block landed before the kill")
        if door.read("ckpt.pt") is not None:
            raise RuntimeError("azure: the killed put published its blob")

        def put(name: str, proxy: FaultProxy) -> subprocess.Popen[str]:
            return _writer(url, name, source, {**options, "connection_string": _via(proxy.port)})

        counted = {n: _counted("azure", n, FaultProxy(server.port), put) for n in NAMES}
        store = open_store(url, **server.options())
        for name in NAMES:
            if door.read(name) != source.read_bytes() or not store.verify(name).ok:
                raise RuntimeError(f"azure: {name} is not the source's bytes")
    finally:
        server.stop()
    resumed, full = (counted[n] for n in NAMES)
    return _measured(
        "azure", "blocks staged", size=size, total=total, landed=landed, resumed=resumed, full=full
    )


def _through_proxy(label: str, full: tuple[int, float], size: int) -> None:
    """The whole put's bytes counted at the proxy are at least the file's: every request went
    through it."""
    if full[0] < size:
        raise RuntimeError(f"{label}: only {full[0]} of {size} bytes went through the proxy")


MIRROR_PREFIX = "uploadresume-mirror"
MIRROR_CHILD = """
import json, os, sys, threading
from commitstore import open_store

mode, root, url, source = sys.argv[1:5]
mirror = open_store(url, **json.loads(os.environ["MIRROR_OPTIONS"]))
store = open_store(root, mirrors=[mirror], mirror_mode="background")
print("ready", flush=True)
if mode == "kill":  # commit, and wait for the SIGKILL while the mirror copy runs
    store.put_file("ckpt.pt", source)
    threading.Event().wait()
if mode == "whole":
    store.put_file("full.pt", source)
store.flush()  # "resume": the copy owed from the killed run, found in the journal at open
state = store.mirror_status()[0]
store.close()
print("done" if not (state.owed or state.failed) else f"owed {state.owed} {state.failed}",
      flush=True)
"""


def _mirror_process(
    mode: str, server: S3Server, root: Path, source: Path, endpoint: str, **more: Any
) -> subprocess.Popen[str]:
    """A process of ``MIRROR_CHILD``: a local primary at ``root`` with a background S3 mirror
    reached at ``endpoint``."""
    options = {
        **server.options(),
        "endpoint_url": endpoint,
        "part_size": PART,
        "single_put_max": PART,
        "heartbeat": HEARTBEAT,
        **more,
    }
    url = f"s3://{BUCKET}/{MIRROR_PREFIX}"
    return subprocess.Popen(
        [sys.executable, "-c", MIRROR_CHILD, mode, str(root), url, str(source)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            **server.env(),
            "AWS_ENDPOINT_URL": endpoint,
            "MIRROR_OPTIONS": json.dumps(options),
        },
    )


def _mirror_case(tmp: Path, source: Path, size: int, total: int) -> dict[str, Any]:
    """Kill a process whose background S3 mirror (moto) is copying a committed file at
    ``KILL_AT`` of its parts; a restarted process completes the owed copy: the measurement
    (see the module docstring)."""
    root = tmp / "mirror-primary"
    base = tmp / "mirror-moto"
    base.mkdir()
    server = MotoServer(base)
    try:
        client = server.client()
        slow = FaultProxy(server.port)
        slow.set(delay=0.005, faulty=None)
        proc = _mirror_process("kill", server, root, source, slow.endpoint, max_inflight=1)
        _kill_when(
            "mirror", proc, slow, lambda: _landed(client, f"{MIRROR_PREFIX}/"), KILL_AT * total
        )
        landed = _landed(client, f"{MIRROR_PREFIX}/")
        if landed >= total:
            raise RuntimeError("mirror: every part landed before the kill")
        owed = list((root / ".commitstore" / "owed").rglob("*.json"))
        if len(owed) != 1:
            raise RuntimeError(f"mirror: {len(owed)} journal entries after the kill, not 1")

        def run(mode: str, proxy: FaultProxy) -> subprocess.Popen[str]:
            return _mirror_process(mode, server, root, source, proxy.endpoint)

        counted = {
            mode: _counted(f"mirror {mode}", mode, FaultProxy(server.port), run)
            for mode in ("resume", "whole")
        }
        if list((root / ".commitstore" / "owed").rglob("*.json")):
            raise RuntimeError("mirror: the owed journal is not empty after the restart")
        mirror = open_store(f"s3://{BUCKET}/{MIRROR_PREFIX}", **server.options())
        for name in ("ckpt.pt", "full.pt"):
            if not mirror.verify(name).ok:
                raise RuntimeError(f"mirror: {name} does not verify on the mirror")
    finally:
        server.stop()
    resumed, full = counted["resume"], counted["whole"]
    result = _measured(
        "moto mirror queue",
        "parts landed",
        size=size,
        total=total,
        landed=landed,
        resumed=resumed,
        full=full,
    )
    return {
        **result,
        "ours": "owed copy resumed by a restarted process",
        "baseline": "one whole copy",
    }


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 256) * MiB
    total = -(-size // PART)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cs-bench-uploadresume-") as tmp:
        source = write_source(Path(tmp) / "source.bin", size)
        for cls in SERVERS:
            results[f"{cls.name}: bytes sent to resume vs one whole put_file"] = _s3_case(
                cls, Path(tmp), source, size, total
            )
        results["gcs: bytes sent to resume vs one whole put_file"] = _gcs_case(
            Path(tmp) / "gcs", source, size, total
        )
        results["azure: bytes sent to resume vs one whole put_file"] = _azure_case(
            Path(tmp) / "azure", source, size, total
        )
        results["moto mirror: bytes a restarted process sends to finish the owed copy"] = (
            _mirror_case(Path(tmp), source, size, total)
        )
    write_results(
        "uploadresume",
        f"put_file resumed after a SIGKILL at ~{KILL_AT:.0%} of the parts, {size // MiB} MiB, "
        f"{PART // MiB} MiB parts (GCS: chunks, Azure: blocks): bytes sent (counted at a proxy) "
        "vs one whole put_file; a restarted process's owed mirror copy vs one whole copy",
        results,
    )
