"""The direct writer's ring of buffers and the syncs of a local commit.

A write that fails in the worker thread surfaces in the caller as the same typed error a
buffered write's failure gives (``CommitError`` "writing ...", ``InsufficientSpaceError`` for
ENOSPC), the buffers queued after it are never written, and nothing is published. A commit makes
exactly the syncs the protocol orders (docs/guarantees.md), in that order: pending record (file,
folder), data (file, folder), record (file, folder); removing the pending record afterwards is
not synced.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import commitstore
from commitstore import open_store
from commitstore.backends.rename.posix import _direct
from commitstore.backends.rename.posix import backend as posix
from commitstore.errors import CommitError, InsufficientSpaceError
from commitstore.testing import xxh

from .faultshim.runner import FAULTS, ROOT_DIR, build_shim

KiB = 1024


@pytest.fixture
def small_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Direct I/O past 8 KiB, 8 KiB buffers: a 100 KiB stage queues a dozen direct writes."""
    monkeypatch.setattr(posix, "DIRECT_AFTER", 8 * KiB)
    monkeypatch.setattr(_direct, "BUFFER", 8 * KiB)


class Failing(_direct.DirectWriter):
    """Fails the ``fail_at``-th direct write with ``err``; counts the writes made after it."""

    fail_at = 2
    err = errno.EIO
    made: ClassVar[list[int]] = []
    writers: ClassVar[list[_direct.DirectWriter]] = []

    def __init__(self, fd: int) -> None:
        super().__init__(fd)
        Failing.writers.append(self)

    def _write_direct(self, buf: Any, length: int, offset: int) -> None:
        Failing.made.append(length)
        if len(Failing.made) == Failing.fail_at:
            raise OSError(Failing.err, os.strerror(Failing.err))
        super()._write_direct(buf, length, offset)


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize(
    ("err", "typed"),
    [(errno.EIO, CommitError), (errno.ENOSPC, InsufficientSpaceError)],
    ids=["EIO", "ENOSPC"],
)
@pytest.mark.usefixtures("small_ring")
def test_a_failed_worker_write_is_the_callers_typed_error_and_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, typed: type[Exception], depth: int
) -> None:
    """With ``depth`` writes in flight, the writes the other workers take while the failing
    one is still in flight may still be made (at most the rest of the ring: the caller waits
    for a buffer's last write before it fills it again); none after the failure is."""
    monkeypatch.setattr(_direct, "DEPTH", depth)
    monkeypatch.setattr(posix, "DirectWriter", Failing)
    monkeypatch.setattr(Failing, "err", err)
    monkeypatch.setattr(Failing, "made", [])
    monkeypatch.setattr(Failing, "writers", [])
    store = open_store(tmp_path / "s")
    old = os.urandom(3 * KiB)
    store.put_bytes("w.bin", old)
    data = os.urandom(100 * KiB + 5)
    with pytest.raises(typed) as caught, store.stage("w.bin", overwrite=True) as st:
        for i in range(0, len(data), 3 * KiB):
            st.write(data[i : i + 3 * KiB])
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == err
    assert "writing" in str(caught.value) or "flushing" in str(caught.value)
    # the writes queued behind the failed one were skipped, not made (but those in flight)
    most = Failing.fail_at + (0 if depth == 1 else _direct.BUFFERS - 1)
    assert Failing.fail_at <= len(Failing.made) <= most, Failing.made
    # the failed stage's worker thread has ended by the time the error reaches the caller
    (writer,) = Failing.writers
    assert [t for t in writer._pool._threads if t.is_alive()] == []
    assert (tmp_path / "s" / "w.bin").read_bytes() == old
    assert store.verify("w.bin", level="full").ok
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".commitstore", "w.bin"]


