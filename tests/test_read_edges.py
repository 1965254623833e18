"""Edges of the readers on a local store.

A damaged artifact whose record stands is an IntegrityError at once, even while another
process, stopped with SIGSTOP, holds the store's publish lock (a writer of another name): only a
publish of the name itself (its pending record there) is waited for, within ``lock_timeout``,
and if the lock stays taken the record as read again decides (unchanged: IntegrityError, never
the lock's BackendUnavailableError).

``get_file`` never replaces or writes into a FIFO, a socket or a character device at its
destination (NameConflictError, the node as it was), and refuses an empty destination or one
holding a NUL with ConfigurationError before any I/O.

Every state is read through the disk, not through the store.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from commitstore import (
    BackendUnavailableError,
    CommitStore,
    ConfigurationError,
    IntegrityError,
    NameConflictError,
    open_store,
)
from commitstore.testing import LocalBackdoor, record_path

from .helpers.within import within

_BLOCKED = "the reader waited for the publish lock"

NAME = "step_2.pt"
GOOD = b"2" * 4096
BAD = b"X" + GOOD[1:]  # damaged in place: same size, other bytes

HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


@pytest.fixture
def stopped_holder() -> Iterator[Callable[[Path], None]]:
    """Start a real process that takes the publish lock of the store at the given root and
    stops itself (SIGSTOP) while holding it; it is killed when the test ends."""
    procs: list[subprocess.Popen[str]] = []

    def start(root: Path) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(root / ".commitstore" / "lock")],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"

    yield start
    for proc in procs:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _damaged(root: Path, strategy: str, lock_timeout: float) -> CommitStore:
    """A store at ``root`` holding NAME, its data then damaged in place (the record stands)."""
    store = open_store(root, strategy=strategy, lock_timeout=lock_timeout)
    store.put_bytes(NAME, GOOD, step=2)
    LocalBackdoor(root).write(NAME, BAD)
    return store


def _readers(store: CommitStore, tmp_path: Path) -> dict[str, Callable[[], object]]:
    def opened() -> None:
        with store.open(NAME) as f:
            f.read()

    return {
        "read_bytes": lambda: store.read_bytes(NAME),
        "read_with_record": lambda: store.read_with_record(NAME),
        "open": opened,
        "get_file": lambda: store.get_file(NAME, tmp_path / "out.pt"),
        "fetch": lambda: store.fetch(NAME, tmp_path / "cache"),
    }


def _unchanged(root: Path, record: bytes | None, tmp_path: Path) -> None:
    door = LocalBackdoor(root)
    assert door.read(NAME) == BAD
    assert door.read(record_path(NAME)) == record
    assert not (tmp_path / "out.pt").exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("strategy", ["local", "bridge"])
def test_a_damaged_artifact_fails_at_once_while_a_stopped_process_holds_the_lock(
    tmp_path: Path, strategy: str, stopped_holder: Callable[[Path], None]
) -> None:
    """The finding: verify said hash_mismatch at once, but the readers waited ``lock_timeout``
    for the stopped holder and then raised BackendUnavailableError. No pending record of the
    name is there, so nothing of it is being published: the mismatch is the answer. The bound
    on the wait is half of ``lock_timeout``: a reader that waits for the lock cannot end
    within it."""
    root = tmp_path / "s"
    store = _damaged(root, strategy, lock_timeout=60)
    record = LocalBackdoor(root).read(record_path(NAME))
    stopped_holder(root)
    assert store.verify(NAME).results[0].status == "hash_mismatch"
    for what, read in _readers(store, tmp_path).items():
        err = within(30, read, _BLOCKED)
        assert isinstance(err, IntegrityError), (what, err)
        assert err.status == "hash_mismatch", (what, err)
    _unchanged(root, record, tmp_path)


@pytest.mark.parametrize("strategy", ["local", "bridge"])
def test_with_a_pending_record_the_reader_waits_out_the_lock_then_reports_the_mismatch(
    tmp_path: Path, strategy: str, stopped_holder: Callable[[Path], None]
) -> None:
    """A pending record of the name is there (a commit of it that stopped after writing it, as
    a stopped overwriter leaves it), its version not the bytes either: the reader waits for the
    lock, which stays taken, and after ``lock_timeout`` the record, read again and unchanged,
    decides: IntegrityError, not the lock's BackendUnavailableError."""
    root = tmp_path / "s"
    door = LocalBackdoor(root)
    store = open_store(root, strategy=strategy, lock_timeout=0.5)
    store.put_bytes(NAME, b"3" * 5000, step=3)
    pending = door.read(record_path(NAME))
    assert pending is not None
    store.put_bytes(NAME, GOOD, step=2, overwrite=True)
    intent = record_path(NAME).replace("/.commitstore.rec.", "/.commitstore.new.")
    door.write(intent, pending)
    door.write(NAME, BAD)
    record = door.read(record_path(NAME))
    stopped_holder(root)
    for what, read in _readers(store, tmp_path).items():
        err = within(120, read, _BLOCKED)
        assert isinstance(err, IntegrityError), (what, err)
        assert not isinstance(err, BackendUnavailableError)
        assert err.status in ("hash_mismatch", "size_mismatch"), (what, err)
    _unchanged(root, record, tmp_path)
    assert door.read(intent) == pending


