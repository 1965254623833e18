"""The local full verify hashes the page cache through a leased mapping (``_maphash``): the same
digest as a plain read, the plain read whenever the mapping is not safe, and a file truncated
while it is hashed gives a mismatch instead of a SIGBUS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from commitstore import open_store
from commitstore.backends.rename.posix import _maphash
from commitstore.digest import hash_stream

MiB = 1024 * 1024


def _plain(path: Path) -> tuple[int, str]:
    with open(path, "rb", buffering=0) as f:
        return hash_stream(f)


def _mapped(path: Path) -> tuple[int, str] | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return _maphash.hash_mapped(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "size",
    [_maphash.MIN_SIZE, 9 * MiB + 123, 2 * _maphash.SLICE, 2 * _maphash.SLICE + 4095],
)
def test_mapped_digest_is_the_plain_digest(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    assert _mapped(path) == _plain(path) == (size, _plain(path)[1])
    fd = os.open(path, os.O_RDONLY)  # cold: the pages evicted first, same digest
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert _mapped(path) == _plain(path)


def test_small_files_and_files_open_for_writing_are_read_plainly(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"x" * (_maphash.MIN_SIZE - 1))
    assert _mapped(small) is None
    big = tmp_path / "big"
    big.write_bytes(os.urandom(_maphash.MIN_SIZE))
    with open(big, "r+b"):  # a writer holds it open: no read lease, so no mapping
        assert _mapped(big) is None
    assert _mapped(big) == _plain(big)


def test_a_handler_for_the_break_notice_keeps_the_plain_read(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(os.urandom(_maphash.MIN_SIZE))
    old = signal.signal(signal.SIGURG, lambda *_: None)
    try:
        assert _mapped(big) is None
    finally:
        signal.signal(signal.SIGURG, old)


def test_verify_of_a_large_local_file_goes_through_the_mapping(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    data = os.urandom(3 * _maphash.SLICE + 5)
    store.put_bytes("big.bin", data)
    seen: list[tuple[int, str] | None] = []
    real = _maphash.hash_mapped

    def spy(fd: int) -> tuple[int, str] | None:
        seen.append(real(fd))
        return seen[-1]

    _maphash.hash_mapped = spy
    try:
        assert store.verify("big.bin", level="full").ok
        with open(tmp_path / "s" / "big.bin", "r+b") as f:  # one byte flipped in place
            f.seek(len(data) // 2)
            f.write(bytes([data[len(data) // 2] ^ 1]))
        report = store.verify("big.bin", level="full")
    finally:
        _maphash.hash_mapped = real
    assert not report.ok
    assert [s is not None for s in seen] == [True, True]
    assert seen[0] == (len(data), store.record("big.bin").digest) != seen[1]


TRUNCATE_WHILE_HASHING = textwrap.dedent(
    """
    import fcntl, json, os, sys, threading
    from commitstore.backends.rename.posix import _maphash

    path = sys.argv[1]
    control = len(sys.argv) > 2
    if control:  # no lease taken (the mapping alone is not safe)
        _maphash._take_lease = _maphash._lease_held = lambda fd: True
    fd = os.open(path, os.O_RDONLY)
    events = []
    real = _maphash._populate
    calls = [0]

    def truncate():
        events.append("truncate starts")
        os.truncate(path, 3 * 1024 * 1024)  # blocks while the lease is held
        events.append("truncate returned")

    def populate(addr, length):
        ok = real(addr, length)
        calls[0] += 1
        if calls[0] == 2:  # mid-file, slice paged in: a writer truncates; the kernel holds it
            t = threading.Thread(target=truncate)  # back until the lease is released
            t.start()
            while t.is_alive() and (control or fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK):
                t.join(0.001)  # (the control holds no lease: the truncation just completes)
            events.append("break pending, truncate waiting: " + str(t.is_alive()))
        return ok

    _maphash._populate = populate
    result = _maphash.hash_mapped(fd)
    events.append("hashed")
    for t in threading.enumerate():
        if t is not threading.current_thread():
            t.join()
    print(json.dumps({"result": result, "events": events}))
    """
)


def _truncate_while_hashing(path: Path, *control: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parent.parent / "src")
    return subprocess.run(
        [sys.executable, "-c", TRUNCATE_WHILE_HASHING, str(path), *control],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
        timeout=120,
    )


def test_a_file_truncated_while_it_is_hashed_is_a_mismatch_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(4 * _maphash.SLICE))
    full = _plain(path)
    proc = _truncate_while_hashing(path)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)  # -7 would be SIGBUS
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    events = out["events"]
    # the truncation overlapped the hashing: it started mid-file and was held back by the lease
    assert events[:2] == ["truncate starts", "break pending, truncate waiting: True"], events
    assert set(events[2:]) == {"truncate returned", "hashed"}, events
    size, digest = out["result"]
    assert size < full[0] and digest != full[1]
    assert os.path.getsize(path) == 3 * MiB


def test_without_the_lease_the_same_truncation_kills_the_process(tmp_path: Path) -> None:
    """The control of the test above: what the lease prevents is real."""
    path = tmp_path / "f"
    path.write_bytes(os.urandom(4 * _maphash.SLICE))
    proc = _truncate_while_hashing(path, "no-lease")
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr)
