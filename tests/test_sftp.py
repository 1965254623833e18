"""The fsspec-checked strategy on SFTP (sshfs) against a real SFTP server on 127.0.0.1 (asyncssh,
chrooted at a temporary folder), started by the tests. The backdoor reads the server's folder on
disk."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import (
    AlreadyExistsError,
    BackendUnavailableError,
    ConfigurationError,
    open_store,
)
from commitstore.backends import CommitInfo, PutMode
from commitstore.testing import LocalBackdoor, StoreConformance, Target

from .helpers import remote_fs
from .helpers.remote_fs import Remote, remote
from .helpers.sftpserver import PASSWORD, SftpServer

OPTIONS: dict[str, Any] = {"password": PASSWORD, "known_hosts": None}


@pytest.fixture(scope="module")
def sftp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SftpServer]:
    server = SftpServer(tmp_path_factory.mktemp("sftp"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def rem(sftp: SftpServer) -> Remote:
    return remote(sftp, OPTIONS)


class TestSftpConformance(StoreConformance):
    @pytest.fixture
    def target(self, rem: Remote) -> Target:
        target = rem.target()
        info = target.store.describe()
        assert info["strategy"] == "fsspec-checked"
        assert info["move"] == "SFTP rename / posix-rename"
        return target


class TestSftpAsMirrorConformance(StoreConformance):
    """The whole suite on a local primary whose sync mirror is the SFTP store."""

    @pytest.fixture
    def target(self, rem: Remote, tmp_path: Path) -> Iterator[Target]:
        yield from remote_fs.mirrored(tmp_path, rem)


def test_declared_capabilities_are_probed(rem: Remote) -> None:
    caps = rem.open().describe()["capabilities"]
    # asyncssh's server offers posix-rename@openssh.com and statvfs@openssh.com.
    assert caps["atomic_replace"] is True
    assert caps["free_space"] is True
    assert caps["exclusive_create"] is False  # the server checks, then renames
    assert rem.open()._backend.free_space(()) is not None


def test_no_replace_move_is_refused_by_the_server(rem: Remote) -> None:
    """The create-only move is SFTP RENAME: the server refuses an existing destination, and
    the refusal is AlreadyExistsError; both files stay as they were."""
    backend: Any = rem.open()._backend
    door = LocalBackdoor(rem.disk)
    door.write("a.bin", b"1")
    door.write("b.bin", b"2")
    with pytest.raises(Exception) as info:
        backend.rename(
            backend.root, "a.bin", "b.bin", mode=PutMode.CREATE, is_dir=False, info=CommitInfo(0)
        )
    assert isinstance(backend.error(info.value, "renaming", "b.bin"), AlreadyExistsError)
    assert (door.read("a.bin"), door.read("b.bin")) == (b"1", b"2")


def test_replace_is_atomic_for_a_concurrent_reader(rem: Remote) -> None:
    """Declared atomic_replace: a reader polling the file on the server's disk while it is
    replaced 10 times sees one whole version or the other, never nothing or a mix."""
    store = rem.open()
    versions = [bytes([i]) * 50_000 for i in range(2)]
    store.put_bytes("hot.bin", versions[0])
    door = LocalBackdoor(rem.disk)
    stop, seen, during = threading.Event(), [], [0]
    writing = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            data = door.read("hot.bin")
            seen.append(data)
            if writing.is_set():
                during[0] += 1

    t = threading.Thread(target=reader)
    t.start()
    try:
        writing.set()
        for i in range(10):
            store.put_bytes("hot.bin", versions[(i + 1) % 2], overwrite=True)
        writing.clear()
    finally:
        stop.set()
        t.join()
    assert during[0] > 0  # the reads overlapped the replaces
    assert all(d in versions for d in seen)


@pytest.mark.crash
def test_sigkill_during_sftp_write(rem: Remote) -> None:
    remote_fs.sigkill_mid_write(rem)


@pytest.mark.crash
def test_server_killed_mid_upload(tmp_path: Path) -> None:
    server = SftpServer(tmp_path / "own-sftp")
    try:
        remote_fs.server_killed_mid_upload(server, OPTIONS)
    finally:
        server.stop()


def test_credentials_never_leak(sftp: SftpServer, caplog: pytest.LogCaptureFixture) -> None:
    secret = "wrong-Secret-77"
    with caplog.at_level(logging.DEBUG), pytest.raises(BackendUnavailableError) as info:
        open_store(sftp.url("srv/leak"), password=secret, known_hosts=None)
    assert not info.value.retryable
    assert secret not in str(info.value) and secret not in repr(info.value)
    assert secret not in caplog.text
    store = open_store(sftp.url("srv/leak"), **OPTIONS)
    for text in (repr(store), str(store.describe()), repr(store._backend)):
        assert PASSWORD not in text
    with_pw = sftp.url("srv/leak").replace("cs@", f"cs:{PASSWORD}@")
    store2 = open_store(with_pw, known_hosts=None)
    assert PASSWORD not in str(store2.describe()) and PASSWORD not in repr(store2)


def test_unknown_host_key_refused_by_default(sftp: SftpServer) -> None:
    """Without ``known_hosts=None`` the server's key must be known (asyncssh's default)."""
    with pytest.raises(BackendUnavailableError, match="known_hosts") as info:
        open_store(sftp.url("srv/hostkey"), password=PASSWORD)
    assert not info.value.retryable


def test_bad_options_before_io() -> None:
    with pytest.raises(ConfigurationError, match="unknown storage options"):
        open_store("sftp://u@127.0.0.1:1/x", colour="blue")
    with pytest.raises(ConfigurationError, match="port must be an integer"):
        open_store("sftp://u@127.0.0.1:1/x", port="twenty")
    with pytest.raises(ConfigurationError, match="look like"):
        open_store("sftp:///no-host")


def test_forced_generic_strategy_over_sshfs(rem: Remote) -> None:
    """``strategy="fsspec"``: the generic strategy (fsspec's ``mv``, sshfs's posix-rename)
    commits, replaces and refuses a taken name."""
    store = open_store(rem.url, strategy="fsspec", **OPTIONS)
    info = store.describe()
    assert info["strategy"] == "fsspec-checked" and info["move"] == "fsspec mv"
    assert info["capabilities"]["atomic_replace"] is False
    store.put_bytes("g/step_1.pt", b"one")
    store.put_bytes("g/step_1.pt", b"two!", overwrite=True)
    with store.stage_dir("g/ckpt-2") as d:
        (d / "w.bin").write_bytes(b"w" * 100)
    with store.stage_dir("g/ckpt-2", overwrite=True) as d:
        (d / "w.bin").write_bytes(b"v" * 10)
    door = LocalBackdoor(rem.disk)
    assert door.read("g/step_1.pt") == b"two!"
    assert door.read("g/ckpt-2/w.bin") == b"v" * 10
    assert store.verify().ok
    assert [f for f in door.files() if ".commitstore.tmp." in f] == []


def test_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    remote_fs.missing_extra(monkeypatch, "sftp://u@127.0.0.1:1/x", ["sshfs"], "sftp")
