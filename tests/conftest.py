"""Shared fixtures: the built-in targets come from commitstore's own pytest plugin; servers that
several test modules use are started once per module here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, TypeVar

import pytest

from .helpers.blocking import forget_fifos
from .helpers.gcsserver import FakeGcs
from .helpers.s3servers import MotoServer, RcloneS3

pytest_plugins = ["commitstore.testing.plugin"]


class _Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Stoppable)


def _served(server: S) -> Iterator[S]:
    """Yield ``server`` (started by its constructor); stop it by PID afterwards, whatever
    happened."""
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _moto_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MotoServer]]:
    """The moto server of this test process (one per xdist worker), started when a module
    first asks for it and stopped by PID at the end of the session; a list so that a module
    whose server died can have it replaced."""
    held: list[MotoServer] = []
    try:
        yield held
    finally:
        for server in held:
            server.stop()


@pytest.fixture(scope="module")
def moto(
    _moto_process: list[MotoServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MotoServer]:
    """A moto S3 server (one request at a time) holding an empty bucket when the module
    starts: the process is shared by the modules this test process runs (moto takes seconds
    to start), its state is reset (every bucket dropped, the test bucket made again) after each
    module, and a server that no longer answers is replaced by a fresh one."""
    if not _moto_process or not _moto_process[0].alive():
        for dead in _moto_process:
            dead.stop()
        _moto_process[:] = [MotoServer(tmp_path_factory.mktemp("moto"))]
    server = _moto_process[0]
    try:
        yield server
    finally:
        try:
            server.reset()
        except Exception:  # stuck or gone: the next module starts a fresh one
            server.stop()
            _moto_process.clear()


@pytest.fixture(scope="module")
def rclone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RcloneS3]:
    """``rclone serve s3`` over a real folder, stopped by PID after the module."""
    yield from _served(RcloneS3(tmp_path_factory.mktemp("rclone")))


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """fake-gcs-server, stopped by PID after the module."""
    yield from _served(FakeGcs(tmp_path_factory.mktemp("fakegcs")))


@pytest.fixture
def unblock_fifos() -> Iterator[None]:
    """For tests that plant FIFOs (``helpers.blocking.mkfifo``): release and forget them after."""
    yield
    forget_fifos()
