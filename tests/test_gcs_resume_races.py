"""Resumed GCS uploads racing kills, other resumers and other commits (fake-gcs-server, which
answers no status query: a resume there can only take its state's word for the offset).

Writers are subprocesses (``tests.helpers.putwriter``) stopped or SIGKILLed at exact points by
``WRITER_GCS_AT``; a commit in between comes from this process. Assertions read the bucket
through the backdoor (raw JSON API): whatever stands under the name must be one whole version
and match its record; a failed write is a ``CommitError``.
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

from commitstore import CommitStore, open_store
from commitstore.testing import GcsBackdoor, record_path, xxh

from .helpers.gcsserver import BUCKET, FakeGcs

ROOT_DIR = Path(__file__).resolve().parent.parent
CHUNK = 256 * 1024
SIZE = 16 * CHUNK + 1000  # 17 chunks, the last one short
NAME = "run/step_0001.pt"
STATE_DIR = ".commitstore/resume/"


class Case:
    """One prefix of the bucket: a store on it, its backdoor, writer subprocesses on it."""

    def __init__(self, server: FakeGcs) -> None:
        self.prefix = f"t{time.monotonic_ns()}"
        self.url = server.url(self.prefix)
        self.options = {**server.options(), "chunk_size": CHUNK}
        self.door = GcsBackdoor(server.endpoint, BUCKET, self.prefix)
        self.procs: list[subprocess.Popen[str]] = []

    def store(self) -> CommitStore:
        return open_store(self.url, **self.options)

    def writer(self, src: Path, at: str) -> subprocess.Popen[str]:
        """A ``put_file`` writer of ``src`` as ``NAME``, stopped at ``at`` (``WRITER_GCS_AT``);
        returned once it printed ``ready``."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.putwriter", self.url, NAME, str(src)],
            cwd=ROOT_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "WRITER_STORE_OPTIONS": json.dumps(self.options),
                "WRITER_GCS_AT": at,
            },
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc

    def states(self) -> list[dict[str, Any]]:
        found = [f for f in self.door.files() if f.startswith(STATE_DIR)]
        return [json.loads(self.door.read(f) or b"") for f in found]

    def committed(self) -> bytes | None:
        """The bytes under the name, checked against its record (both through the backdoor):
        either both are absent or the record's size and digest are the bytes'."""
        data = self.door.read(NAME)
        raw = self.door.read(record_path(NAME))
        if raw is None:
            assert data is None, "data under the name without a record"
            return None
        record = json.loads(raw)
        assert data is not None, "a record whose data is missing"
        assert (record["size"], record["digest"]) == (len(data), xxh(data))
        return data


def line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def go_on(proc: subprocess.Popen[str]) -> str:
    """Let a paused writer go on; its last line (``done`` or ``failed <type>: ...``)."""
    out, _ = proc.communicate("\n", timeout=120)
    return out.strip().splitlines()[-1]


def killed(proc: subprocess.Popen[str]) -> None:
    """Wait for a ``kill-after-chunk`` writer to SIGKILL itself."""
    assert proc.wait(120) == -signal.SIGKILL


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a paused writer."""
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL


@pytest.fixture
def case(gcs: FakeGcs) -> Iterator[Case]:
    c = Case(gcs)
    try:
        yield c
    finally:
        for proc in c.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)


def _file(tmp_path: Path, name: str, size: int) -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


def test_kill_with_a_chunk_in_flight_starts_over(case: Case, tmp_path: Path) -> None:
    """A writer SIGKILLed right after a chunk's answer, before its state said so: the server
    holds a chunk more than the state acknowledges, and cannot be asked. The next put starts
    over and commits the file's bytes (resuming at the state's offset would append that chunk
    twice)."""
    src = _file(tmp_path, "a.bin", SIZE)
    killed(case.writer(src, "kill-after-chunk:10"))
    (state,) = case.states()
    assert len(state["gcs"]["crc32c"]) * CHUNK == state["gcs"]["sent"] + CHUNK  # in flight
    record = case.store().put_file(NAME, src, overwrite=True)
    assert record.size == SIZE
    assert case.committed() == src.read_bytes()
    assert case.states() == []


def test_resume_never_loses_a_commit_made_meanwhile(case: Case, tmp_path: Path) -> None:
    """The attack's case: A killed with a chunk in flight; B goes to resume and stops before
    its next chunk; C commits the name in full; B goes on. C's commit is never lost: the name
    ends as one whole version matching its record (C's, or B's full copy of A's file)."""
    a, c = _file(tmp_path, "a.bin", SIZE), _file(tmp_path, "c.bin", 12 * CHUNK + 77)
    killed(case.writer(a, "kill-after-chunk:10"))
    b = case.writer(a, "pause-before-chunk:1")
    assert line(b) == "paused"
    case.store().put_file(NAME, c, overwrite=True)
    assert case.committed() == c.read_bytes()
    last = go_on(b)
    assert last == "done" or last.startswith("failed CommitError"), last
    assert case.committed() in (a.read_bytes(), c.read_bytes())
    assert case.committed() == (a.read_bytes() if last == "done" else c.read_bytes())


def test_commit_during_a_resume_is_never_replaced(case: Case, tmp_path: Path) -> None:
    """Two writers resume the same session from a state that says no chunk was in flight (a
    writer killed right after its state acknowledged chunk 8): D sends chunk 9 and is killed
    right after its answer; meanwhile C commits the name; B, resuming at chunk 9 too, sends it
    again (fake-gcs-server appends it: the session now holds bytes no source has). B's final
    request would replace C's object with them before any check: a fresh stat just before it
    finds C's object, and B fails with ``CommitError`` without finalising. C's commit stands."""
    a = _file(tmp_path, "a.bin", SIZE)
    first = case.writer(a, "pause-at-acked:8")
    assert line(first) == "paused"
    kill(first)
    b = case.writer(a, "pause-before-state:9")  # resumed from the state of 8 acknowledged
    assert line(b) == "paused"
    killed(case.writer(a, "kill-after-chunk:1"))  # D: resumed too, sent chunk 9
    case.store().put_bytes(NAME, b"committed by C", overwrite=True)
    last = go_on(b)
    assert case.committed() == b"committed by C"
    assert last.startswith("failed CommitError"), last
    assert "committed under the name" in last


def test_session_finalised_by_another_resumer_is_a_commit_error(case: Case, tmp_path: Path) -> None:
    """Two writers resume the same session; C finalises it, and B's next chunk is answered 404.
    B's write failed: a ``CommitError`` (never ``NotFoundError``: the name is committed)."""
    a = _file(tmp_path, "a.bin", SIZE)
    first = case.writer(a, "pause-at-acked:8")
    assert line(first) == "paused"
    kill(first)
    b = case.writer(a, "pause-before-state:9")
    assert line(b) == "paused"
    record = case.store().put_file(NAME, a, overwrite=True)  # C: resumes the same session
    assert record.size == SIZE
    last = go_on(b)
    assert last.startswith("failed CommitError"), last
    assert "session is gone" in last
    assert case.committed() == a.read_bytes()
