"""Upload resume: the bytes a ``put_file`` to S3 or GCS sends again after its writer was SIGKILLed.

A writer process (``tests.helpers.putwriter``) puts a file through a proxy; once about 80% of its
parts are on the server (polled through boto3, the server's own client) the proxy stops
forwarding and the writer is SIGKILLed. Once its upload looks dead (a resume never joins an
upload that may be live: no activity for a few heartbeats of 1 s), a second writer process
puts the same file again through a counting proxy (``tests/helpers/faultproxy.py``): the bytes
it sent, against the bytes of one uninterrupted ``put_file`` of the same file under another
name through the same proxy, are the resumed-bytes ratio (ideal: the share of parts that had
not landed, plus requests' overhead).
Both commits are checked (``verify``). Measured against moto and ``rclone serve s3``, 256 MiB by
default, 8 MiB parts. Target: ratio <= (1 - landed share) + 0.02.

GCS (fake-gcs-server): the same, 8 MiB chunks; the server names the proxy's port in its session
URIs, so every chunk goes through the proxy; the kill comes once the resume state (read through
the server's JSON API) says ``KILL_AT`` of the chunks were acknowledged, and the proxy is closed
(the chunk in flight never completes) before a new one takes its port.
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
from pathlib import Path
from typing import Any

from tests.helpers.faultproxy import FaultProxy
from tests.helpers.gcsserver import BUCKET as GCS_BUCKET
from tests.helpers.gcsserver import FakeGcs
from tests.helpers.s3servers import BUCKET, MotoServer, RcloneS3, S3Server
from tests.helpers.samba import free_port

from commitstore import open_store
from commitstore.backends.object.s3.upload import STALE_BEATS
from commitstore.testing import GcsBackdoor, S3Backdoor

from ._harness import MiB, verdict, write_results

ROOT = Path(__file__).resolve().parent.parent
PART = 8 * MiB
KILL_AT = 0.8
"""The share of parts on the server when the writer is killed."""
SLACK = 0.02
HEARTBEAT = 1.0
"""The writers' heartbeat: the killed writer's upload looks dead (and is resumed) a few seconds
after the kill (``s3/upload.STALE_BEATS`` heartbeats plus the 1 s mtime resolution)."""


def _writer(
    server: S3Server, url: str, name: str, source: Path, endpoint: str, **more: Any
) -> subprocess.Popen[str]:
    options = {
        "part_size": PART,
        "single_put_max": PART,
        "endpoint_url": endpoint,
        "heartbeat": HEARTBEAT,
        **more,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.putwriter", url, name, str(source)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            **server.env(),
            "AWS_ENDPOINT_URL": endpoint,
            "WRITER_STORE_OPTIONS": json.dumps(options),
        },
    )


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


def _kill_at(server: S3Server, url: str, prefix: str, source: Path, total: int) -> int:
    """Put ``source`` as ``ckpt.pt`` and SIGKILL the writer once ``KILL_AT`` of its ``total``
    parts landed; returns how many had."""
    slow = FaultProxy(server.port)
    # one part at a time, slowed: the kill comes between two parts, well before the last
    slow.set(delay=0.005, faulty=None)
    client = server.client()
    try:
        proc = _writer(server, url, "ckpt.pt", source, slow.endpoint, max_inflight=1)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            landed = 0
            deadline = time.monotonic() + 900
            while landed < KILL_AT * total and time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"{server.name}: the writer ended before the kill")
                landed = _landed(client, f"{prefix}/")
                time.sleep(0.01)
            slow.freeze()  # nothing more reaches the server
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(60)
    finally:
        slow.stop()  # (moto answers one request at a time: the frozen one is dropped first)
    landed = _landed(client, f"{prefix}/")
    if landed >= total:
        raise RuntimeError(f"{server.name}: every part landed before the kill")
    # a resume never joins an upload that may still be live: wait until it looks dead
    S3Backdoor(client, BUCKET, prefix).wait_dead("ckpt.pt", STALE_BEATS * HEARTBEAT + 1.0)
    return landed


def _counted_put(server: S3Server, url: str, name: str, source: Path) -> tuple[int, float]:
    proxy = FaultProxy(server.port)
    try:
        started = time.monotonic()
        proc = _writer(server, url, name, source, proxy.endpoint)
        out, _ = proc.communicate(timeout=900)
        if proc.returncode != 0 or "done" not in out:
            raise RuntimeError(f"{server.name}: put_file of {name} failed")
        return proxy.received, time.monotonic() - started
    finally:
        proxy.stop()


def _gcs_writer(
    url: str, name: str, source: Path, options: dict[str, Any]
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.putwriter", url, name, str(source)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "WRITER_STORE_OPTIONS": json.dumps(options)},
    )


def _gcs_acked(door: GcsBackdoor) -> int:
    """The chunks the one resume state under the prefix says were acknowledged."""
    found = [f for f in door.files() if f.startswith(".commitstore/resume/")]
    data = door.read(found[0]) if found else None
    return int(json.loads(data)["gcs"]["sent"]) // PART if data else 0


def _gcs_counted(
    proxy_port: int, server: FakeGcs, name: str, source: Path, options: dict[str, Any]
) -> tuple[int, float]:
    url = server.url("uploadresume")
    proxy = FaultProxy(server.port, port=proxy_port)
    try:
        started = time.monotonic()
        proc = _gcs_writer(url, name, source, options)
        out, _ = proc.communicate(timeout=900)
        if proc.returncode != 0 or "done" not in out:
            raise RuntimeError(f"gcs: put_file of {name} failed")
        return proxy.received, time.monotonic() - started
    finally:
        proxy.stop()


def _gcs_case(base: Path, source: Path, size: int, total: int) -> dict[str, Any]:
    """Kill a GCS ``put_file`` at ``KILL_AT`` of its chunks, resume it, put it whole: the
    measurement (see the module docstring)."""
    proxy_port = free_port()
    server = FakeGcs(base, external=f"http://127.0.0.1:{proxy_port}")
    try:
        prefix = "uploadresume"
        url = server.url(prefix)
        options = {
            **server.options(),
            "endpoint_url": f"http://127.0.0.1:{proxy_port}",
            "chunk_size": PART,
        }
        door = GcsBackdoor(server.endpoint, GCS_BUCKET, prefix)
        slow = FaultProxy(server.port, port=proxy_port)
        slow.set(delay=0.005, faulty=None)
        try:
            proc = _gcs_writer(url, "ckpt.pt", source, options)
            try:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                landed = 0
                # the state lists a chunk as acknowledged when the next one is about to go,
                # and the final one is the commit: at most total - 2 are seen before it
                goal = min(-(-int(KILL_AT * total * 1000) // 1000), total - 2)
                deadline = time.monotonic() + 900
                while landed < goal and time.monotonic() < deadline:
                    if proc.poll() is not None:
                        raise RuntimeError("gcs: the writer ended before the kill")
                    landed = _gcs_acked(door)
                    time.sleep(0.01)
                slow.freeze()  # nothing more reaches the server
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(60)
        finally:
            slow.stop()  # the chunk in flight never completes
        landed = _gcs_acked(door)
        if landed >= total:
            raise RuntimeError("gcs: every chunk landed before the kill")
        resumed, resumed_s = _gcs_counted(proxy_port, server, "ckpt.pt", source, options)
        full, full_s = _gcs_counted(proxy_port, server, "full.pt", source, options)
        for name in ("ckpt.pt", "full.pt"):
            if door.read(name) != source.read_bytes():
                raise RuntimeError(f"gcs: {name} is not the source's bytes")
    finally:
        server.stop()
    missing = 1 - landed / total
    ratio = resumed / full
    target = round(missing + SLACK, 4)
    print(
        f"  gcs: {landed}/{total} chunks acknowledged at the kill; resumed sent {resumed} / "
        f"{full} bytes, ratio {ratio:.4f} (ideal {missing:.4f}); {resumed_s:.1f} s vs "
        f"{full_s:.1f} s"
    )
    return {
        "ours": "put_file resumed",
        "baseline": "put_file whole",
        "artifact_bytes": size,
        "ours_bytes": resumed,
        "baseline_bytes": full,
        "ratio": ratio,
        "target": target,
        "verdict": verdict(ratio, [ratio, ratio], target),
        "parts": total,
        "parts_landed_at_kill": landed,
        "ideal": missing,
        "ours_s": round(resumed_s, 2),
        "baseline_s": round(full_s, 2),
    }


def main(args: argparse.Namespace) -> None:
    size = (args.size_mib or 256) * MiB
    total = -(-size // PART)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cs-bench-uploadresume-") as tmp:
        source = Path(tmp) / "source.bin"
        with open(source, "wb") as f:
            for _ in range(size // (4 * MiB)):
                f.write(os.urandom(4 * MiB))
        for cls in (MotoServer, RcloneS3):
            base = Path(tmp) / cls.name
            base.mkdir()
            server = cls(base)
            try:
                prefix = "uploadresume"
                url = f"s3://{BUCKET}/{prefix}"
                landed = _kill_at(server, url, prefix, source, total)
                resumed, resumed_s = _counted_put(server, url, "ckpt.pt", source)
                full, full_s = _counted_put(server, url, "full.pt", source)
                store = open_store(url, **server.options())
                for name in ("ckpt.pt", "full.pt"):
                    if not store.verify(name).ok:
                        raise RuntimeError(f"{server.name}: {name} does not verify")
                missing = 1 - landed / total
                ratio = resumed / full
                target = round(missing + SLACK, 4)
                results[f"{cls.name}: bytes sent to resume vs one whole put_file"] = {
                    "ours": "put_file resumed",
                    "baseline": "put_file whole",
                    "artifact_bytes": size,
                    "ours_bytes": resumed,
                    "baseline_bytes": full,
                    "ratio": ratio,
                    "target": target,
                    "verdict": verdict(ratio, [ratio, ratio], target),
                    "parts": total,
                    "parts_landed_at_kill": landed,
                    "ideal": missing,
                    "ours_s": round(resumed_s, 2),
                    "baseline_s": round(full_s, 2),
                }
                print(
                    f"  {cls.name}: {landed}/{total} parts landed at the kill; resumed sent "
                    f"{resumed} / {full} bytes, ratio {ratio:.4f} (ideal {missing:.4f}); "
                    f"{resumed_s:.1f} s vs {full_s:.1f} s"
                )
            finally:
                server.stop()
        results["gcs: bytes sent to resume vs one whole put_file"] = _gcs_case(
            Path(tmp) / "gcs", source, size, total
        )
    write_results(
        "uploadresume",
        f"put_file resumed after a SIGKILL at ~{KILL_AT:.0%} of the parts, {size // MiB} MiB, "
        f"{PART // MiB} MiB parts (GCS: chunks): bytes sent (counted at a proxy) vs one whole "
        "put_file",
        results,
    )
