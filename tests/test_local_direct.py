"""Large local staging files are written with ``O_DIRECT`` past ``DIRECT_AFTER`` (``_direct``):
the bytes on disk are exactly the bytes given, whatever the write sizes, and a filesystem that
refuses direct I/O (ramfs, mounted in a user namespace) gets the same file written buffered."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store
from commitstore.backends.rename.posix import _direct
from commitstore.backends.rename.posix import backend as posix
from commitstore.testing import xxh

MiB = 1024 * 1024


class Spy:
    """Wraps posix.DirectWriter: which writers were made, and whether their fd was O_DIRECT
    when the first buffer was handed over."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[Any] = []
        self.direct_on_write: list[bool] = []
        spy = self
        real = _direct.DirectWriter

        class Writer(real):  # type: ignore[misc, valid-type]
            def __init__(self, fd: int) -> None:
                super().__init__(fd)
                spy.made.append(self)

            def _write(self, buf: Any, length: int, offset: int) -> None:
                spy.direct_on_write.append(bool(fcntl.fcntl(self.fd, fcntl.F_GETFL) & os.O_DIRECT))
                super()._write(buf, length, offset)

        monkeypatch.setattr(posix, "DirectWriter", Writer)


SIZES = [
    posix.DIRECT_AFTER - 1,
    posix.DIRECT_AFTER + 1,
    posix.DIRECT_AFTER + 2 * _direct.BUFFER + _direct.ALIGN + 1,
]


@pytest.mark.parametrize("chunk", [4 * MiB, MiB + 3], ids=["4MiB", "1MiB+3"])
@pytest.mark.parametrize("size", SIZES, ids=["below", "just-past", "buffers+tail"])
def test_a_large_stage_is_written_direct_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, chunk: int
) -> None:
    spy = Spy(monkeypatch)
    data = os.urandom(size)
    store = open_store(tmp_path / "s")
    with store.stage("big.bin") as st:
        for i in range(0, size, chunk):
            st.write(data[i : i + chunk])
    assert (tmp_path / "s" / "big.bin").read_bytes() == data
    assert store.record("big.bin").digest == xxh(data)
    assert store.verify("big.bin", level="full").ok
    if size > posix.DIRECT_AFTER:
        assert len(spy.made) == 1 and not spy.made[0].direct  # O_DIRECT off after the tail
        full, rest = divmod(size - posix.DIRECT_AFTER, _direct.BUFFER)
        # every full buffer, then the aligned part of the rest: all written with O_DIRECT on
        assert spy.direct_on_write == [True] * (full + (rest >= _direct.ALIGN))
    else:
        assert spy.made == []


def test_one_big_write_goes_direct_past_the_buffered_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    data = os.urandom(posix.DIRECT_AFTER + 3 * _direct.BUFFER + 17)
    store = open_store(tmp_path / "s")
    store.put_bytes("one.bin", data)
    assert (tmp_path / "s" / "one.bin").read_bytes() == data
    assert spy.direct_on_write == [True, True, True]  # (the 17-byte tail goes buffered)


def test_an_aborted_direct_stage_leaves_nothing(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    block = os.urandom(4 * MiB)
    with pytest.raises(RuntimeError), store.stage("gone.bin") as st:
        for _ in range(6):
            st.write(block)
        raise RuntimeError("caller failed")
    assert not (tmp_path / "s" / "gone.bin").exists()
    assert [p.name for p in (tmp_path / "s").iterdir() if not p.name.startswith(".")] == []


def test_a_fetched_copy_is_written_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's own file goes direct; the fetch cache's copy of it, read (mapped) next, never."""
    spy = Spy(monkeypatch)
    data = os.urandom(posix.DIRECT_AFTER + 3 * _direct.BUFFER + 17)
    store = open_store(tmp_path / "s")
    store.put_bytes("one.bin", data)
    assert len(spy.made) == 1
    path = store.fetch("one.bin", tmp_path / "cache")
    assert Path(path).read_bytes() == data
    assert len(spy.made) == 1  # no direct writer for the copy


def test_bridges_never_write_direct() -> None:
    from commitstore.backends.rename.posix.bridge import BridgeBackend

    assert posix.LocalBackend.direct_io and not BridgeBackend.direct_io


ON_RAMFS = textwrap.dedent(
    """
    import json, os, sys
    from commitstore import open_store
    from commitstore.backends.rename.posix import _direct
    from commitstore.backends.rename.posix import backend as posix

    root = sys.argv[1]
    assert open(f"/proc/self/mounts").read().count(root + " ramfs"), "not on ramfs"
    tried = []
    real = posix.set_direct
    def set_direct(fd, on):
        tried.append(real(fd, on))
        return tried[-1]
    posix.set_direct = set_direct
    made = []
    class Writer(_direct.DirectWriter):
        def __init__(self, fd):
            made.append(fd)
            super().__init__(fd)
    posix.DirectWriter = Writer
    data = os.urandom(posix.DIRECT_AFTER + 2 * _direct.BUFFER + 5)
    store = open_store(root)
    with store.stage("big.bin") as st:
        for i in range(0, len(data), 1024 * 1024 + 3):
            st.write(data[i : i + 1024 * 1024 + 3])
    with open(os.path.join(root, "big.bin"), "rb") as f:
        same = f.read() == data
    ok = store.verify("big.bin", level="full").ok
    print(json.dumps({"tried": tried, "made": len(made), "same": same, "verify": ok}))
    """
)


def test_a_filesystem_refusing_direct_io_gets_the_file_buffered(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux, in dev.sh) is needed"
    root = tmp_path / "ramfs"
    root.mkdir()
    src = str(Path(__file__).resolve().parent.parent / "src")
    script = f'mount -t ramfs none "{root}" && exec "{sys.executable}" -c "$0" "{root}"'
    proc = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script, ON_RAMFS],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"tried": [False], "made": 0, "same": True, "verify": True}
