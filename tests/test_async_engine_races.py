"""Where the asynchronous commit engine meets other calls: ``close()`` while a snapshot is being
taken, ``flush()``/``close()`` from a future's done-callback, and ``fork()`` while a commit is
in flight. Real threads and a real forked process; what landed is read from the raw files.

Each was a bug: a commit whose snapshot was being taken when ``close()`` was called was queued
after the worker stopped (its future never resolved, nothing warned); ``flush()`` in a callback
waited for the worker thread running it (later commits never ran, and the exit warning named a
commit that had landed); a forked child's ``flush``/``close``/next commit waited forever for
the parent's job.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store
from commitstore.errors import ConfigurationError

_WAIT = 60.0


def _landed(root: Path, name: str, data: bytes) -> bool:
    """``name`` is committed with ``data``: its file holds it and its record exists (raw)."""
    records = root / ".commitstore" / "records"
    rec = [
        p
        for p in records.rglob(".commitstore.rec.*")
        if json.loads(p.read_bytes()).get("name") == name
    ]
    return (root / name).is_file() and (root / name).read_bytes() == data and len(rec) == 1


def _write(snap: bytes, f: Any) -> None:
    f.write(snap)


def _held_until(release: threading.Event) -> Any:
    """A ``write`` that waits for ``release`` before it writes (a commit held in flight)."""

    def write(snap: bytes, f: Any) -> None:
        assert release.wait(_WAIT)
        f.write(snap)

    return write


def test_close_waits_for_a_commit_whose_snapshot_is_being_taken(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.commit_async("warm.bin", lambda: b"w", _write).result(_WAIT)
    taking, go = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def snapshot() -> bytes:
        taking.set()
        assert go.wait(_WAIT)
        return b"x" * 1000

    def commit() -> None:
        box["future"] = store.commit_async("a.bin", snapshot, _write)

    committer = threading.Thread(target=commit)
    committer.start()
    assert taking.wait(_WAIT)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive(), "close() returned while a commit's snapshot was being taken"
    go.set()
    committer.join(_WAIT)
    closer.join(_WAIT)
    assert not closer.is_alive()
    assert box["future"].result(_WAIT).name == "a.bin"
    assert _landed(tmp_path, "a.bin", b"x" * 1000)
    with pytest.raises(ConfigurationError):
        store.commit_async("late.bin", lambda: b"l", _write)


def test_every_close_waits_for_the_commit_in_flight(tmp_path: Path) -> None:
    """Two threads close the store while a commit is being written: neither returns before
    it landed. (Was a bug: the second close() returned at once.)"""
    store = open_store(tmp_path)
    release = threading.Event()
    slow_write = _held_until(release)

    future = store.commit_async("a.bin", lambda: b"a", slow_write)
    first = threading.Thread(target=store.close)
    first.start()
    second = threading.Thread(target=store.close)
    second.start()
    second.join(0.5)
    assert second.is_alive(), "a second close() returned while a commit was in flight"
    release.set()
    for t in (first, second):
        t.join(_WAIT)
        assert not t.is_alive()
    assert future.result(_WAIT).name == "a.bin"
    assert _landed(tmp_path, "a.bin", b"a")


@pytest.mark.parametrize("call", ["flush", "close"])
def test_flush_or_close_in_a_done_callback_is_refused_not_a_deadlock(
    tmp_path: Path, call: str
) -> None:
    store = open_store(tmp_path)
    release = threading.Event()
    seen: list[BaseException | None] = []
    slow_write = _held_until(release)

    def callback(_fut: Any) -> None:
        try:
            getattr(store, call)()
            seen.append(None)
        except BaseException as exc:
            seen.append(exc)

    future = store.commit_async("a.bin", lambda: b"a", slow_write)
    future.add_done_callback(callback)  # before it ends: run on the worker thread
    release.set()
    assert future.result(_WAIT).name == "a.bin"
    store.flush(_WAIT)  # the callback has run by now (it runs before the worker goes on)
    assert len(seen) == 1 and isinstance(seen[0], ConfigurationError), seen
    later = store.commit_async("b.bin", lambda: b"b", _write)
    assert later.result(_WAIT).name == "b.bin"
    store.close()
    assert _landed(tmp_path, "a.bin", b"a") and _landed(tmp_path, "b.bin", b"b")


def test_a_forked_child_does_not_wait_for_the_parents_commit(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    release = threading.Event()
    slow_write = _held_until(release)

    future = store.commit_async("parent.bin", lambda: b"p", slow_write)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every step bounded by an alarm, its outcome through the pipe
        os.close(read_end)
        out: dict[str, Any] = {}
        try:
            signal.alarm(int(_WAIT))
            store.flush(_WAIT)
            out["flushed"] = True
            rec = store.commit_async("child.bin", lambda: b"c", _write).result(_WAIT)
            out["child"] = rec.name
            from commitstore import _background

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _background._exit_flush_all(final=True)
            out["warned"] = [str(w.message) for w in caught]
            store.close()
            out["closed"] = True
        except BaseException as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        os.write(write_end, json.dumps(out).encode())
        os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as r:
            got = json.loads(r.read() or b"{}")
    finally:
        _, status = os.waitpid(pid, 0)
    release.set()
    assert future.result(_WAIT).name == "parent.bin"
    store.close()
    assert status == 0
    assert got.get("error") is None, got
    assert got == {"flushed": True, "child": "child.bin", "warned": [], "closed": True}
    assert _landed(tmp_path, "parent.bin", b"p") and _landed(tmp_path, "child.bin", b"c")


def test_a_forked_child_with_a_mirror_copy_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store with a background mirror forks while a copy to it is in flight (held at its
    start). The copy is the parent's: the child's ``flush()`` neither waits for it nor reports
    it failed (was: "not replicated ... replication thread stopped", and MirrorError under
    ``required``), and the child's own commit reaches the mirror through a worker of its own
    (was: only journaled). The parent's copy lands too."""
    from commitstore.mirrors import replicator

    held = threading.Event()
    real = getattr(replicator, "copy_with_retries")  # noqa: B009 (not re-exported)

    def held_copy(*a: Any, **k: Any) -> Any:
        assert held.wait(_WAIT)
        return real(*a, **k)

    monkeypatch.setattr(replicator, "copy_with_retries", held_copy)
    primary, mirror = tmp_path / "p", tmp_path / "m"
    store = open_store(primary, mirrors=[str(mirror)], mirror_policy="required")
    store.put_bytes("parent.bin", b"p")  # its copy waits for ``held``
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        out: dict[str, Any] = {}
        try:
            signal.alarm(int(_WAIT))
            held.set()  # the child's own copies go at once
            store.flush(_WAIT)
            out["flushed"] = True
            store.put_bytes("child.bin", b"c")
            store.flush(_WAIT)
            out["child copied"] = (mirror / "child.bin").read_bytes().decode()
            store.close()
        except BaseException as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        os.write(write_end, json.dumps(out).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        got = json.loads(r.read() or b"{}")
    os.waitpid(pid, 0)
    held.set()
    store.close()
    assert got == {"flushed": True, "child copied": "c"}, got
    assert _landed(mirror, "parent.bin", b"p") and _landed(mirror, "child.bin", b"c")
