"""A folder artifact's files on an object store go up several at a time (small ones), and a
failure among them leaves nothing of the folder: every file uploaded, including those still in
flight when another failed, is taken back before the error reaches the caller
(``backends/object/dirsink.py``: ``AT_ONCE``, ``SMALL``). On moto, read through a backdoor."""

from __future__ import annotations

import threading
import time
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


def test_small_files_go_up_together_and_land_whole(moto: MotoServer) -> None:
    """Two uploads must be open at the same moment (a barrier of two that a one-at-a-time
    upload would never pass), and never more than AT_ONCE."""
    store, door = _store(moto)
    backend: Any = store._backend
    original = backend.open_sink
    meet = threading.Barrier(2, timeout=30)
    lock = threading.Lock()
    state = {"open": 0, "most": 0, "met": 0}

    def counted(parts: tuple[str, ...], **kw: Any) -> Any:
        if _member(parts) is None:
            return original(parts, **kw)
        with lock:
            state["open"] += 1
            state["most"] = max(state["most"], state["open"])
            first_two = state["met"] < 2
            state["met"] += 1
        if first_two:
            meet.wait()  # BrokenBarrierError (the commit fails) if no second upload comes
        sink = original(parts, **kw)
        publish = sink.publish

        def published(**pkw: Any) -> Any:
            try:
                return publish(**pkw)
            finally:
                with lock:
                    state["open"] -= 1

        sink.publish = published
        return sink

    backend.open_sink = counted
    with store.stage_dir("f/ck") as d:
        _fill(d, SMALL_FILES)
    assert 2 <= state["most"] <= dirsink.AT_ONCE
    assert {f for f in door.files() if f.startswith("f/ck/")} == {
        f"f/ck/{rel}" for rel in SMALL_FILES
    }
    for rel, data in SMALL_FILES.items():
        assert door.read(f"f/ck/{rel}") == data
    assert open_store(store.url, **moto.options()).verify("f/ck", level="full").ok


def test_a_failed_file_takes_back_every_file_including_those_in_flight(
    moto: MotoServer,
) -> None:
    """One file's upload fails while another is held in flight until after the failure: the
    commit raises that failure, and only after the held upload finished and was taken back
    with every other uploaded file; no upload thread is left."""
    store, door = _store(moto)
    backend: Any = store._backend
    original = backend.open_sink
    failed = threading.Event()
    held_done = threading.Event()
    victim, held = "d0/s03.bin", "d1/s01.bin"

    def faulty(parts: tuple[str, ...], **kw: Any) -> Any:
        rel = _member(parts)
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
    assert not [f for f in door.files() if f.startswith("f/ck")]
    assert door.read(record_path("f/ck")) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("commitstore-folder")]
    assert open_store(store.url, **moto.options()).latest() is None


def test_large_files_go_up_one_at_a_time(moto: MotoServer, monkeypatch: Any) -> None:
    """Files over SMALL never overlap one another (each has its own parts in flight); the
    small ones of the same folder still land."""
    monkeypatch.setattr(dirsink, "SMALL", 64 * 1024)
    large = {f"big{i}.bin": bytes([i]) * (200 * 1024) for i in range(3)}
    files = {**large, **{rel: SMALL_FILES[rel] for rel in list(SMALL_FILES)[:6]}}
    store, door = _store(moto)
    backend: Any = store._backend
    original = backend.open_sink
    lock = threading.Lock()
    state = {"open": 0, "most": 0}

    def counted(parts: tuple[str, ...], **kw: Any) -> Any:
        rel = _member(parts)
        if rel not in large:
            return original(parts, **kw)
        with lock:
            state["open"] += 1
            state["most"] = max(state["most"], state["open"])
        sink = original(parts, **kw)
        publish = sink.publish

        def published(**pkw: Any) -> Any:
            try:
                return publish(**pkw)
            finally:
                with lock:
                    state["open"] -= 1

        sink.publish = published
        return sink

    backend.open_sink = counted
    with store.stage_dir("f/ck") as d:
        _fill(d, files)
    assert state["most"] == 1
    for rel, data in files.items():
        assert door.read(f"f/ck/{rel}") == data
    assert open_store(store.url, **moto.options()).verify("f/ck", level="full").ok


def test_a_replace_copies_its_staged_files_together_and_lands_whole(moto: MotoServer) -> None:
    """A folder replace's server-side copies from its staged copy run several at once (a
    barrier of two that one copy after another never passes); every final key then holds the
    new version and nothing of the old one or of the staged copy is left."""
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

    def copy_checked(*args: Any, **kw: Any) -> Any:
        with lock:
            calls[0] += 1
            first_two = calls[0] <= 2
        if first_two:
            meet.wait()  # BrokenBarrierError (the replace fails) if no second copy comes
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