@pytest.mark.usefixtures("small_ring")
def test_direct_writes_refused_in_two_workers_at_once_are_written_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that takes ``O_DIRECT`` at ``fcntl`` but refuses direct writes (EINVAL):
    both workers' first writes are refused, the second's refusal returning only after the
    first worker switched the file to buffered writes. Both are made again buffered and the
    commit holds exactly the bytes given (a worker that judged its refusal by the shared
    switch, not by how its own write was made, raised EINVAL: the commit failed)."""
    real_pwrite = os.pwrite
    both_in = threading.Barrier(2, timeout=10)
    switched = threading.Event()
    calls = [0]
    lock = threading.Lock()

    class Writer(_direct.DirectWriter):
        def _buffered(self) -> None:
            super()._buffered()
            switched.set()

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            return real_pwrite(fd, data, offset)
        with lock:
            calls[0] += 1
            me = calls[0]
        if me <= 2:
            both_in.wait()  # both workers inside a direct write
            if me == 2:
                assert switched.wait(10)
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(_direct, "DEPTH", 2)
    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(posix, "DirectWriter", Writer)
    store = open_store(tmp_path / "s")
    data = os.urandom(8 * KiB + 6 * 8 * KiB + 100)
    with store.stage("big.bin") as st:
        st.write(data)  # one call: several full buffers queued at once
    assert calls[0] == 2
    assert (tmp_path / "s" / "big.bin").read_bytes() == data
    assert store.verify("big.bin", level="full").ok


@pytest.mark.usefixtures("small_ring")
def test_closing_a_failed_writer_leaves_no_worker_thread(tmp_path: Path) -> None:
    """Every write of a failed stage has returned (the failed one and the skipped ones behind
    it) before the abort closes the writer: ``close`` still ends the worker before it returns,
    even when freeing the buffers is slow (it is done after the worker ended, not by it)."""

    class Slow(Failing):
        def _free(self) -> None:
            threading.Event().wait(0.3)
            super()._free()

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        writer = Slow(fd)
        Failing.made.clear()
        chunk = memoryview(bytes(_direct.BUFFER))
        with pytest.raises(OSError):
            for _ in range(_direct.BUFFERS * 2):
                writer.write(chunk)
        for fut in writer._pending:
            if fut is not None:
                with pytest.raises(OSError):
                    fut.result()
        writer.close()
        assert [t for t in writer._pool._threads if t.is_alive()] == []
        assert all(buf.closed for buf in writer._bufs)
    finally:
        os.close(fd)
        Failing.made.clear()
        Failing.writers.clear()


@pytest.mark.usefixtures("small_ring")
def test_the_ring_writes_every_buffer_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More buffers than the ring holds, the caller's writes straddling them: the file is the
    bytes given (a reordered or skipped buffer would show). The worker frees the buffers after
    the commit (the caller does not wait for it), then exits."""
    made: list[_direct.DirectWriter] = []

    class Writer(_direct.DirectWriter):
        def __init__(self, fd: int) -> None:
            super().__init__(fd)
            made.append(self)

    monkeypatch.setattr(posix, "DirectWriter", Writer)
    store = open_store(tmp_path / "s")
    data = os.urandom(8 * KiB + _direct.BUFFERS * 3 * 8 * KiB + 4096 + 7)
    with store.stage("r.bin") as st:
        for i in range(0, len(data), 5 * KiB + 1):
            st.write(data[i : i + 5 * KiB + 1])
    assert (tmp_path / "s" / "r.bin").read_bytes() == data
    assert store.record("r.bin").digest == xxh(data)
    (writer,) = made
    for thread in list(writer._pool._threads):
        thread.join()
    assert all(buf.closed for buf in writer._bufs)


WORKER: list[str] = []
"""The fsyncs :func:`_events` saw made by the direct writer's worker thread."""


