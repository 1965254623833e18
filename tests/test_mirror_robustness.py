"""Mirror replication that survives what it meets: interpreter exit without close(), exceptions of
any kind in a copy or in bookkeeping, retries decided by ``retryable``, restore that never
overwrites a newer primary version, folder replacement on S3 that never loses an old file.

Mirror contents are checked through backdoors (the mirror's folder or bucket), not the API.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, _exitflush, open_store
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    NotFoundError,
)
from commitstore.testing import LocalBackdoor, S3Backdoor, record_path, xxh

from .helpers.s3servers import MotoServer

ROOT_DIR = Path(__file__).resolve().parent.parent
BOUND = 20.0
"""Seconds within which flush()/close() must return in the failure tests."""


def _fail_open_sink(
    mirror: CommitStore, exc: BaseException, *, times: int | None = None
) -> list[int]:
    """Make the mirror backend's ``open_sink`` for artifact data raise ``exc`` (the first
    ``times`` calls, or always); returns the list of attempts (one entry per call)."""
    backend: Any = mirror._backend
    original = backend.open_sink
    calls: list[int] = []

    def failing(parts: tuple[str, ...], **kw: Any) -> Any:
        if parts[0] == ".commitstore":  # records: not the artifact's data
            return original(parts, **kw)
        calls.append(1)
        if times is None or len(calls) <= times:
            raise exc
        return original(parts, **kw)

    backend.open_sink = failing
    return calls


def _in_thread(fn: Any, bound: float = BOUND) -> float:
    """Run ``fn`` in a thread; assert it returns within ``bound`` seconds; return how long."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported to the test below
            errors.append(exc)
        finally:
            done.set()

    t0 = time.monotonic()
    threading.Thread(target=run, daemon=True).start()
    assert done.wait(bound), f"{fn} did not return within {bound}s"
    if errors:
        raise errors[0]
    return time.monotonic() - t0


# -- 1. interpreter exit without close() ----------------------------------------------------------
EXIT_SCRIPT = """
import os, sys, time
import commitstore.mirrors.replicator as r
from commitstore import open_store
import commitstore.mirrors.copy as c
real = c.copy_artifact
def slow(src, dst, name, **kw):
    time.sleep(float(sys.argv[3]))
    return real(src, dst, name, **kw)
c.copy_artifact = r.copy_artifact = slow
store = open_store(sys.argv[1], mirrors=[sys.argv[2]])
for i in range(3):
    store.put_bytes(f"step_{i}.pt", bytes([i]) * 50_000)
print("committed", flush=True)
# no close(): the script just ends
"""


