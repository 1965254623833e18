"""Owed copies survive the process: a copy handed off (its mirror takes none) or failed gets an
entry in the owed journal on the primary (``.commitstore/owed/``); the next store opened with
that mirror completes it, with a warning; a delivered copy, ``sync()``, or a name the primary no
longer holds removes the entry. Entries are untrusted input: damaged ones are ignored with a
warning, never an error of ``open_store``; gc, prune, list and verify never touch them.

The crash case is a real process SIGKILLed with copies owed to a blackholed S3 mirror; the next
process, the mirror now reachable (moto), delivers them, counted on the mirror through a
backdoor."""

from __future__ import annotations

import json
import logging
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

from commitstore import open_store
from commitstore.mirrors import copy as copy_mod
from commitstore.mirrors import journal
from commitstore.testing import LocalBackdoor, S3Backdoor

from .helpers.blackhole import Blackhole
from .helpers.s3servers import BUCKET, MotoServer

ROOT_DIR = Path(__file__).resolve().parent.parent
BOUND = 120.0
"""Outer bound (seconds) on waits for a child process: far above what any step needs."""
OWED = 4

CHILD = """
import json, sys, time
from commitstore import open_store

root, mirror_url, opts, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
store = open_store(root, mirrors=[open_store(mirror_url, **opts)], mirror_queue=1)
for i in range(n):
    store.put_bytes(f"step_{i}.pt", bytes([i + 1]) * (1000 + i))
print("committed", flush=True)
time.sleep(3600)  # SIGKILLed here: no close, no exit flush
"""


def _entries(root: Path) -> list[Path]:
    owed = root / ".commitstore" / "owed"
    return sorted(p for p in owed.rglob("*.json") if p.is_file()) if owed.exists() else []


