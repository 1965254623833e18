"""Shared setup of the upload-resume tests (S3, GCS, Azure): a ``put_file`` writer subprocess
(``tests.helpers.putwriter``) SIGKILLed mid-upload through a slowed proxy, and the resume state
it leaves, read through the store's backdoor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .faultproxy import FaultProxy

ROOT_DIR = Path(__file__).resolve().parent.parent.parent
NAME = "run/step_0007.pt"
STATE_DIR = ".commitstore/resume/"


class Door(Protocol):
    """What the helpers read through a backdoor."""

    def files(self) -> list[str]: ...

    def read(self, name: str) -> bytes | None: ...


def random_file(path: Path, size: int) -> Path:
    """``path`` written with ``size`` random bytes."""
    path.write_bytes(os.urandom(size))
    return path


def states(door: Door) -> list[str]:
    """The resume states under the backdoor's prefix."""
    return [f for f in door.files() if f.startswith(STATE_DIR)]


def read_state(door: Door, source: Path | None = None) -> tuple[str, dict[str, Any]]:
    """(where, state) of the one resume state under the prefix; with ``source``, its
    ``"__source"`` is that path (what a hostile edit may read; dropped before the state is
    written back)."""
    (where,) = states(door)
    state: dict[str, Any] = json.loads(door.read(where) or b"")
    if source is not None:
        state["__source"] = str(source)
    return where, state


def writer(
    url: str, src: Path, env: dict[str, str], *, name: str = NAME, stdin: bool = False
) -> subprocess.Popen[str]:
    """A ``put_file`` writer subprocess of ``src`` as ``name`` (``env`` on top of this
    process's: its ``WRITER_STORE_OPTIONS`` among them); its stdin a pipe when ``stdin``."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.putwriter", url, name, str(src)],
        cwd=ROOT_DIR,
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def kill_when_landed(
    url: str,
    src: Path,
    env: dict[str, str],
    *,
    slow: FaultProxy,
    landed: Callable[[], int],
    goal: int,
    timeout: float,
    poll: float,
) -> int:
    """Run a :func:`writer` of ``src`` whose requests go through ``slow``; once ``landed()``
    (read through the backdoor every ``poll`` seconds) reaches ``goal`` (or the writer ended, or
    ``timeout`` seconds passed) ``slow`` stops forwarding, the writer is SIGKILLed and ``slow``
    closed (the request in flight never completes). Returns the last ``landed()`` read."""
    try:
        proc = writer(url, src, env)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + timeout
            got = 0
            while time.monotonic() < deadline and got < goal and proc.poll() is None:
                got = landed()
                time.sleep(poll)
            slow.freeze()  # nothing more reaches the server
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    finally:
        slow.stop()
    return got