def _events(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[str]:
    """Every fsync ('file|dir <path relative to root>', staging names kept) and every rename
    into place ('rename <name>') from here on, in order."""
    seen: list[str] = []
    monkeypatch.setattr(sys.modules[__name__], "WORKER", [])
    real_fsync, real_rename = os.fsync, posix.LocalBackend.rename

    def fsync(fd: int) -> None:
        path = os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), root)
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        real_fsync(fd)
        seen.append(f"{kind} {path}")
        if threading.current_thread().name.startswith(("commitstore-direct", "commitstore-sync")):
            WORKER.append(seen[-1])

    def rename(self: posix.LocalBackend, folder: int, src: str, dst: str, **kw: Any) -> None:
        real_rename(self, folder, src, dst, **kw)
        seen.append(f"rename {dst}")

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(posix.LocalBackend, "rename", rename)
    return seen


@pytest.mark.parametrize("size", [100, 100 * KiB + 3], ids=["buffered", "direct"])
@pytest.mark.usefixtures("small_ring")
def test_a_commit_makes_exactly_the_ordered_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """Five syncs, each an ordering of docs/guarantees.md: the pending record's file and its
    folder (written in place, never renamed; the two synced at once) before the data rename;
    the data file before its rename, its folder before the record's rename (the pending record
    renamed onto the record: no second copy written and synced), its folder last. (The data's
    fsync runs in a worker, beside the pending record's write.)"""
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("first.bin", b"x")  # the store's folders exist (their creation is synced)
    seen = _events(monkeypatch, root)
    data = os.urandom(size)
    store.put_bytes("a.bin", data, overwrite=True)
    records = ".commitstore/records"

    def at(pred: Any) -> int:
        (i,) = [i for i, e in enumerate(seen) if pred(e)]
        return i

    pending_file = at(lambda e: e.startswith(f"file {records}/") and ".new.a.bin" in e)
    assert not [e for e in seen if e == "rename .commitstore.new.a.bin.json"], seen
    data_file = at(lambda e: e.startswith("file .commitstore.tmp.") and e.endswith("a.bin"))
    data_rename = at(lambda e: e == "rename a.bin")
    data_dir = at(lambda e: e == "dir .")
    assert not [e for e in seen if e.startswith(f"file {records}/") and ".rec.a.bin" in e]
    record_rename = at(lambda e: e == "rename .commitstore.rec.a.bin.json")
    record_dirs = [i for i, e in enumerate(seen) if e == f"dir {records}"]
    assert len(record_dirs) == 2, seen
    assert max(pending_file, record_dirs[0]) < data_rename, seen
    assert data_file < data_rename < data_dir < record_rename < record_dirs[1]
    assert record_dirs[1] == len(seen) - 1
    assert sum(not e.startswith("rename") for e in seen) == 5, seen
    # started when the commit began, in a worker (the direct writer's, or the early sync of a
    # buffered file), beside the pending record's write; the data's rename waited for it. The
    # pending record's file sync runs in a worker too, beside its folder's sync
    assert sorted(WORKER) == sorted([seen[data_file], seen[pending_file]]), (WORKER, seen)
    # the pending record is gone: it was renamed onto the record
    assert sorted(p.name for p in (root / records).iterdir()) == [
        ".commitstore.rec.a.bin.json",
        ".commitstore.rec.first.bin.json",
    ]
    assert (root / "a.bin").read_bytes() == data


@pytest.fixture(scope="module")
def ring_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """The warm ``tests.helpers.ringfault`` process under the syscall shim: one case a call."""
    shim = build_shim(tmp_path_factory.mktemp("shim"))
    src = str(Path(commitstore.__file__).resolve().parent.parent)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.ringfault", str(shim)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT_DIR,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT_DIR), src]),
            "LD_PRELOAD": str(shim),
        },
        text=True,
    )
    base = tmp_path_factory.mktemp("ring")
    cases = [0]

    def run(k: int, err: int, gate: int, depth: int = 1) -> tuple[dict[str, Any], Path]:
        assert proc.stdin is not None and proc.stdout is not None
        cases[0] += 1
        where = base / f"c{cases[0]}"
        where.mkdir()
        case = {"dir": str(where), "k": k, "err": err, "gate": gate, "depth": depth}
        proc.stdin.write(json.dumps(case) + "\n")
        proc.stdin.flush()
        reply: dict[str, Any] = json.loads(proc.stdout.readline())
        return reply, where / "store"

    try:
        yield run
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


