"""Two processes overwriting one name on an S3 store (every rank saving ``last.ckpt``, a
restarted job and its zombie), killed together at random points: after every round a version
of the name verifies, judged through the backdoor against ``docs/format.md`` (the bytes under
the name match the record or one of the name's pending records), and after a gc the record
itself matches and no pending record is left (issue 22, finding 8).

The kill points are drawn from a seeded generator (the default run's rounds are the first ones
of the soak run's); each round's seed and delay are in the assertion message. Both servers:
moto (which honours conditional writes) and ``rclone serve s3`` (which honours none)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

import commitstore
from commitstore import open_store
from commitstore.testing import S3Backdoor, record_path

from .helpers.s3servers import BUCKET, S3Server

NAME = "run/last.ckpt"
SIZE = 64 * 1024
ROUNDS = 6
"""Kill rounds per server in the default run, the first of the soak run's (the two
interleavings found by the random rounds are stepped exactly below, on both servers); each
round costs a few seconds of writer start-up, verify and gc."""
SOAK_ROUNDS = 60
"""Kill rounds per server under soak."""
SRC = Path(commitstore.__file__).resolve().parent.parent
"""Where the commitstore under test lives: the writer processes import the same one."""


def digest(data: bytes) -> str:
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)


def pending_digests(door: Any, name: str) -> list[str]:
    """The digests of every pending record of ``name`` (``docs/format.md``): the one beside the
    record and each writer's under ``.commitstore/pending/``."""
    beside = record_path(name).replace("/.commitstore.rec.", "/.commitstore.new.")
    slots = beside.replace(".commitstore/records/", ".commitstore/pending/", 1) + "/"
    out = []
    for path in [beside, *[f for f in door.files() if f.startswith(slots)]]:
        raw = door.read(path)
        if raw is not None:
            doc = json.loads(raw)
            if doc.get("name") == name:
                out.append(doc["digest"])
    return out


FORKER = """
import sys, json, os, signal
import commitstore.backends.object.s3.backend, s3fs  # imported once, before any fork
from commitstore import open_store
url, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
opts = json.loads(os.environ["STORE_OPTIONS"])
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps killed writers
for line in sys.stdin:
    seed = int(line)
    pid = os.fork()
    if pid == 0:
        store = open_store(url, **opts)
        i = 0
        while True:
            data = (f"writer {seed} commit {i} ".encode() * (size // 16 + 1))[:size]
            store.put_bytes(name, data, overwrite=True)
            i += 1
    print(pid, flush=True)
"""


