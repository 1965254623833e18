"""A child forked (``os.fork()``: multiprocessing and DataLoader workers with the ``fork`` start
method) while its parent holds one of a local store's ``flock`` locks never keeps that lock:

- forked while a thread of the parent is inside a commit, under the publish lock: the lock
  stays the parent's until its commit ends, then is free, so the parent's next commit does not
  wait for the child (which lives on, stopped with SIGSTOP at once, whether or not it ran its
  fork handler by then);
- forked by a writer whose staging entry (``stage``, ``stage_dir``, ``begin_folder``) it holds:
  gc in another process keeps the entry while the writer lives, and removes it once the writer
  is dead (SIGKILL) although the child lives on.

Without the fix the child shares the locked open file description: the publish lock stays taken
(the next commit raises BackendUnavailableError after ``lock_timeout``) and gc keeps the dead
writer's staging as "held by a live writer". Locks are probed raw (``flock`` on a new open of
the file) and storage is read through ``LocalBackdoor``."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from commitstore import CommitStore, open_store
from commitstore.backends.rename.posix import backend as posix_backend
from commitstore.testing import LocalBackdoor
from commitstore.testing.pausing import staged_state

from .helpers.gcelsewhere import gc_elsewhere

HELD = "held by a live writer"


def _lock_free(path: Path) -> bool:
    """True if nobody holds an ``flock`` on ``path``: an exclusive, non-blocking one on a new
    open of it is granted (and dropped at once)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _sleeping_child(wake: int, unused: int | None = None) -> int:
    """Fork a child that only sleeps until ``wake`` (a pipe's read end) reads EOF (the test
    closes the write end ``unused``, which the child closes, or dies) and never touches the
    store; its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            if unused is not None:
                os.close(unused)
            os.read(wake, 1)
        finally:
            os._exit(0)
    return pid


@contextlib.contextmanager
def _waking_pipe() -> Iterator[tuple[int, int]]:
    """A pipe whose write end only the test holds: closing it wakes (ends) sleeping children."""
    r, w = os.pipe()
    try:
        yield r, w
    finally:
        os.close(r)
        with contextlib.suppress(OSError):
            os.close(w)


def _kill(pid: int, *, reap: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if reap:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def test_a_child_forked_inside_a_commit_does_not_keep_the_publish_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "s"
    store, door = open_store(root, lock_timeout=5), LocalBackdoor(root)
    store.put_bytes("seed.bin", b"seed")
    lock = root / ".commitstore" / "lock"
    inside, go = threading.Event(), threading.Event()
    real = posix_backend.LocalBackend.publish_lock

    @contextlib.contextmanager
    def pausing_lock(self: posix_backend.LocalBackend) -> Iterator[None]:
        with real(self):
            if not inside.is_set():  # the first commit pauses under the lock
                inside.set()
                go.wait(120)
            yield

    monkeypatch.setattr(posix_backend.LocalBackend, "publish_lock", pausing_lock)
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            store.put_bytes("a.bin", b"a" * 1000)
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=commit)
    writer.start()
    child = 0
    with _waking_pipe() as (wake_r, wake_w):
        try:
            assert inside.wait(120)
            child = _sleeping_child(wake_r, wake_w)
            os.kill(child, signal.SIGSTOP)  # a stopped worker, maybe before its fork handler ran
            assert not _lock_free(lock)  # still the parent's: the commit goes on under it
            go.set()
            writer.join(120)
            assert not writer.is_alive() and errors == []
            assert os.waitpid(child, os.WNOHANG) == (0, 0)  # the child lives on
            assert _lock_free(lock)  # the commit ended: nobody holds the lock
            store.put_bytes("b.bin", b"b")  # the parent's next commit does not wait
            store.put_bytes("a.bin", b"A", overwrite=True)
        finally:
            go.set()
            writer.join(120)
            if child:
                _kill(child, reap=True)
    assert door.read("a.bin") == b"A"
    assert door.read("b.bin") == b"b"


def _stage(store: CommitStore, how: str) -> object:
    """Stage half an artifact of ``ck`` the way ``how`` says and keep it open (returned, so it
    stays referenced while the writer lives)."""
    if how == "stage":
        st = store.stage("ck", overwrite=True)
        st.write(b"half")
        return st
    if how == "stage_dir":
        ctx = store.stage_dir("ck", overwrite=True)
        d = ctx.__enter__()
        (d / "a.bin").write_bytes(b"half")
        return ctx
    fw = store.begin_folder("ck", overwrite=True)
    fw.write_bytes("a.bin", b"half")
    f = fw.open_file("b.bin")
    f.write(b"half")
    return (fw, f)


def _writer_forking_a_sleeper(root: Path, how: str, wake_r: int, wake_w: int) -> tuple[int, int]:
    """Fork a writer that stages ``ck`` (:func:`_stage`), then forks a child that sleeps (until
    the test's pipe closes), and waits to be killed: ``(writer pid, sleeper pid)``."""
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the writer
        try:
            os.close(wake_w)
            os.close(out_r)
            kept = _stage(open_store(root), how)
            sleeper = _sleeping_child(wake_r)
            os.write(out_w, f"{sleeper}\n".encode())
            os.read(wake_r, 1)  # until killed
            del kept
        finally:
            os._exit(0)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as answer:
        line = answer.readline().decode().strip()
    if not line.isdigit():
        _kill(pid, reap=True)
        raise AssertionError(f"the writer failed before it forked: {line!r}")
    return pid, int(line)


@pytest.mark.parametrize("how", ["stage", "stage_dir", "begin_folder"])
def test_gc_removes_a_dead_writers_staging_while_its_forked_child_lives(
    tmp_path: Path, how: str
) -> None:
    root = tmp_path / "s"
    store, door = open_store(root), LocalBackdoor(root)
    if how == "stage":
        store.put_bytes("ck", b"old")
    else:
        with store.stage_dir("ck") as d:
            (d / "a.bin").write_bytes(b"old")
    with _waking_pipe() as (wake_r, wake_w):
        writer, sleeper = _writer_forking_a_sleeper(root, how, wake_r, wake_w)
        try:
            staged = staged_state(door, "ck")
            assert staged
            report = gc_elsewhere(root)  # the writer lives: its staging is kept
            assert report["removed"] == []
            assert any(reason == HELD for _, reason in report["kept"]), report
            assert staged_state(door, "ck") == staged
            _kill(writer, reap=True)  # dead, without releasing anything itself
            os.kill(sleeper, 0)  # its child lives on
            report = gc_elsewhere(root)
            assert not any(reason == HELD for _, reason in report["kept"]), report
            assert staged_state(door, "ck") == set()
            os.kill(sleeper, 0)  # it lived through gc
        finally:
            _kill(writer, reap=True)
            _kill(sleeper, reap=False)  # not ours to reap (its parent, the writer, is dead)
    if how == "stage":
        assert door.read("ck") == b"old"
    else:
        assert door.read("ck/a.bin") == b"old"
