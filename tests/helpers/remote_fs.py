"""Cases shared by the SFTP and WebDAV tests (the fsspec-checked strategy on a real server):
a writer SIGKILLed mid-write, a server SIGKILLed mid-upload, a local primary mirrored there,
and a missing extra. Each reads the server's folder on disk through a LocalBackdoor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from commitstore import BackendUnavailableError, CommitStore, ConfigurationError, open_store
from commitstore.testing import Backdoor, LocalBackdoor, Target, record_path

from .payload import chunks

MiB = 1024 * 1024
ROOT_DIR = Path(__file__).resolve().parents[2]
STAGING = ".commitstore.tmp."


class Server(Protocol):
    root: Path
    port: int
    kills: int

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def url(self, path: str) -> str: ...


@dataclass
class Remote:
    """A store's URL and options on a server, and the server's folder for it on disk."""

    url: str
    options: dict[str, Any]
    disk: Path

    def open(self, **kw: Any) -> CommitStore:
        return open_store(self.url, **self.options, **kw)

    def target(self) -> Target:
        return Target(self.open(), LocalBackdoor(self.disk), self.open)


def remote(server: Server, options: dict[str, Any], prefix: str = "srv") -> Remote:
    sub = f"{prefix}/t{time.monotonic_ns()}"
    return Remote(server.url(sub), options, server.root / sub)


def mirrored(tmp: Path, mirror: Remote) -> Iterator[Target]:
    """A local primary with ``mirror`` as a sync mirror; afterwards every commit the suite made
    must have reached the mirror whole, with the primary's record byte for byte."""
    local = tmp / f"primary{time.monotonic_ns()}"
    door = LocalBackdoor(local)

    def opened() -> CommitStore:
        return open_store(str(local), mirrors=[mirror.open()], mirror_mode="sync")

    store = opened()
    yield Target(store, door, opened)
    assert mirror.open().verify(level="size").ok
    mdoor = LocalBackdoor(mirror.disk)
    for rec in store.list():
        if store.verify(rec.name).ok:
            assert mdoor.read(record_path(rec.name)) == door.read(record_path(rec.name))


PENDING = ".commitstore.new."


def staging_left(door: Backdoor, hint: str) -> list[str]:
    """The staging files about ``hint`` left on the target; anything else about it may only be
    its pending record (written before the data is moved into place)."""
    left = [f for f in door.files() if hint in f]
    assert all(STAGING in f or PENDING in f.rsplit("/", 1)[-1] for f in left), left
    return [f for f in left if STAGING in f]


def leftovers(door: Backdoor) -> list[str]:
    return [f for f in door.files() if STAGING in f or PENDING in f]


def sigkill_mid_write(rem: Remote) -> None:
    """A child writing a 96 MiB artifact is SIGKILLed while its staging file grows: only the
    staging name is left, gc removes it, the old version still verifies."""
    target = rem.target()
    target.store.put_bytes("step_0001.pt", b"whole")
    env = {**os.environ, "WRITER_STORE_OPTIONS": json.dumps(rem.options)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT_DIR / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.writer", rem.url, "step_0002.pt", "7", str(96 * MiB)],
        cwd=ROOT_DIR,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    assert proc.stdout.readline().startswith("wrote ")  # the stage holds bytes now
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    assert target.door.read("step_0002.pt") is None
    assert target.door.read(record_path("step_0002.pt")) is None
    staging_left(target.door, "step_0002")
    latest = rem.open().latest()
    assert latest is not None and latest.name == "step_0001.pt"
    assert rem.open().gc().removed == ()  # young: a writer may still own them
    rem.open().gc(min_age=0)
    assert leftovers(target.door) == []
    assert rem.open().read_bytes("step_0001.pt") == b"whole"


def _kill_when_staged(server: Server, disk: Path, at_least: int, done: threading.Event) -> None:
    """SIGKILL the server once a staging file on its disk holds ``at_least`` bytes."""
    deadline = time.monotonic() + 120
    while not done.is_set() and time.monotonic() < deadline:
        for path in disk.rglob(f"{STAGING}*"):
            try:
                if path.is_file() and path.stat().st_size >= at_least:
                    server.kill()
                    done.set()
                    return
            except FileNotFoundError:
                continue
        time.sleep(0.002)


def server_killed_mid_upload(server: Server, options: dict[str, Any]) -> None:
    """The server is SIGKILLed while a 64 MiB staging file grows on its disk: the commit fails
    with BackendUnavailableError; after a restart only a partial staging file is left, the old
    version verifies, and gc removes the leftover."""
    rem = remote(server, options)
    rem.open().put_bytes("step_0001.pt", b"whole" * 100)
    store = rem.open()
    killed = threading.Event()
    watcher = threading.Thread(
        target=_kill_when_staged, args=(server, rem.disk, 4 * MiB, killed), daemon=True
    )
    watcher.start()
    total = 64 * MiB
    try:
        with pytest.raises(BackendUnavailableError), store.stage("step_0002.pt") as st:
            for c in chunks(3, total):
                st.write(c)
    finally:
        killed.set()
        watcher.join()
        server.start()
    assert server.kills == 1
    door = LocalBackdoor(rem.disk)
    assert door.read("step_0002.pt") is None
    assert door.read(record_path("step_0002.pt")) is None
    left = staging_left(door, "step_0002")
    assert left, "the staging file the server was writing is left"
    assert all(0 < (rem.disk / f).stat().st_size < total for f in left)
    again = rem.open()
    assert again.verify().ok
    latest = again.latest()
    assert latest is not None and latest.name == "step_0001.pt"
    report = again.gc(min_age=0)
    assert {i.path for i in report.removed if i.kind == "staging"} == set(left)
    assert leftovers(door) == []
    assert again.read_bytes("step_0001.pt") == b"whole" * 100


def missing_extra(
    monkeypatch: pytest.MonkeyPatch, url: str, blocked: list[str], extra: str
) -> None:
    """With the extra's client library absent, opening gives one line with the pip command."""
    for module in blocked:
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(ConfigurationError) as info:
        open_store(url)
    message = str(info.value)
    assert "\n" not in message
    assert f"pip install 'commitstore[{extra}]'" in message, message
