"""The fsspec-checked strategy on WebDAV (webdav4) against a real WebDAV server on 127.0.0.1
(wsgidav on cheroot, serving a temporary folder), started by the tests. The backdoor reads the
server's folder on disk."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import BackendUnavailableError, ConfigurationError, open_store
from commitstore.testing import LocalBackdoor, StoreConformance, Target

from .helpers import remote_fs
from .helpers.remote_fs import Remote, remote
from .helpers.webdavserver import PASSWORD, WebdavServer

OPTIONS: dict[str, Any] = {"password": PASSWORD}


@pytest.fixture(scope="module")
def dav(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebdavServer]:
    server = WebdavServer(tmp_path_factory.mktemp("webdav"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def rem(dav: WebdavServer) -> Remote:
    return remote(dav, OPTIONS)


class TestWebdavConformance(StoreConformance):
    @pytest.fixture
    def target(self, rem: Remote) -> Target:
        target = rem.target()
        info = target.store.describe()
        assert info["strategy"] == "fsspec-checked"
        assert info["move"] == "WebDAV MOVE (Overwrite: F / T)"
        return target


class TestWebdavAsMirrorConformance(StoreConformance):
    """The whole suite on a local primary whose sync mirror is the WebDAV store."""

    @pytest.fixture
    def target(self, rem: Remote, tmp_path: Path) -> Iterator[Target]:
        yield from remote_fs.mirrored(tmp_path, rem)


def test_declared_capabilities(rem: Remote) -> None:
    info = rem.open().describe()
    caps = info["capabilities"]
    assert caps["atomic_replace"] is False  # MOVE Overwrite: T may delete, then move
    assert caps["exclusive_create"] is False
    assert caps["free_space"] is False and rem.open()._backend.free_space(()) is None
    assert "1" in info["dav"]
    assert any("Overwrite: T" in note for note in info["not_guaranteed"])


def test_replace_is_one_move_and_notes_it(rem: Remote) -> None:
    store = rem.open()
    store.put_bytes("r/step_1.pt", b"old" * 1000)
    store.put_bytes("r/step_1.pt", b"new" * 1000, overwrite=True)
    door = LocalBackdoor(rem.disk)
    assert door.read("r/step_1.pt") == b"new" * 1000
    assert store.verify().ok
    assert [f for f in door.files() if ".commitstore.tmp." in f] == []


@pytest.mark.crash
def test_sigkill_during_webdav_write(rem: Remote) -> None:
    remote_fs.sigkill_mid_write(rem)


@pytest.mark.crash
def test_server_killed_mid_upload(tmp_path: Path) -> None:
    server = WebdavServer(tmp_path / "own-webdav")
    try:
        remote_fs.server_killed_mid_upload(server, OPTIONS)
    finally:
        server.stop()


def test_credentials_never_leak(dav: WebdavServer, caplog: pytest.LogCaptureFixture) -> None:
    secret = "wrong-Secret-77"
    with caplog.at_level(logging.DEBUG), pytest.raises(BackendUnavailableError) as info:
        open_store(dav.url("srv/leak"), password=secret)
    assert not info.value.retryable
    assert secret not in str(info.value) and secret not in repr(info.value)
    assert secret not in caplog.text
    store = open_store(dav.url("srv/leak"), **OPTIONS)
    for text in (repr(store), str(store.describe()), repr(store._backend)):
        assert PASSWORD not in text
    with_pw = dav.url("srv/leak").replace("cs@", f"cs:{PASSWORD}@")
    store2 = open_store(with_pw)
    assert PASSWORD not in str(store2.describe()) and PASSWORD not in repr(store2)


def test_not_a_webdav_server_is_refused(tmp_path: Path) -> None:
    """A plain HTTP server (no DAV header) is refused with a typed error, not used."""
    import http.server
    import threading

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        port = httpd.server_address[1]
        with pytest.raises((ConfigurationError, BackendUnavailableError)):
            open_store(f"webdav+http://127.0.0.1:{port}/x")
    finally:
        httpd.shutdown()
        t.join()


def test_bad_options_before_io() -> None:
    with pytest.raises(ConfigurationError, match="unknown storage options"):
        open_store("webdav+http://127.0.0.1:1/x", colour="blue")
    with pytest.raises(ConfigurationError, match="look like"):
        open_store("webdav+http:///no-host")


def test_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for url in ("webdav+http://127.0.0.1:1/x", "webdav://h/x", "dav://h/x"):
        remote_fs.missing_extra(monkeypatch, url, ["webdav4", "webdav4.fsspec"], "webdav")
