"""Scans stay right while another process overwrites (issue 12, item 7).

The original experiment: while a second process overwrites the newest artifact in a loop,
``latest()`` returned an older artifact in 266 of 400 tries and ``verify()`` reported a false
``size_mismatch`` in 207, although every read was correct. Here a real second process (forked
from the test process) overwrites the newest artifact with payloads of alternating sizes, so a
torn answer shows as a size mismatch, while this process calls ``latest()`` and ``verify()``.
Every answer must be right (the newest name, a digest of a version that was committed, no
mismatch), and the race must really have happened: the writer's commit count advanced while the
scans ran, between many pairs of consecutive scans, and some scans met a pending record.
"""

from __future__ import annotations

import mmap
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore import _verify as check_module
from commitstore.testing import xxh

from .helpers.s3servers import MotoServer

NEWEST = "run/step_5"
SIZES = (3000, 5000)


def payload(i: int) -> bytes:
    return bytes([i % 251]) * SIZES[i % 2]


@pytest.fixture
def overwriter() -> Iterator[Callable[[Callable[[], CommitStore]], mmap.mmap]]:
    """Start a forked process that overwrites NEWEST forever (commit count in shared memory,
    first 8 bytes); it is SIGKILLed at teardown."""
    pids: list[int] = []

    def start(reopen: Callable[[], CommitStore]) -> mmap.mmap:
        count = mmap.mmap(-1, 8)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.close(ready_r)
                store = reopen()
                i = 0
                while True:
                    i += 1
                    store.put_bytes(NEWEST, payload(i), overwrite=True)
                    count[:8] = i.to_bytes(8, "little")
                    if i == 2:
                        os.write(ready_w, b"r")
            finally:
                os._exit(0)
        pids.append(pid)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"r"
        os.close(ready_r)
        return count

    yield start
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def run_scans(
    store: CommitStore,
    count: mmap.mmap,
    *,
    commits_wanted: int,
    max_tries: int,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, int]:
    """Scan (``latest`` then ``verify``) until the writer has committed ``commits_wanted`` times
    during the scans and a scan has met a pending record, or ``max_tries`` pairs were made."""
    pending_seen = [0]
    original = check_module.pending_versions

    def pending_versions(backend: Any, record: Any) -> Any:
        found = original(backend, record)
        pending_seen[0] += bool(found)
        return found

    monkeypatch.setattr(check_module, "pending_versions", pending_versions)
    valid = {xxh(payload(i)) for i in range(1, 251 * 2)}

    def commits() -> int:
        return int.from_bytes(count[:8], "little")

    first = last = commits()
    moved = wrong_latest = wrong_verify = tries = 0
    digests = set()
    while tries < max_tries and (last - first < commits_wanted or not pending_seen[0]):
        tries += 1
        found = store.latest()
        if found is None or found.name != NEWEST or found.digest not in valid:
            wrong_latest += 1
        else:
            digests.add(found.digest)
        report = store.verify()
        wrong_verify += sum(r.status != "ok" for r in report.results)
        now = commits()
        moved += now != last
        last = now
    return {
        "tries": tries,
        "commits": last - first,
        "moved": moved,
        "pending_seen": pending_seen[0],
        "wrong_latest": wrong_latest,
        "wrong_verify": wrong_verify,
        "digests": len(digests),
    }


def seed(store: CommitStore, older: int) -> None:
    for step in range(5 - older, 5):
        store.put_bytes(f"run/step_{step}", b"older %d" % step * 100)
    store.put_bytes(NEWEST, payload(0))


def check(stats: dict[str, int], commits_wanted: int) -> None:
    assert stats["wrong_latest"] == 0 and stats["wrong_verify"] == 0, stats
    # The race really overlapped: the wanted commits landed during the scans, between
    # consecutive scans; scans returned several versions and met pending records.
    assert stats["commits"] >= commits_wanted and stats["moved"] > 1, stats
    assert stats["digests"] > 1 and stats["pending_seen"] > 0, stats


def test_scans_under_an_overwriting_process_local(
    tmp_path: Path, overwriter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    seed(store, 4)
    count = overwriter(lambda: open_store(root))
    stats = run_scans(store, count, commits_wanted=50, max_tries=3000, monkeypatch=monkeypatch)
    check(stats, 50)


def test_scans_under_an_overwriting_process_s3(
    moto: MotoServer, overwriter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, opts = moto.url(f"race{time.monotonic_ns()}"), {**moto.options()}
    store = open_store(url, **opts)
    seed(store, 1)
    opts["conditional_writes"] = store.describe()["conditional_writes"]
    count = overwriter(lambda: open_store(url, **opts))
    stats = run_scans(store, count, commits_wanted=5, max_tries=60, monkeypatch=monkeypatch)
    check(stats, 5)