def _wait_for(what: str, test: Any, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until ``test()`` holds (outer bound only: a child that never gets there is stuck)."""
    deadline = time.monotonic() + BOUND
    while not test():
        assert proc is None or proc.poll() is None, f"the child ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {BOUND}s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


def test_copies_owed_by_a_sigkilled_process_are_completed_by_the_next_start(
    tmp_path: Path, moto: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    primary = tmp_path / "p"
    prefix = f"m{time.monotonic_ns()}"
    mirror_url = moto.url(prefix)
    quick = {"connect_timeout": 1, "read_timeout": 1, "retries": 1}
    with Blackhole() as hole:
        env = {
            **os.environ,
            "COMMITSTORE_MIRROR_HANDOFF_SECONDS": "0.2",
            "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT_DIR / "src")),
        }
        opts = {"endpoint_url": hole.url, "key": "k", "secret": "s", **quick}
        args = [sys.executable, "-c", CHILD, str(primary), mirror_url, json.dumps(opts), str(OWED)]
        child = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, cwd=ROOT_DIR)
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"committed"
            # every copy is owed: handed off (the queue stayed full) or failed (timed out)
            _wait_for(f"{OWED} journal entries", lambda: len(_entries(primary)) == OWED, child)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    assert child.returncode == -signal.SIGKILL
    assert hole.accepted >= 1  # the child did try the blackholed mirror
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    names = [f"step_{i}.pt" for i in range(OWED)]
    assert [n for n in names if door.read(n) is not None] == []

    mirror = open_store(mirror_url, **moto.options())
    said = f"{OWED} copies owed to .* earlier run"
    with caplog.at_level(logging.WARNING, logger="commitstore"), pytest.warns(match=said):
        store = open_store(primary, mirrors=[mirror])
    assert any("are being completed" in r.getMessage() for r in caplog.records)
    store.flush()
    assert [door.read(n) for n in names] == [bytes([i + 1]) * (1000 + i) for i in range(OWED)]
    assert mirror.verify().ok
    assert [r.name for r in mirror.list()] == names
    assert _entries(primary) == []  # delivered: the journal is empty
    [state] = store.mirror_status()
    assert state.owed == 0 and state.missing == ()
    store.close()


def _stalled_local_mirror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, Any]:
    """Copies to any local mirror wait until the event is set."""
    release = threading.Event()
    real = copy_mod.copy_artifact

    def held(src: Any, dst: Any, name: str, **kw: Any) -> Any:
        release.wait()
        return real(src, dst, name, **kw)

    monkeypatch.setattr(copy_mod, "copy_artifact", held)
    monkeypatch.setenv("COMMITSTORE_MIRROR_HANDOFF_SECONDS", "0.2")
    return release, held


def test_a_handed_off_copy_is_journaled_until_delivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, _ = _stalled_local_mirror(tmp_path, monkeypatch)
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")], mirror_queue=1)
    names = [f"step_{i}.pt" for i in range(4)]
    for name in names:
        store.put_bytes(name, name.encode())
    rep = store._replicator
    assert rep is not None
    handed = set(rep.workers[0].journaled)
    assert handed and handed <= set(names)  # the hand-offs, journaled on the primary
    assert len(_entries(tmp_path / "p")) == len(handed)
    docs = [json.loads(p.read_bytes()) for p in _entries(tmp_path / "p")]
    assert {d["name"] for d in docs} == handed
    assert {d["mirror"] for d in docs} == {str(tmp_path / "m")}
    assert all(d["digest"] == store.record(d["name"]).digest for d in docs)
    release.set()
    store.flush()
    assert _entries(tmp_path / "p") == []
    door = LocalBackdoor(tmp_path / "m")
    assert [door.read(n) for n in names] == [n.encode() for n in names]
    store.close()


def _journal_by_hand(root: Path, mirror: str, names: list[str]) -> None:
    """Entries as an earlier process would have left them."""
    for name in names:
        path = root.joinpath(*journal.entry_parts(mirror, name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(journal.encode(mirror, name, None, time.time()))


def test_sync_mode_reports_journaled_copies_and_sync_clears_them(tmp_path: Path) -> None:
    root, mirror = tmp_path / "p", str(tmp_path / "m")
    plain = open_store(root)
    for i in range(3):
        plain.put_bytes(f"step_{i}.pt", bytes([i]) * 10)
    _journal_by_hand(root, mirror, ["step_0.pt", "step_2.pt"])
    with pytest.warns(RuntimeWarning, match="2 copies owed to .* wait for sync"):
        store = open_store(root, mirrors=[mirror], mirror_mode="sync")
    [state] = store.mirror_status()
    assert set(state.failed) == {"step_0.pt", "step_2.pt"}
    assert state.owed == 3  # two journaled, one more the mirror lacks
    report = store.sync()
    assert report.ok
    assert _entries(root) == []
    [state] = store.mirror_status()
    assert state.owed == 0 and state.failed == {}
    store.close()


def test_entries_of_names_the_primary_no_longer_holds_are_dropped(tmp_path: Path) -> None:
    root, mirror = tmp_path / "p", str(tmp_path / "m")
    open_store(root).put_bytes("kept.pt", b"k")
    _journal_by_hand(root, mirror, ["kept.pt", "deleted.pt"])
    with pytest.warns(RuntimeWarning, match="1 copies owed"):
        store = open_store(root, mirrors=[mirror])
    store.flush()
    assert _entries(root) == []
    assert LocalBackdoor(tmp_path / "m").read("kept.pt") == b"k"
    assert LocalBackdoor(tmp_path / "m").read("deleted.pt") is None
    store.close()


def test_damaged_entries_are_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, mirror = tmp_path / "p", str(tmp_path / "m")
    open_store(root).put_bytes("a.pt", b"a")
    folder = root.joinpath(*journal.mirror_dir(mirror))
    folder.mkdir(parents=True)

    def entry(name: str, **doc: Any) -> bytes:
        return json.dumps(
            {"schema": journal.SCHEMA, "mirror": mirror, "name": name, **doc}
        ).encode()

    # each filed under the key of the name it names, so only its own defect can reject it
    bad: dict[str, tuple[str, bytes]] = {
        "not-json": ("b.pt", b"{"),
        "oversized": ("c.pt", b" " * journal.MAX_ENTRY_BYTES + entry("c.pt", since=1.0)),
        "other-mirror": ("d.pt", journal.encode("/elsewhere", "d.pt", None, 1.0)),
        "bad-name": ("../e", journal.encode(mirror, "../e", None, 1.0)),
        "no-time": ("f.pt", entry("f.pt")),
        "bad-digest": ("g.pt", entry("g.pt", since=1.0, digest=7)),
        "other-schema": ("h.pt", entry("h.pt", since=1.0, schema="x")),
        "nested": ("i.pt", b"[" * 100_000 + b"]" * 100_000),
        "misfiled": ("j.pt", journal.encode(mirror, "a.pt", None, 1.0)),
    }
    for name, body in bad.values():
        (folder / journal.name_key(name)).write_bytes(body)
    for name in "bcdfghij":  # the primary holds every name an entry could have named
        open_store(root).put_bytes(f"{name}.pt", name.encode())
    (folder / "sub").mkdir()
    os.mkfifo(folder / ("f" * 32 + ".json"))  # never opened (it would block)
    with caplog.at_level(logging.WARNING, logger="commitstore"):
        store = open_store(root, mirrors=[mirror])
    said = [r.getMessage() for r in caplog.records if "damaged entries" in r.getMessage()]
    assert said and said[0].startswith(f"{len(bad)} damaged entries")
    rep = store._replicator
    assert rep is not None and rep.workers[0].pending == []
    store.flush()
    door = LocalBackdoor(tmp_path / "m")
    assert [n for n in "abcdfghij" if door.read(f"{n}.pt") is not None] == []  # nothing owed
    assert len(_entries(root)) == len(bad)  # ignored, not removed
    store.close()


def test_maintenance_leaves_the_journal_alone(tmp_path: Path) -> None:
    root, mirror = tmp_path / "p", str(tmp_path / "m")
    store = open_store(root)
    for i in range(3):
        store.put_bytes(f"step_{i}.pt", bytes([i]) * 10)
    _journal_by_hand(root, mirror, ["step_0.pt"])
    old = time.time() - 10 * 86400
    for p in _entries(root):
        os.utime(p, (old, old))
    before = _entries(root)
    assert [r.name for r in store.list()] == ["step_0.pt", "step_1.pt", "step_2.pt"]
    assert store.verify().ok
    gc = store.gc(min_age=0)
    assert not any("owed" in item.path for item in (*gc.removed, *gc.kept))
    store.prune(keep_last=3, min_age=0)
    assert _entries(root) == before


EXITING = """
import sys, threading
import commitstore.mirrors.copy as c
from commitstore import open_store

def stuck(src, dst, name, **kw):  # the mirror never takes a copy
    threading.Event().wait()
c.copy_artifact = stuck

store = open_store(sys.argv[1], mirrors=[sys.argv[2]])
for i in range(3):
    store.put_bytes(f"step_{i}.pt", bytes([i + 1]) * 100)
print("committed", flush=True)
# no close(): the exit flush runs out of its bound with every copy still owed
"""


def test_copies_the_exit_flush_could_not_make_are_journaled(tmp_path: Path) -> None:
    root, mirror = tmp_path / "p", str(tmp_path / "m")
    env = {
        **os.environ,
        "COMMITSTORE_EXIT_FLUSH_SECONDS": "0.5",
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT_DIR / "src")),
    }
    done = subprocess.run(
        [sys.executable, "-c", EXITING, str(root), mirror],
        env=env,
        cwd=ROOT_DIR,
        capture_output=True,
        timeout=BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"owed" in done.stderr  # the exit warning says where they are
    names = [f"step_{i}.pt" for i in range(3)]
    assert sorted(json.loads(p.read_bytes())["name"] for p in _entries(root)) == names
    with pytest.warns(RuntimeWarning, match="3 copies owed"):
        store = open_store(root, mirrors=[mirror])
    store.flush()
    door = LocalBackdoor(tmp_path / "m")
    assert [door.read(n) for n in names] == [bytes([i + 1]) * 100 for i in range(3)]
    assert _entries(root) == []
    store.close()


QUEUED = """
import sys, threading
import commitstore.mirrors.copy as c
from commitstore import open_store

started = threading.Event()
def stuck(src, dst, name, **kw):  # the first copy never ends; the others wait in the queue
    started.set()
    threading.Event().wait()
c.copy_artifact = stuck

store = open_store(sys.argv[1], mirrors=[sys.argv[2]], mirror_queue=16)
for i in range(3):
    store.put_bytes(f"step_{i}.pt", bytes([i + 1]) * 100)
started.wait()
print("committed", flush=True)
threading.Event().wait()  # SIGKILLed here: one copy in flight, two queued, none handed off
"""


def test_copies_queued_when_the_process_is_sigkilled_are_completed_by_the_next_start(
    tmp_path: Path,
) -> None:
    root, mirror = tmp_path / "p", str(tmp_path / "m")
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT_DIR / "src"))}
    args = [sys.executable, "-c", QUEUED, str(root), mirror]
    child = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, cwd=ROOT_DIR)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"committed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    names = [f"step_{i}.pt" for i in range(3)]
    door = LocalBackdoor(tmp_path / "m")
    assert [n for n in names if door.read(n) is not None] == []
    assert len(_entries(root)) == 3  # queued and in flight: each journaled before it was queued
    with pytest.warns(match="3 copies owed to .* earlier run"):
        store = open_store(root, mirrors=[mirror])
    store.flush()
    assert [door.read(n) for n in names] == [bytes([i + 1]) * 100 for i in range(3)]
    assert _entries(root) == []
    store.close()
