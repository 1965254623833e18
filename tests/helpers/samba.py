"""A private Samba server on 127.0.0.1, started for the tests and stopped by PID.

Nothing under /etc, /var or /run is touched: every state folder lives under the given base folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

USER = "root"
PASSWORD = "cs-Test-Pw-91!"
SHARE = "share"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class SambaServer:
    """``smbd`` in the foreground with a private smb.conf and one read-write share."""

    def __init__(self, base: Path, *, share_dir: Path | None = None) -> None:
        for tool in ("smbd", "smbpasswd"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} not found: install Debian's samba package")
        self.base = base
        self.share_dir = share_dir if share_dir is not None else base / "share"
        self.share_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.conf = base / "smb.conf"
        state = base / "state"
        for sub in ("private", "lock", "state", "cache", "pid", "ncalrpc", "binddns"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            f"""[global]
server role = standalone server
smb ports = {self.port}
interfaces = 127.0.0.1
bind interfaces only = yes
disable netbios = yes
private dir = {state}/private
lock directory = {state}/lock
state directory = {state}/state
cache directory = {state}/cache
pid directory = {state}/pid
ncalrpc dir = {state}/ncalrpc
binddns dir = {state}/binddns
passdb backend = tdbsam:{state}/private/passdb.tdb
load printers = no
printing = bsd
printcap name = /dev/null
disable spoolss = yes
server min protocol = SMB2_10
map to guest = Bad User
usershare path =
log level = 0

[{SHARE}]
path = {self.share_dir}
read only = no
force user = root
"""
        )
        subprocess.run(
            ["smbpasswd", "-c", str(self.conf), "-s", "-a", USER],
            input=f"{PASSWORD}\n{PASSWORD}\n",
            text=True,
            check=True,
            capture_output=True,
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self._log = open(self.base / "smbd.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["smbd", "--foreground", "--no-process-group", "--debug-stdout", "-s", str(self.conf)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # smbd signals its whole process group on shutdown
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"smbd did not start: {(self.base / 'smbd.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop smbd and every child it forked (one per client connection)."""
        if self.proc is not None and self.proc.poll() is None:
            children = _children(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc = None
        self._log.close()

    def url(self, path: str) -> str:
        return f"smb://{USER}@127.0.0.1:{self.port}/{SHARE}/{path}"

    def cli(self, *commands: str) -> subprocess.CompletedProcess[str]:
        """The Debian ``smbclient`` CLI: an independent client to check what was written."""
        return subprocess.run(
            [
                "smbclient",
                f"//127.0.0.1/{SHARE}",
                "-p",
                str(self.port),
                "-U",
                f"{USER}%{PASSWORD}",
                "-c",
                "; ".join(commands),
            ],
            capture_output=True,
            text=True,
            check=False,
        )


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out