# -- get_file destinations ---------------------------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _chardev(path: Path) -> None:
    # needs root (as CI runs): a run without it fails here rather than skip the case
    # a private node with /dev/null's numbers, in the test's own folder (never the real one)
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


@pytest.mark.parametrize("inside", [False, True], ids=["at-dest", "in-dest-folder"])
@pytest.mark.parametrize("make", [_fifo, _chardev, _socket], ids=["fifo", "chardev", "socket"])
def test_get_file_never_replaces_a_fifo_socket_or_device(
    tmp_path: Path, make: Callable[[Path], None], inside: bool
) -> None:
    """``cp`` would write into the node; get_file replaced it with a regular file. Now it is
    refused (NameConflictError) and the node stays: same inode, same type, same numbers."""
    store = open_store(tmp_path / "s")
    store.put_bytes("run/a.bin", b"payload")
    out = tmp_path / "out"
    out.mkdir()
    node = out / "a.bin"
    make(node)
    before = os.lstat(node)
    with pytest.raises(NameConflictError, match="neither replaces it nor writes into it"):
        store.get_file("run/a.bin", out if inside else node)
    after = os.lstat(node)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (
        before.st_ino,
        before.st_mode,
        before.st_rdev,
    )
    assert sorted(p.name for p in out.iterdir()) == ["a.bin"]


def test_get_file_to_an_empty_path_is_refused_before_any_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Path("")`` is ``.``: the copy landed in the current directory unasked."""
    store = open_store(tmp_path / "s")
    store.put_bytes("a.bin", b"payload")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(ConfigurationError, match="empty"):
        store.get_file("a.bin", "")
    assert list(cwd.iterdir()) == []
    # before any I/O: a store with nothing at its root answers the same, not NotFoundError
    with pytest.raises(ConfigurationError, match="empty"):
        open_store(tmp_path / "none").get_file("a.bin", "")
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("dest", ["out\0x", "\0"])
def test_get_file_to_a_path_with_a_nul_is_a_typed_error_before_any_io(
    tmp_path: Path, dest: str
) -> None:
    """A NUL raised a bare ValueError from the first stat; now a ConfigurationError (still a
    ValueError) before anything is read, the store's record included."""
    store = open_store(tmp_path / "s")
    store.put_bytes("a.bin", b"payload")
    with pytest.raises(ConfigurationError, match="NUL"):
        store.get_file("a.bin", tmp_path / dest)
    with pytest.raises(ConfigurationError, match="NUL"):
        open_store(tmp_path / "none").get_file("a.bin", dest)
    assert not (tmp_path / "none").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_fetch_to_a_cache_dir_with_a_nul_is_a_typed_error_before_any_io(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="NUL"):
        open_store(tmp_path / "none").fetch("a.bin", tmp_path / "c\0x")
    assert list(tmp_path.iterdir()) == []