@pytest.mark.parametrize("gate", [2, 5])
@pytest.mark.parametrize("err", ["EIO", "ENOSPC", "SIGKILL"])
def test_a_real_write_failure_with_the_next_buffer_queued(
    ring_child: Callable[..., Any], err: str, gate: int
) -> None:
    """The ``gate``-th buffer write of the worker fails in libc (the preloaded shim: EIO,
    ENOSPC, or the process SIGKILLed there) while the caller has already queued the buffer
    after it: the stage raises the typed error, chained to that errno; nothing is published
    (the old version verifies); no worker thread and no descriptor on the store is left; the
    staging file is removed by the abort, or (killed) is left for gc, which removes it."""
    count, _root = ring_child(0, 0, gate)
    assert count["outcome"] == "ok" and count["next_queued"], count
    k = count["count_at_gate"] + 1
    assert count["calls"][k - 1].startswith("pwrite64 "), count["calls"]
    reply, root = ring_child(k, FAULTS[err], gate)
    assert reply["killed"] is (err == "SIGKILL"), reply
    store = open_store(root)
    assert (root / "w.bin").read_bytes() == b"old version"
    assert store.verify("w.bin", level="full").ok
    left = [p.name for p in root.iterdir() if p.name not in (".commitstore", "w.bin")]
    if err == "SIGKILL":
        assert [n.startswith(".commitstore.tmp.") for n in left] == [True], left
        assert len(store.gc(min_age=0).removed) == 1
    else:
        assert reply["outcome"] == "raised" and reply["fired"] and reply["next_queued"], reply
        typed = {"EIO": "CommitError", "ENOSPC": "InsufficientSpaceError"}[err]
        assert reply["raised"] == typed and reply["cause_errno"] == FAULTS[err], reply
        assert reply["threads"] == [] and reply["open"] == [], reply
        assert left == []
    assert sorted(p.name for p in root.iterdir()) == [".commitstore", "w.bin"]
    assert store.gc(min_age=0).removed == ()


@pytest.mark.parametrize("err", ["EIO", "ENOSPC", "SIGKILL"])
def test_a_real_failure_of_the_first_direct_write_with_two_in_flight(
    ring_child: Callable[..., Any], err: str
) -> None:
    """Two workers (``DEPTH`` 2): the first direct write fails in libc while the other worker
    may be writing the next buffer. The stage raises the typed error chained to that errno,
    nothing is published, no worker thread and no descriptor on the store is left (killed:
    the staging file is left for gc)."""
    count, _root = ring_child(0, 0, 0, 2)
    assert count["outcome"] == "ok", count
    k = next(i for i, c in enumerate(count["calls"], 1) if c.startswith("pwrite64 "))
    reply, root = ring_child(k, FAULTS[err], 0, 2)
    assert reply["killed"] is (err == "SIGKILL"), reply
    store = open_store(root)
    assert (root / "w.bin").read_bytes() == b"old version"
    assert store.verify("w.bin", level="full").ok
    if err == "SIGKILL":
        assert len(store.gc(min_age=0).removed) == 1
    else:
        typed = {"EIO": "CommitError", "ENOSPC": "InsufficientSpaceError"}[err]
        assert reply["outcome"] == "raised" and reply["fired"], reply
        assert reply["raised"] == typed and reply["cause_errno"] == FAULTS[err], reply
        assert reply["threads"] == [] and reply["open"] == [], reply
    assert sorted(p.name for p in root.iterdir()) == [".commitstore", "w.bin"]
