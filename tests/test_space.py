"""Disk full on a real small filesystem (tmpfs, mounted as root by the test)."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from commitstore import InsufficientSpaceError, open_store
from commitstore.testing import LocalBackdoor

MiB = 1024 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_known_size_checked_before_touching_target(small_fs: Path, tmp_path: Path) -> None:
    store = open_store(small_fs / "s")
    store.put_bytes("step_1", b"a" * MiB)
    door = LocalBackdoor(small_fs / "s")
    before = door.files()
    with pytest.raises(InsufficientSpaceError) as info:
        store.put_bytes("step_2", b"b" * 16 * MiB)
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert info.value.needed == 16 * MiB
    big = tmp_path / "big.bin"
    big.write_bytes(b"c" * 12 * MiB)
    with pytest.raises(InsufficientSpaceError):
        store.put_file("step_3", big)
    assert door.files() == before
    assert store.verify().ok


def test_enospc_mid_stream_cleans_up_and_keeps_earlier(small_fs: Path) -> None:
    store = open_store(small_fs / "s")
    store.put_bytes("step_1", b"a" * MiB)
    store.put_bytes("step_2", b"b" * MiB)
    door = LocalBackdoor(small_fs / "s")
    before = door.files()
    with pytest.raises(InsufficientSpaceError), store.stage("step_3") as st:
        for _ in range(64):
            st.write(b"c" * MiB)
    assert door.files() == before
    assert store.verify().ok
    latest = store.latest()
    assert latest is not None and latest.name == "step_2"
    # Space is back: the next commit works.
    store.put_bytes("step_3", b"d" * MiB)
    assert [r.name for r in store.list()] == ["step_1", "step_2", "step_3"]


def test_get_file_checks_destination_space(small_fs: Path, tmp_path: Path) -> None:
    store = open_store(tmp_path / "src")
    store.put_bytes("big", b"x" * 16 * MiB)
    with pytest.raises(InsufficientSpaceError):
        store.get_file("big", small_fs / "big")
    assert list(small_fs.iterdir()) == []
