"""A folder artifact's files on an object store go up several at a time (small ones), and a
failure among them leaves nothing of the folder: every file uploaded, including those still in
flight when another failed, is taken back before the error reaches the caller
(``backends/object/dirsink.py``: ``AT_ONCE``, ``SMALL``). On moto, read through a backdoor."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore.backends.object import dirsink
from commitstore.errors import BackendUnavailableError
from commitstore.testing import S3Backdoor, record_path

from .helpers.s3servers import BUCKET, MotoServer


def _store(moto: MotoServer) -> tuple[CommitStore, S3Backdoor]:
    store = open_store(moto.url(f"fold{time.monotonic_ns()}"), **moto.options())
    prefix = store.url.split(f"s3://{BUCKET}/", 1)[1]
    return store, S3Backdoor(moto.client(), BUCKET, prefix)


def _fill(d: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)


def _member(parts: tuple[str, ...]) -> str | None:
    """The file's path inside folder ``f/ck``, when ``parts`` is one of its final keys."""
    return "/".join(parts[2:]) if parts[:2] == ("f", "ck") else None


SMALL_FILES = {f"d{i % 3}/s{i:02d}.bin": bytes([i]) * (1000 + i) for i in range(24)}


class OpenUploads:
    """Wraps ``backend.open_sink``: counts the uploads of folder ``f/ck``'s files that
    ``counts`` selects, each from its opening until its publish returns; :attr:`most` is the
    largest number open at one moment. ``on_open(n)`` runs, outside the lock, before the n-th
    counted upload (from 0) opens."""

    def __init__(
        self,
        backend: Any,
        counts: Callable[[str], bool],
        on_open: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.most = 0
        self._open = self._opened = 0
        self._lock = threading.Lock()
        original = backend.open_sink

        def counted(parts: tuple[str, ...], **kw: Any) -> Any:
            rel = _member(parts)
            if rel is None or not counts(rel):
                return original(parts, **kw)
            with self._lock:
                self._open += 1
                self.most = max(self.most, self._open)
                n, self._opened = self._opened, self._opened + 1
            on_open(n)
            sink = original(parts, **kw)
            publish = sink.publish

            def published(**pkw: Any) -> Any:
                try:
                    return publish(**pkw)
                finally:
                    with self._lock:
                        self._open -= 1

            sink.publish = published
            return sink

        backend.open_sink = counted


def test_small_files_go_up_together_and_land_whole(moto: MotoServer) -> None:
    """Two uploads must be open at the same moment (a barrier of two that a one-at-a-time
    upload would never pass), and never more than AT_ONCE."""
    store, door = _store(moto)
    meet = threading.Barrier(2, timeout=30)

    def first_two_meet(n: int) -> None:
        if n < 2:
            meet.wait()  # BrokenBarrierError (the commit fails) if no second upload comes

    uploads = OpenUploads(store._backend, lambda rel: True, first_two_meet)
    with store.stage_dir("f/ck") as d:
        _fill(d, SMALL_FILES)
    assert 2 <= uploads.most <= dirsink.AT_ONCE
    assert {f for f in door.files() if f.startswith("f/ck/")} == {
        f"f/ck/{rel}" for rel in SMALL_FILES
    }
    for rel, data in SMALL_FILES.items():
        assert door.read(f"f/ck/{rel}") == data
    assert open_store(store.url, **moto.options()).verify("f/ck", level="full").ok


def test_a_failed_file_takes_back_every_file_including_those_in_flight(
    moto: MotoServer,
) -> None:
    """One file's upload fails while another of the first AT_ONCE is held in flight until
    after the failure: the commit raises that failure, only after the held upload finished and
    was taken back with every other uploaded file; the thread whose upload failed starts no
    further file; no upload thread is left."""
    store, door = _store(moto)
    backend: Any = store._backend
    original = backend.open_sink
    failed = threading.Event()
    held_done = threading.Event()
    lock = threading.Lock()
    calls: list[tuple[int, str]] = []  # (thread, file) of each upload started, in order
    victim, held = "d0/s03.bin", "d0/s00.bin"  # both among the first AT_ONCE files

    def faulty(parts: tuple[str, ...], **kw: Any) -> Any:
        rel = _member(parts)
        if rel is None:
            return original(parts, **kw)
        with lock:
            calls.append((threading.get_ident(), rel))
        if rel == victim:
            failed.set()
            raise BackendUnavailableError("network gone")
        sink = original(parts, **kw)
        if rel == held:
            assert failed.wait(30), "the failing upload never ran beside this one"
            publish = sink.publish

            def late(**pkw: Any) -> Any:
                try:
                    return publish(**pkw)
                finally:
                    held_done.set()

            sink.publish = late
        return sink

    backend.open_sink = faulty
    with (
        pytest.raises(BackendUnavailableError, match="network gone"),
        store.stage_dir("f/ck") as d,
    ):
        _fill(d, SMALL_FILES)
    assert held_done.is_set(), "the error reached the caller before the held upload finished"
    failing_thread = next(t for t, rel in calls if rel == victim)
    after = calls[calls.index((failing_thread, victim)) + 1 :]
    assert not [rel for t, rel in after if t == failing_thread], "a file started after the failure"
    assert not [f for f in door.files() if f.startswith("f/ck")]
    assert door.read(record_path("f/ck")) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("commitstore-folder")]
    assert open_store(store.url, **moto.options()).latest() is None


