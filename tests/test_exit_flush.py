"""A script that ends without ``close()``: the exit flush delivers every copy still queued, to a
local mirror written with direct I/O and to an S3 mirror alike, counted on the mirror itself
(bytes and records through a backdoor, and the mirror's own full verify), not by the warning."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commitstore import open_store
from commitstore.testing import LocalBackdoor, S3Backdoor, record_path

from .helpers.s3servers import BUCKET, MotoServer

ROOT_DIR = Path(__file__).resolve().parent.parent
CHECKPOINTS = 3
SIZE = 12 << 20
"""Past the local backend's direct-I/O threshold (the mirror's staging goes through its
direct writer), small enough to keep the test quick."""

SCRIPT = """
import json, sys, time
import commitstore.mirrors.copy as c
import commitstore.mirrors.replicator as r
from commitstore import open_store

real = c.copy_artifact
def slow(src, dst, name, **kw):  # every copy is still queued when the script ends
    time.sleep(0.3)
    return real(src, dst, name, **kw)
c.copy_artifact = r.copy_artifact = slow

mirror_url, opts = sys.argv[2], json.loads(sys.argv[3])
mirror = open_store(mirror_url, **opts) if opts else mirror_url
store = open_store(sys.argv[1], mirrors=[mirror])
for i in range(int(sys.argv[4])):
    store.put_bytes(f"step_{i}.pt", bytes([i + 1]) * int(sys.argv[5]))
print("committed", flush=True)
# no close(): the script just ends
"""


def _run(primary: Path, mirror: str, opts: dict[str, object], size: int) -> str:
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIPT,
            str(primary),
            mirror,
            json.dumps(opts),
            str(CHECKPOINTS),
            str(size),
        ],
        cwd=ROOT_DIR,
        env={**os.environ, "PYTHONPATH": str(ROOT_DIR / "src")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "committed"
    return res.stderr


def test_exit_flush_delivers_every_copy_to_a_direct_io_mirror(tmp_path: Path) -> None:
    stderr = _run(tmp_path / "p", str(tmp_path / "m"), {}, SIZE)
    door = LocalBackdoor(tmp_path / "m")
    arrived = [
        i
        for i in range(CHECKPOINTS)
        if door.read(f"step_{i}.pt") == bytes([i + 1]) * SIZE
        and door.read(record_path(f"step_{i}.pt")) is not None
    ]
    assert arrived == list(range(CHECKPOINTS)), stderr
    report = open_store(tmp_path / "m").verify()
    assert report.ok and len(report.results) == CHECKPOINTS, report
    assert "did not reach" not in stderr, stderr


def test_exit_flush_delivers_every_copy_to_an_s3_mirror(
    tmp_path: Path, moto: MotoServer, request: pytest.FixtureRequest
) -> None:
    prefix = request.node.name
    opts = moto.options()
    size = 6 << 20  # a multipart upload (parts sent through the store's event loop)
    stderr = _run(tmp_path / "p", f"s3://{BUCKET}/{prefix}", opts, size)
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    arrived = [
        i
        for i in range(CHECKPOINTS)
        if door.read(f"step_{i}.pt") == bytes([i + 1]) * size
        and door.read(record_path(f"step_{i}.pt")) is not None
    ]
    assert arrived == list(range(CHECKPOINTS)), stderr
    report = open_store(f"s3://{BUCKET}/{prefix}", **opts).verify()
    assert report.ok and len(report.results) == CHECKPOINTS, report
    assert "did not reach" not in stderr, stderr


LATE_SCRIPT = """
import sys, threading, time
from commitstore import open_store

store = open_store(sys.argv[1], mirrors=[sys.argv[2]])

def late() -> None:  # a non-daemon thread that commits after the main thread has ended
    time.sleep(0.5)
    for i in range(int(sys.argv[3])):
        store.put_bytes(f"late_{i}.pt", bytes([i + 1]) * int(sys.argv[4]))

threading.Thread(target=late).start()
print("started", flush=True)
"""


def test_copies_submitted_while_the_interpreter_exits_still_arrive(tmp_path: Path) -> None:
    """The main thread ends first; a non-daemon thread commits while the interpreter waits
    for it (after ``concurrent.futures`` stopped taking work): the copies, made with direct
    I/O on the mirror, still arrive within the exit flush."""
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            LATE_SCRIPT,
            str(tmp_path / "p"),
            str(tmp_path / "m"),
            str(CHECKPOINTS),
            str(SIZE),
        ],
        cwd=ROOT_DIR,
        env={**os.environ, "PYTHONPATH": str(ROOT_DIR / "src")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    door = LocalBackdoor(tmp_path / "m")
    arrived = [i for i in range(CHECKPOINTS) if door.read(f"late_{i}.pt") == bytes([i + 1]) * SIZE]
    assert arrived == list(range(CHECKPOINTS)), res.stderr
    assert open_store(tmp_path / "m").verify().ok


HUNG = """
import sys, threading
import commitstore.mirrors.copy as c
import commitstore.mirrors.replicator as r
from commitstore import open_store

never = threading.Event()
def hung(src, dst, name, **kw):  # a mirror that never takes the copy
    never.wait()
c.copy_artifact = r.copy_artifact = hung

store = open_store(sys.argv[1], mirrors=[sys.argv[2]])
store.put_bytes("step_0.pt", b"x" * 100)
print("committed", flush=True)
"""


def test_the_exit_warning_says_how_long_the_exit_flush_waited(tmp_path: Path) -> None:
    """A copy that never ends: the exit flush waits its whole bound, then its warning names the
    artifact and the wait (which spans both of its stages: the warning said "0.0s", the second
    stage's share, after waiting the whole bound in the first)."""
    res = subprocess.run(
        [sys.executable, "-c", HUNG, str(tmp_path / "p"), str(tmp_path / "m")],
        cwd=ROOT_DIR,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT_DIR / "src"),
            "COMMITSTORE_EXIT_FLUSH_SECONDS": "2",
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.stdout.strip() == "committed", res.stderr
    said = re.search(r"the exit flush waited ([0-9.]+)s", res.stderr)
    assert said is not None, res.stderr
    assert "step_0.pt (still copying)" in res.stderr
    assert 2.0 <= float(said.group(1)) < 300, res.stderr  # the whole bound, not a stage's share
