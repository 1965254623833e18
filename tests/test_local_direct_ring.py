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
import os
import stat
from pathlib import Path
from typing import Any, ClassVar

import pytest

from commitstore import open_store
from commitstore.backends.rename import _direct, posix
from commitstore.errors import CommitError, InsufficientSpaceError
from commitstore.testing import xxh

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

    def _write_direct(self, buf: Any, length: int) -> None:
        Failing.made.append(length)
        if len(Failing.made) == Failing.fail_at:
            raise OSError(Failing.err, os.strerror(Failing.err))
        super()._write_direct(buf, length)


@pytest.mark.parametrize(
    ("err", "typed"),
    [(errno.EIO, CommitError), (errno.ENOSPC, InsufficientSpaceError)],
    ids=["EIO", "ENOSPC"],
)
@pytest.mark.usefixtures("small_ring")
def test_a_failed_worker_write_is_the_callers_typed_error_and_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, typed: type[Exception]
) -> None:
    monkeypatch.setattr(posix, "DirectWriter", Failing)
    monkeypatch.setattr(Failing, "err", err)
    monkeypatch.setattr(Failing, "made", [])
    store = open_store(tmp_path / "s")
    old = os.urandom(3 * KiB)
    store.put_bytes("w.bin", old)
    data = os.urandom(100 * KiB + 5)
    with pytest.raises(typed) as caught, store.stage("w.bin", overwrite=True) as st:
        for i in range(0, len(data), 3 * KiB):
            st.write(data[i : i + 3 * KiB])
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == err
    assert "writing" in str(caught.value) or "flushing" in str(caught.value)
    # the writes queued behind the failed one were skipped, not made
    assert len(Failing.made) == Failing.fail_at, Failing.made
    assert (tmp_path / "s" / "w.bin").read_bytes() == old
    assert store.verify("w.bin", level="full").ok
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".commitstore", "w.bin"]


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


def _syncs(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[str]:
    """Every fsync from here on, as 'file|dir <path relative to root>' (staging names kept)."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        path = os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), root)
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        seen.append(f"{kind} {path}")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


@pytest.mark.parametrize("size", [100, 100 * KiB + 3], ids=["buffered", "direct"])
@pytest.mark.usefixtures("small_ring")
def test_a_commit_makes_exactly_the_ordered_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("first.bin", b"x")  # the store's folders exist (their creation is synced)
    seen = _syncs(monkeypatch, root)
    data = os.urandom(size)
    store.put_bytes("a.bin", data, overwrite=True)
    kinds = [s.split(" ")[0] for s in seen]
    paths = [s.split(" ", 1)[1] for s in seen]
    assert kinds == ["file", "dir"] * 3, seen
    records = ".commitstore/records"
    assert paths[1] == paths[5] == records, seen
    assert paths[0].startswith(f"{records}/.commitstore.tmp.") and ".new.a.bin" in paths[0]
    assert paths[2].startswith(".commitstore.tmp.") and paths[2].endswith("a.bin"), seen
    assert paths[3] == "."
    assert paths[4].startswith(f"{records}/.commitstore.tmp.") and ".rec.a.bin" in paths[4]
    # the pending record is gone, though its removal was not synced
    assert sorted(p.name for p in (root / records).iterdir()) == [
        ".commitstore.rec.a.bin.json",
        ".commitstore.rec.first.bin.json",
    ]
    assert (root / "a.bin").read_bytes() == data
