"""SMB strategy against a real Samba server on 127.0.0.1 (Debian's samba), started by the tests.

The backdoor reads the share's folder on the server's disk; the Debian ``smbclient`` CLI is used as
an independent client.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commitstore import (
    BackendUnavailableError,
    CommitError,
    InsufficientSpaceError,
    open_store,
)
from commitstore.testing import LocalBackdoor, StoreConformance, Target, record_path, xxh

from .helpers.fusemount import FaultMount
from .helpers.samba import PASSWORD, SambaServer

MiB = 1024 * 1024
ROOT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def samba(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SambaServer]:
    server = SambaServer(tmp_path_factory.mktemp("samba"))
    try:
        yield server
    finally:
        server.stop()


def _target(server: SambaServer, share_dir: Path) -> Target:
    sub = f"t{time.monotonic_ns()}"
    url = server.url(sub)
    return Target(
        open_store(url, password=PASSWORD),
        LocalBackdoor(share_dir / sub),
        lambda: open_store(url, password=PASSWORD),
    )


@pytest.fixture
def smb(samba: SambaServer) -> Target:
    return _target(samba, samba.share_dir)


class TestSmbConformance(StoreConformance):
    @pytest.fixture
    def target(self, smb: Target) -> Target:
        assert smb.store.describe()["strategy"] == "smb-checked"
        return smb


def test_independent_client_reads_what_was_committed(
    smb: Target, samba: SambaServer, tmp_path: Path
) -> None:
    data = os.urandom(3 * MiB + 17)
    smb.store.put_bytes("ckpt/step_0042.pt", data)
    sub = smb.store.url.rsplit("/", 1)[1]
    out = tmp_path / "fetched.pt"
    res = samba.cli(f"get {sub}/ckpt/step_0042.pt {out}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert xxh(out.read_bytes()) == xxh(data)
    rec_out = tmp_path / "rec.json"
    res = samba.cli(f'get "{sub}/{record_path("ckpt/step_0042.pt")}" {rec_out}')
    assert res.returncode == 0, res.stdout + res.stderr
    assert xxh(data) in rec_out.read_text()
    listing = samba.cli(f"ls {sub}/ckpt/*").stdout
    assert "step_0042.pt" in listing
    assert ".commitstore.tmp." not in listing


def test_credentials_never_leak(samba: SambaServer, caplog: pytest.LogCaptureFixture) -> None:
    secret = "wrong-Secret-77"
    with caplog.at_level(logging.DEBUG), pytest.raises(BackendUnavailableError) as info:
        open_store(samba.url("leak"), password=secret)
    assert secret not in str(info.value)
    assert secret not in repr(info.value)
    assert secret not in caplog.text
    store = open_store(samba.url("leak"), password=PASSWORD)
    for text in (repr(store), str(store.describe()), repr(store._backend)):
        assert PASSWORD not in text
    url_with_pw = samba.url("leak").replace("root@", f"root:{PASSWORD}@")
    store2 = open_store(url_with_pw)
    assert PASSWORD not in str(store2.describe())


def _staged_sizes(door: LocalBackdoor, name: str) -> dict[str, int]:
    """Staging files of ``name`` on the share's disk, with their sizes."""
    out = {}
    for f in door.files():
        if ".commitstore.tmp." in f and f.endswith(name):
            with contextlib.suppress(FileNotFoundError):
                out[f] = (door.root / f).stat().st_size
    return out


def test_sigkill_during_smb_write(smb: Target) -> None:
    smb.store.put_bytes("step_0001.pt", b"whole")
    env = {**os.environ, "COMMITSTORE_SMB_PASSWORD": PASSWORD}
    for trial in range(3):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.writer",
                smb.store.url,
                "step_0002.pt",
                str(trial),
                str(96 * MiB),
            ],
            cwd=ROOT_DIR,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        # Killed mid-write, confirmed: the writer reported this many bytes and the share holds a
        # non-empty staging file of it while the writer still runs.
        wanted = (1, 32 * MiB, 64 * MiB)[trial]
        while True:
            line = proc.stdout.readline().split()
            assert line and line[0] == "wrote", f"writer ended early: {line}"
            if int(line[1]) >= wanted:
                break
        deadline = time.monotonic() + 10
        door = smb.door
        assert isinstance(door, LocalBackdoor)
        while not any(size > 0 for size in _staged_sizes(door, "step_0002.pt").values()):
            assert time.monotonic() < deadline, "no staging file reached the share"
            time.sleep(0.002)
        assert proc.poll() is None, "the writer finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert smb.door.read("step_0002.pt") is None
        assert smb.door.read(record_path("step_0002.pt")) is None
        leftovers = [f for f in smb.door.files() if "step_0002" in f]
        assert all(".commitstore.tmp." in f for f in leftovers)
    latest = smb.reopen().latest()
    assert latest is not None
    assert latest.name == "step_0001.pt"
    assert smb.reopen().gc().removed == ()  # young: a writer may still own them
    report = smb.reopen().gc(min_age=0)
    assert len(report.removed) >= 1
    assert [f for f in smb.door.files() if ".commitstore.tmp." in f] == []
    assert smb.reopen().read_bytes("step_0001.pt") == b"whole"


def test_samba_stopped_mid_write(tmp_path: Path) -> None:
    server = SambaServer(tmp_path / "own-samba")
    try:
        target = _target(server, server.share_dir)
        target.store.put_bytes("step_0001.pt", b"whole" * 100)
        st = target.store.stage("step_0002.pt")
        st.write(b"a" * 8 * MiB)
        server.stop()
        with pytest.raises(BackendUnavailableError):
            for _ in range(16):
                st.write(b"b" * MiB)
            st.commit()
        server.start()
        assert target.door.read("step_0002.pt") is None
        assert target.door.read(record_path("step_0002.pt")) is None
        again = target.reopen()
        assert again.verify().ok
        latest = again.latest()
        assert latest is not None
        assert latest.name == "step_0001.pt"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def samba_on_faults(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SambaServer, FaultMount]]:
    """Samba serving a share that lives on the fault-injecting FUSE filesystem."""
    base = tmp_path_factory.mktemp("samba-faults")
    mount = FaultMount(base / "fuse")
    server = SambaServer(base / "samba", share_dir=mount.mnt)
    try:
        yield server, mount
    finally:
        server.stop()
        mount.stop()


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        (
            {"short_write": {"match": "step_0002", "after": 5 * MiB}},
            CommitError,
            f"{5 * MiB} bytes stored, {8 * MiB} written",
        ),
        ({"write_eio": {"match": "step_0002", "after": int(0.73 * 8 * MiB)}}, CommitError, None),
        ({"write_enospc": {"match": "step_0002", "after": 2 * MiB}}, InsufficientSpaceError, None),
    ],
)
def test_server_side_faults_publish_nothing(
    samba_on_faults: tuple[SambaServer, FaultMount],
    fault: dict[str, object],
    error: type,
    message: str | None,
) -> None:
    server, mount = samba_on_faults
    mount.clear()
    target = _target(server, mount.backing)
    target.store.put_bytes("step_0001.pt", b"whole" * 100)
    mount.set(**fault)  # type: ignore[arg-type]
    try:
        with pytest.raises(error, match=message), target.store.stage("step_0002.pt") as st:
            for _ in range(8):
                st.write(b"c" * MiB)
    finally:
        mount.clear()
    assert target.door.read("step_0002.pt") is None
    assert target.door.read(record_path("step_0002.pt")) is None
    assert target.reopen().verify().ok
