"""A stopped or hung holder of a local store's publish lock does not block writers forever:
they wait ``lock_timeout`` seconds (a storage option), then raise BackendUnavailableError and
change nothing; once the holder is gone, commits go through again. The holder is a real
process, stopped with SIGSTOP while it holds the lock; the store is read through the disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from commitstore import BackendUnavailableError, ConfigurationError, open_store
from commitstore.testing import record_path

from .helpers.within import within

_BLOCKED = "the writer is still blocked on the publish lock"

HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _stopped_holder(lock: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("strategy", ["local", "bridge"])
def test_a_stopped_lock_holder_makes_writers_fail_typed_not_hang(
    tmp_path: Path, strategy: str
) -> None:
    root = tmp_path / "s"
    store = open_store(root, strategy=strategy, lock_timeout=0.5)
    store.put_bytes("old.bin", b"old")
    holder = _stopped_holder(root / ".commitstore" / "lock")
    try:
        err = within(120, lambda: store.put_bytes("new.bin", b"new"), _BLOCKED)
        assert isinstance(err, BackendUnavailableError), err
        assert "publish lock" in str(err) and "0.5 s" in str(err)
        err = within(120, lambda: store.put_bytes("old.bin", b"changed", overwrite=True), _BLOCKED)
        assert isinstance(err, BackendUnavailableError), err
        # nothing changed: the old artifact and its record are as they were, no new name
        assert (root / "old.bin").read_bytes() == b"old"
        assert (root / record_path("old.bin")).exists()
        assert not (root / "new.bin").exists()
        assert not (root / record_path("new.bin")).exists()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    store.put_bytes("new.bin", b"new")  # the kernel dropped the dead holder's lock
    assert (root / "new.bin").read_bytes() == b"new"
    assert store.verify("old.bin", level="full").ok


def test_the_default_deadline_waits_out_a_short_hold(tmp_path: Path) -> None:
    """A holder that lets go within the deadline delays the commit, which then lands."""
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("a.bin", b"a")
    holder = _stopped_holder(root / ".commitstore" / "lock")
    timer = threading.Timer(0.3, lambda: os.kill(holder.pid, signal.SIGKILL))
    timer.start()
    try:
        assert within(120, lambda: store.put_bytes("b.bin", b"b"), _BLOCKED) is None
    finally:
        timer.join()
        holder.wait()
    assert (root / "b.bin").read_bytes() == b"b"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_bad_lock_timeout_is_refused_before_any_io(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigurationError, match="lock_timeout"):
        open_store(tmp_path / "s", lock_timeout=bad)
    assert not (tmp_path / "s").exists()