def _run_exit_script(
    tmp_path: Path, delay: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(tmp_path / "p"), str(tmp_path / "m"), str(delay)],
        cwd=ROOT_DIR,
        env={**os.environ, "PYTHONPATH": str(ROOT_DIR / "src"), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_exit_without_close_flushes_pending_copies(tmp_path: Path) -> None:
    res = _run_exit_script(tmp_path, 0.5, {})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "committed"
    door = LocalBackdoor(tmp_path / "m")
    for i in range(3):
        assert door.read(f"step_{i}.pt") == bytes([i]) * 50_000
        assert door.read(record_path(f"step_{i}.pt")) is not None
    assert "not replicated" not in res.stderr


def test_exit_flush_is_bounded_and_names_what_is_missing(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = _run_exit_script(tmp_path, 5.0, {"COMMITSTORE_EXIT_FLUSH_SECONDS": "0.5"})
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert took < 12  # three 5 s copies would take 15 s: the wait was bounded
    door = LocalBackdoor(tmp_path / "m")
    assert door.read("step_2.pt") is None
    assert "step_2.pt" in res.stderr
    assert str(tmp_path / "m") in res.stderr
    assert "Warning" in res.stderr  # warnings.warn, visible to a script


def test_closed_store_leaves_no_exit_hook(tmp_path: Path) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    rep = store._replicator
    assert rep is not None
    assert rep in _exitflush.waiting()
    store.close()
    assert rep not in _exitflush.waiting()


# -- 2. nothing kills the replication thread -------------------------------------------------------
@pytest.mark.parametrize("exc", [RuntimeError("boom"), MemoryError(), GeneratorExit()])
def test_any_exception_in_a_copy_is_that_artifacts_failure(
    tmp_path: Path, exc: BaseException
) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")], mirror_queue=1)
    mirror = store.mirrors[0]
    calls = _fail_open_sink(mirror, exc, times=1)
    store.put_bytes("step_1.pt", b"a" * 1000)
    _in_thread(store.flush)
    state = store.mirror_status()[0]
    assert "step_1.pt" in state.failed
    assert state.pending == ()
    assert len(calls) == 1  # not retryable: one attempt
    # The worker lives on: later commits still replicate (more than the queue holds).
    for i in range(2, 6):
        store.put_bytes(f"step_{i}.pt", bytes([i]) * 1000)
    _in_thread(store.close)
    door = LocalBackdoor(tmp_path / "m")
    for i in range(2, 6):
        assert door.read(f"step_{i}.pt") == bytes([i]) * 1000
    assert door.read("step_1.pt") is None


def test_a_failure_in_bookkeeping_does_not_stop_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    rep = store._replicator
    assert rep is not None
    real = rep._copy
    once: list[int] = []

    def broken(w: Any, name: str) -> None:
        if not once:
            once.append(1)
            w.failed = None  # bookkeeping breaks, then heals
            try:
                real(w, name)
            finally:
                w.failed = {}
            return
        real(w, name)

    monkeypatch.setattr(rep, "_copy", broken)
    store.put_bytes("step_1.pt", b"x" * 100)
    store.put_bytes("step_2.pt", b"y" * 100)
    _in_thread(store.close)
    assert LocalBackdoor(tmp_path / "m").read("step_2.pt") == b"y" * 100


def test_a_dead_worker_fails_its_items_and_never_blocks(tmp_path: Path) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")], mirror_queue=1)
    _fail_open_sink(store.mirrors[0], SystemExit(3))  # ends the thread, as it should
    store.put_bytes("step_1.pt", b"a" * 100)
    rep = store._replicator
    assert rep is not None
    thread = rep.workers[0].thread
    assert thread is not None
    thread.join(BOUND)
    assert not thread.is_alive()
    # More commits than the queue holds: none blocks, each artifact is marked failed.
    _in_thread(lambda: [store.put_bytes(f"step_{i}.pt", b"b" * 100) for i in range(2, 6)])
    _in_thread(store.flush)
    state = store.mirror_status()[0]
    assert set(state.failed) == {f"step_{i}.pt" for i in range(1, 6)}
    assert "stopped" in state.failed["step_3.pt"]
    assert state.pending == ()
    _in_thread(store.close)


# -- 5. retries decide by ``retryable``, in background and in sync() ----------------------------
@pytest.mark.parametrize(
    ("exc", "attempts"),
    [(BackendUnavailableError("mirror down"), 3), (CommitError("refused"), 1)],
)
def test_background_retries_only_retryable_errors(
    tmp_path: Path, exc: Exception, attempts: int
) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    calls = _fail_open_sink(store.mirrors[0], exc)
    store.put_bytes("step_1.pt", b"a" * 100)
    store.flush()
    assert len(calls) == attempts
    assert "step_1.pt" in store.mirror_status()[0].failed
    store.close()


@pytest.mark.parametrize(
    ("exc", "attempts"),
    [(BackendUnavailableError("mirror down"), 3), (CommitError("refused"), 1)],
)
def test_sync_retries_only_retryable_errors(tmp_path: Path, exc: Exception, attempts: int) -> None:
    open_store(tmp_path / "p").put_bytes("step_1.pt", b"a" * 100)
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    calls = _fail_open_sink(store.mirrors[0], exc)
    report = store.sync()
    assert len(calls) == attempts
    assert "step_1.pt" in report.mirrors[0].failed
    assert not report.ok


def test_sync_reports_a_non_commitstore_error_per_artifact(tmp_path: Path) -> None:
    primary = open_store(tmp_path / "p")
    primary.put_bytes("step_1.pt", b"a" * 100)
    primary.put_bytes("step_2.pt", b"b" * 100)
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    _fail_open_sink(store.mirrors[0], RuntimeError("driver bug"), times=1)
    report = store.sync()  # does not raise
    m = report.mirrors[0]
    assert len(m.failed) == 1
    assert "driver bug" in next(iter(m.failed.values()))
    assert len(m.copied) == 1


def test_retryable_error_then_success_replicates(tmp_path: Path) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    calls = _fail_open_sink(store.mirrors[0], BackendUnavailableError("blip"), times=2)
    store.put_bytes("step_1.pt", b"a" * 100)
    store.close()
    assert len(calls) == 3
    assert LocalBackdoor(tmp_path / "m").read("step_1.pt") == b"a" * 100


# -- 4. restore never overwrites a newer primary version -------------------------------------------
def _two_versions(tmp_path: Path) -> CommitStore:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    store.put_bytes("step_1.pt", b"old" * 100)
    store.flush()
    time.sleep(0.01)
    open_store(tmp_path / "p").put_bytes("step_1.pt", b"new" * 100, overwrite=True)
    return store


def test_restore_refuses_to_overwrite_a_different_whole_primary_version(tmp_path: Path) -> None:
    store = _two_versions(tmp_path)
    door = LocalBackdoor(tmp_path / "p")
    with pytest.raises(AlreadyExistsError) as info:
        store.restore("step_1.pt")
    assert "primary" in str(info.value) and "newer" in str(info.value)
    assert door.read("step_1.pt") == b"new" * 100
    rec = store.restore("step_1.pt", overwrite=True)
    assert rec.digest == xxh(b"old" * 100)
    assert door.read("step_1.pt") == b"old" * 100
    store.close()


def test_restore_copies_back_when_missing_broken_or_identical(tmp_path: Path) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    store.put_bytes("step_1.pt", b"v" * 100)
    store.flush()
    door = LocalBackdoor(tmp_path / "p")
    store.restore("step_1.pt")  # identical record: harmless
    door.write("step_1.pt", b"w" * 100)  # primary corrupted: fails its full check
    store.restore("step_1.pt")
    assert door.read("step_1.pt") == b"v" * 100
    door.remove("step_1.pt")
    door.remove(record_path("step_1.pt"))
    store.restore("step_1.pt")  # missing on the primary
    assert door.read("step_1.pt") == b"v" * 100
    with pytest.raises(NotFoundError):
        store.restore("step_9.pt")
    store.close()


def test_restore_racing_a_new_primary_commit_does_not_overwrite_it(tmp_path: Path) -> None:
    """A primary commit lands while restore reads the mirror: restore must not replace it."""
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    store.put_bytes("step_1.pt", b"v" * 100)
    store.flush()
    door = LocalBackdoor(tmp_path / "p")
    door.remove("step_1.pt")
    door.remove(record_path("step_1.pt"))  # primary lost it: restore will copy
    mirror_backend: Any = store.mirrors[0]._backend
    original = mirror_backend.open_read
    overlapped: list[str] = []

    def racing(parts: tuple[str, ...]) -> Any:
        if parts == ("step_1.pt",) and not overlapped:
            # restore has decided and is now reading the mirror: a new version lands.
            open_store(tmp_path / "p").put_bytes("step_1.pt", b"n" * 100)
            overlapped.append("commit during restore")
        return original(parts)

    mirror_backend.open_read = racing
    with pytest.raises(AlreadyExistsError):
        store.restore("step_1.pt")
    assert overlapped == ["commit during restore"]  # the two really overlapped
    assert door.read("step_1.pt") == b"n" * 100
    assert open_store(tmp_path / "p").verify("step_1.pt").ok
    store.close()


# -- 3. replacing a folder on an object store never loses an old file ------------------------------
OLD = {"a.bin": b"old-a", "b.bin": b"old-b", "c.bin": b"old-c", "sub/d.bin": b"old-d"}
NEW = {"a.bin": b"new-a", "b.bin": b"new-b", "c.bin": b"new-c", "e.bin": b"new-e"}


def _fill(d: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)


def _door(moto: MotoServer, store: CommitStore) -> S3Backdoor:
    from .helpers.s3servers import BUCKET

    prefix = store.url.split(f"s3://{BUCKET}/", 1)[1]
    return S3Backdoor(moto.client(), BUCKET, prefix)


def test_object_folder_replace_leaves_exactly_the_new_files(moto: MotoServer) -> None:
    store = open_store(moto.url(f"dir{time.monotonic_ns()}"), **moto.options())
    door = _door(moto, store)
    with store.stage_dir("hf/ck") as d:
        _fill(d, OLD)
    with store.stage_dir("hf/ck", overwrite=True) as d:
        _fill(d, NEW)
    files = {f for f in door.files() if f.startswith("hf/ck/")}
    assert files == {f"hf/ck/{rel}" for rel in NEW}
    for rel, data in NEW.items():
        assert door.read(f"hf/ck/{rel}") == data
    assert store.verify("hf/ck").ok


@pytest.mark.parametrize("k", [0, 2, 3])  # failure after k of the 4 new files
def test_object_folder_replace_failing_after_k_files_deletes_no_old_file(
    moto: MotoServer, k: int
) -> None:
    store = open_store(moto.url(f"dir{time.monotonic_ns()}"), **moto.options())
    door = _door(moto, store)
    with store.stage_dir("hf/ck") as d:
        _fill(d, OLD)
    old_record = door.read(record_path("hf/ck"))
    backend: Any = store._backend
    original = backend.open_sink
    uploads: list[tuple[str, ...]] = []
    lock = threading.Lock()  # the folder's small files go up several at a time

    def failing(parts: tuple[str, ...], **kw: Any) -> Any:
        # The new version is uploaded whole to its staged copy before any old file is touched.
        assert parts[:2] != ("hf", "ck"), "a final key was written before the staged copy"
        if parts[:2] == (".commitstore", "staged"):
            with lock:
                if len(uploads) >= k:
                    raise BackendUnavailableError("network gone")
                uploads.append(parts)
        return original(parts, **kw)

    backend.open_sink = failing
    with pytest.raises(BackendUnavailableError), store.stage_dir("hf/ck", overwrite=True) as d:
        _fill(d, NEW)
    assert len(uploads) == k
    for rel, data in OLD.items():  # every old file is untouched: the old version stands
        assert door.read(f"hf/ck/{rel}") == data, f"old file {rel} changed"
    assert {f for f in door.files() if f.startswith("hf/ck/")} == {f"hf/ck/{r}" for r in OLD}
    assert not [f for f in door.files() if f.startswith(".commitstore/staged/")]
    assert door.read(record_path("hf/ck")) == old_record  # the old record still stands
    assert open_store(store.url, **moto.options()).verify("hf/ck").ok


# -- SMB folder replace: a failed rename-in puts the old folder back ------------------------------
def test_smb_folder_replace_failing_rename_keeps_the_old_folder(tmp_path: Path) -> None:
    from .helpers.samba import PASSWORD, SambaServer

    samba = SambaServer(tmp_path / "samba")
    try:
        store = open_store(samba.url("run"), password=PASSWORD)
        with store.stage_dir("hf/ck") as d:
            _fill(d, OLD)
        backend: Any = store._backend
        original = backend._move
        moves: list[tuple[str, str]] = []

        def failing(folder: Any, src: str, dst: str, *, replace: bool) -> Any:
            if dst.startswith((".commitstore.new.", ".commitstore.rec")):  # (pending) records
                return original(folder, src, dst, replace=replace)
            moves.append((src, dst))
            if len(moves) == 2:  # the old folder is aside; the new one fails to move in
                raise BackendUnavailableError("connection dropped")
            return original(folder, src, dst, replace=replace)

        backend._move = failing
        with pytest.raises(BackendUnavailableError), store.stage_dir("hf/ck", overwrite=True) as d:
            _fill(d, NEW)
        assert len(moves) >= 3  # aside, failed rename-in, moved back
        door = LocalBackdoor(samba.share_dir / "run")
        for rel, data in OLD.items():
            assert door.read(f"hf/ck/{rel}") == data
        assert open_store(samba.url("run"), password=PASSWORD).verify("hf/ck").ok
    finally:
        samba.stop()