class _InterruptedPool(concurrent.futures.ThreadPoolExecutor):
    """A pool whose fourth submit raises KeyboardInterrupt (a Ctrl-C while the files are
    handed to the upload threads, the first three already uploading)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.count = getattr(self, "count", 0) + 1
        if self.count == 4:
            raise KeyboardInterrupt
        return super().submit(fn, *args, **kwargs)


def test_an_interrupt_while_files_are_handed_out_takes_back_those_uploaded(
    moto: MotoServer, monkeypatch: Any
) -> None:
    store, door = _store(moto)
    monkeypatch.setattr(dirsink, "_Pool", _InterruptedPool)
    with pytest.raises(KeyboardInterrupt), store.stage_dir("f/ck") as d:
        _fill(d, SMALL_FILES)
    monkeypatch.undo()
    assert not [f for f in door.files() if f.startswith("f/ck")]
    assert door.read(record_path("f/ck")) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("commitstore-folder")]


CHILD = """
import json, sys, threading, time
from commitstore import open_store

store = open_store(sys.argv[1], **json.loads(sys.argv[2]))
store.list()

def job():
    while threading.main_thread().is_alive():  # until the interpreter's shutdown began
        time.sleep(0.01)
    with store.stage_dir("f/ck") as d:
        for i in range(5):
            (d / f"s{i}.bin").write_bytes(bytes([i]) * 1000)
    print("COMMITTED", flush=True)

