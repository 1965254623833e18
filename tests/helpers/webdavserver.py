"""A private WebDAV server on 127.0.0.1 (wsgidav on cheroot), started for the tests and stopped
by PID.

The child (``python -m tests.helpers.webdavserver ROOT PORT``) serves ROOT at ``/`` to one user
(HTTP basic auth) and prints ``ready`` once it listens. wsgidav's filesystem provider writes a
PUT body straight into the destination file as it arrives, answers MOVE with ``Overwrite: F``
412 when the destination exists (a check, then a rename: not atomic against a racing MOVE), and
MOVE with ``Overwrite: T`` by deleting the destination and then renaming.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

USER = "cs"
PASSWORD = "cs-Dav-Pw-17!"
ROOT_DIR = Path(__file__).resolve().parents[2]


class WebdavServer:
    """The child process; :meth:`stop` sends SIGTERM, :meth:`kill` SIGKILL (a crashed server)."""

    def __init__(self, root: Path, *, port: int | None = None) -> None:
        from .samba import free_port

        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port if port is not None else free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.kills = 0
        """How often :meth:`kill` ended a running server."""
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.webdavserver", str(self.root), str(self.port)],
            cwd=ROOT_DIR,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.stop()
            raise RuntimeError(f"the WebDAV server did not start: {line!r}")

    def _end(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kills += 1
        self._end(signal.SIGKILL)

    def url(self, path: str) -> str:
        return f"webdav+http://{USER}@127.0.0.1:{self.port}/{path}"

    def options(self) -> dict[str, str]:
        return {"password": PASSWORD}


def _serve(root: str, port: int) -> None:
    from cheroot import wsgi
    from wsgidav.wsgidav_app import WsgiDAVApp

    app = WsgiDAVApp(
        {
            "host": "127.0.0.1",
            "port": port,
            "provider_mapping": {"/": root},
            "simple_dc": {"user_mapping": {"*": {USER: {"password": PASSWORD}}}},
            "http_authenticator": {
                "domain_controller": None,
                "accept_basic": True,
                "accept_digest": False,
                "default_to_digest": False,
            },
            "verbose": 0,
            "logging": {"enable": False},
            "property_manager": True,
            "lock_storage": True,
        }
    )
    server = wsgi.Server(("127.0.0.1", port), app, numthreads=8)
    # cheroot's stop() waits for its worker threads; the tests only need the process gone.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server.prepare()
    print("ready", flush=True)
    server.serve()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