class Writers:
    """Writer processes forked on demand by one process that imported commitstore once (so a
    round costs no interpreter start); each commits ``NAME`` again and again, each commit's
    bytes its own, until it is SIGKILLed."""

    def __init__(self, server: S3Server, url: str, opts: dict[str, Any]) -> None:
        env = {**os.environ, **server.env(), "STORE_OPTIONS": json.dumps(opts)}
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FORKER, url, NAME, str(SIZE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def start(self, seed: int) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{seed}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def kill_and_wait(pids: list[int]) -> None:
    """SIGKILL every writer, then wait until each is gone (reaped by the kernel). A writer that
    finished its commit before the kill point is already gone (and reaped): nothing to kill."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, f"writer {pid} outlived its SIGKILL"
            time.sleep(0.005)


def go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


@pytest.mark.parametrize("server_name", ["moto", "rclone"])
def test_two_writers_killed_at_random_points_leave_a_version_that_verifies(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    run_random_rounds(request.getfixturevalue(server_name), server_name, ROUNDS)


@pytest.mark.soak
@pytest.mark.parametrize("server_name", ["moto", "rclone"])
def test_two_writers_killed_at_random_points_soak(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    run_random_rounds(request.getfixturevalue(server_name), server_name, SOAK_ROUNDS)


def run_random_rounds(server: S3Server, server_name: str, rounds: int) -> None:
    """``rounds`` rounds of two writers of ``NAME`` killed together at a drawn delay after the
    first new commit's data landed; after each, a version verifies, before and after gc."""
    prefix = f"two{time.monotonic_ns()}"
    url = server.url(prefix)
    store = open_store(url, **server.options())
    backend: Any = store._committer.backend
    opts = {**server.options(), "conditional_writes": backend.conditional_writes()}
    door = S3Backdoor(server.client(), BUCKET, prefix)
    store.put_bytes(NAME, b"old" * 100, overwrite=True)
    rng = random.Random(2207)
    outcomes = {"record": 0, "pending": 0}  # what the bytes matched before gc
    writers = Writers(server, url, opts)
    try:
        for rnd in range(rounds):
            before = door.read(NAME)
            delay = rng.uniform(0.0, 0.6)
            pids = [writers.start(2 * rnd + 1), writers.start(2 * rnd + 2)]
            busy_by = time.monotonic() + 60  # the kill lands among commits, not before them
            while door.read(NAME) == before:
                assert time.monotonic() < busy_by, f"round {rnd}: no writer committed"
                time.sleep(0.01)
            time.sleep(delay)
            kill_and_wait(pids)
            where = f"round {rnd} (killed {delay:.3f}s after the first new commit's data)"
            data = door.read(NAME)
            assert data is not None, f"{where}: the name is gone"
            raw = door.read(record_path(NAME))
            assert raw is not None, f"{where}: the record is gone"
            candidates = [json.loads(raw)["digest"], *pending_digests(door, NAME)]
            assert digest(data) in candidates, f"{where}: no version verifies"
            outcomes["record" if digest(data) == candidates[0] else "pending"] += 1
            fresh = open_store(url, **opts)
            assert fresh.verify(NAME).ok, where
            fresh.gc(min_age=0)
            raw = door.read(record_path(NAME))
            assert raw is not None, f"{where}: gc removed the record"
            # A PUT whose whole body reached the server before the kill may still be stored
            # after it (rclone finishes it): the data read now may be that writer's version,
            # which its pending record (read above) names. The record must name what is there.
            after = door.read(NAME)
            assert after is not None, f"{where}: gc removed the data"
            assert digest(after) in candidates, f"{where}: after gc, data of no known version"
            assert json.loads(raw)["digest"] == digest(after), f"{where}: after gc"
            assert pending_digests(door, NAME) == [], f"{where}: gc left a pending record"
    finally:
        writers.close()
    print(f"{server_name}: {rounds} rounds, {outcomes}")


# -- the two interleavings that left no version, stepped exactly ------------------------------
STEPPED = """
import sys, json, os
import xxhash
from commitstore import _commit, open_store
url, name, text = sys.argv[1], sys.argv[2], sys.argv[3]
pauses = sys.argv[4].split(",")
original = _commit.put_small
own = xxhash.xxh3_128_hexdigest(text.encode() * 500).encode()

def pause(event):
    if event in pauses:
        print(event, flush=True)
        sys.stdin.readline()

def put_small(backend, parts, body, mode):
    pending = any(p.startswith(".commitstore.new.") for p in parts[-2:])
    record = parts[-1].startswith(".commitstore.rec.") and own in body  # its own record
    pause("before-pending" if pending else "before-record" if record else "")
    result = original(backend, parts, body, mode)
    pause("after-pending" if pending else "")
    return result

_commit.put_small = put_small
store = open_store(url, **json.loads(os.environ["STORE_OPTIONS"]))
store.put_bytes(name, text.encode() * 500, overwrite=True)
print("done", flush=True)
"""


def stepped(
    server: S3Server, url: str, text: str, pauses: str, opts: dict[str, Any]
) -> subprocess.Popen[str]:
    env = {**os.environ, **server.env(), "STORE_OPTIONS": json.dumps(opts)}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", STEPPED, url, NAME, text, pauses],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def reaches(proc: subprocess.Popen[str], event: str) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == event


@pytest.mark.parametrize("server_name", ["moto", "rclone"])
@pytest.mark.parametrize("order", ["second-pending-after-first-data", "first-cleans-up-second"])
def test_two_writers_stepped_then_killed_leave_a_version_that_verifies(
    server_name: str, order: str, request: pytest.FixtureRequest
) -> None:
    """``second-pending-after-first-data``: B checks the name, A writes its pending record and
    its data, B writes its pending record, both are killed (one pending slot per name left B's
    pending record over A's data). ``first-cleans-up-second``: A and B write their pending
    records and data (B's last), A writes its record and cleans up, both are killed (one slot:
    A's clean-up removed B's pending record, the data B's)."""
    server: S3Server = request.getfixturevalue(server_name)
    prefix = f"step{time.monotonic_ns()}"
    url = server.url(prefix)
    store = open_store(url, **server.options())
    backend: Any = store._committer.backend
    opts = {**server.options(), "conditional_writes": backend.conditional_writes()}
    door = S3Backdoor(server.client(), BUCKET, prefix)
    store.put_bytes(NAME, b"old" * 100, overwrite=True)
    if order == "second-pending-after-first-data":
        b = stepped(server, url, "B", "before-pending,after-pending", opts)
        reaches(b, "before-pending")
        a = stepped(server, url, "A", "before-record", opts)
        reaches(a, "before-record")
        go(b)
        reaches(b, "after-pending")
        expected = b"A" * 500
    else:
        a = stepped(server, url, "A", "before-record", opts)
        reaches(a, "before-record")
        b = stepped(server, url, "B", "before-record", opts)
        reaches(b, "before-record")
        go(a)
        assert a.stdout is not None and a.stdout.readline().strip() == "done"
        expected = b"B" * 500
    for p in (a, b):
        p.kill()
        p.wait(30)
    data = door.read(NAME)
    assert data == expected
    raw = door.read(record_path(NAME))
    assert raw is not None
    candidates = [json.loads(raw)["digest"], *pending_digests(door, NAME)]
    assert digest(data) in candidates, "no version verifies"
    fresh = open_store(url, **opts)
    assert fresh.verify(NAME).ok
    assert fresh.read_bytes(NAME) == data
    fresh.gc(min_age=0)
    raw = door.read(record_path(NAME))
    assert raw is not None and json.loads(raw)["digest"] == digest(data)
    assert pending_digests(door, NAME) == []