threading.Thread(target=job).start()  # not a daemon: the interpreter waits for it
"""


def test_a_folder_committed_while_the_interpreter_shuts_down_still_commits(
    moto: MotoServer,
) -> None:
    """A thread that commits a folder after the main thread returned (no new thread may start
    then): its files go up one after another and the folder commits."""
    store, door = _store(moto)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, store.url, json.dumps(moto.options())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.stdout.strip() == "COMMITTED", out.stderr[-2000:]
    for i in range(5):
        assert door.read(f"f/ck/s{i}.bin") == bytes([i]) * 1000
    assert open_store(store.url, **moto.options()).verify("f/ck", level="full").ok


def test_large_files_go_up_one_at_a_time(moto: MotoServer, monkeypatch: Any) -> None:
    """Files over SMALL never overlap one another (each has its own parts in flight); the
    small ones of the same folder still land."""
    monkeypatch.setattr(dirsink, "SMALL", 64 * 1024)
    large = {f"big{i}.bin": bytes([i]) * (200 * 1024) for i in range(3)}
    files = {**large, **{rel: SMALL_FILES[rel] for rel in list(SMALL_FILES)[:6]}}
    store, door = _store(moto)
    uploads = OpenUploads(store._backend, lambda rel: rel in large)
    with store.stage_dir("f/ck") as d:
        _fill(d, files)
    assert uploads.most == 1
    for rel, data in files.items():
        assert door.read(f"f/ck/{rel}") == data
    assert open_store(store.url, **moto.options()).verify("f/ck", level="full").ok


def test_a_replace_copies_its_staged_files_together_and_lands_whole(moto: MotoServer) -> None:
    """A folder replace's first server-side copy runs alone (the first change to the final keys
    is one known file), the others several at once (a barrier of two that one copy after
    another never passes); every final key then holds the new version and nothing of the old
    one or of the staged copy is left."""
    store, door = _store(moto)
    old = {rel: data[::-1] + b"old" for rel, data in SMALL_FILES.items()}
    old["old-only.bin"] = b"gone after the replace"
    with store.stage_dir("f/ck") as d:
        _fill(d, old)
    backend: Any = store._backend
    original = backend.copy_checked
    meet = threading.Barrier(2, timeout=30)
    lock = threading.Lock()
    calls = [0]

    first_done = threading.Event()

    def copy_checked(*args: Any, **kw: Any) -> Any:
        with lock:
            calls[0] += 1
            n = calls[0]
        if n == 1:  # the first copy alone: the first change is one known file
            got = original(*args, **kw)
            first_done.set()
            return got
        assert first_done.is_set(), "a copy started before the first one finished"
        if n <= 3:
            meet.wait()  # BrokenBarrierError (the replace fails) if no other copy comes
        return original(*args, **kw)

    backend.copy_checked = copy_checked
    with store.stage_dir("f/ck", overwrite=True) as d:
        _fill(d, SMALL_FILES)
    assert calls[0] == len(SMALL_FILES)
    assert {f for f in door.files() if f.startswith("f/ck/")} == {
        f"f/ck/{rel}" for rel in SMALL_FILES
    }
    for rel, data in SMALL_FILES.items():
        assert door.read(f"f/ck/{rel}") == data
    assert not [f for f in door.files() if f.startswith(".commitstore/staged/")]
    assert open_store(store.url, **moto.options()).verify("f/ck", level="full").ok


def test_a_replace_streams_files_over_the_copy_limit_one_at_a_time(moto: MotoServer) -> None:
    """Files larger than the store copies server-side are streamed through the client by the
    replace's copy, one at a time (each holds a reader and a sink), the others together."""
    store, door = _store(moto)
    big = {f"big{i}.bin": bytes([i]) * 3000 for i in range(3)}
    files = {**big, **{rel: SMALL_FILES[rel] for rel in list(SMALL_FILES)[:6]}}
    with store.stage_dir("f/ck") as d:
        _fill(d, {rel: data + b"old" for rel, data in files.items()})
    backend: Any = store._backend
    backend.copy_max = 2500  # the big files are over it
    original = backend.copy_checked
    lock = threading.Lock()
    state = {"open": 0, "most": 0, "big": 0}

    def copy_checked(*args: Any, **kw: Any) -> Any:
        streamed = kw["size"] > backend.copy_max
        with lock:
            if streamed:
                state["big"] += 1
                state["open"] += 1
                state["most"] = max(state["most"], state["open"])
        try:
            return original(*args, **kw)
        finally:
            if streamed:
                with lock:
                    state["open"] -= 1

    backend.copy_checked = copy_checked
    with store.stage_dir("f/ck", overwrite=True) as d:
        _fill(d, files)
    assert state["big"] == len(big) and state["most"] == 1
    for rel, data in files.items():
        assert door.read(f"f/ck/{rel}") == data
    assert open_store(store.url, **moto.options()).verify("f/ck", level="full").ok
