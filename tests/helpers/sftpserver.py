"""A private SFTP server on 127.0.0.1 (asyncssh), started for the tests and stopped by PID.

The child (``python -m tests.helpers.sftpserver ROOT PORT``) generates a host key, accepts one
user by password, serves the SFTP subsystem chrooted at ROOT (so ``sftp://.../srv/run1`` is
``ROOT/srv/run1`` on disk) and prints ``ready`` once it listens. asyncssh's server announces the
``posix-rename@openssh.com``, ``fsync@openssh.com`` and ``statvfs@openssh.com`` extensions and
maps them to ``os.replace``, ``os.fsync`` and ``os.statvfs``. With ``posix_rename=False``
(a third argument ``no-posix-rename``) the server answers posix-rename requests with
``SSH_FX_OP_UNSUPPORTED``, as servers without the extension do: a replace then has no one-step
form.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

USER = "cs"
PASSWORD = "cs-Sftp-Pw-53!"
ROOT_DIR = Path(__file__).resolve().parents[2]


class SftpServer:
    """The child process; :meth:`stop` sends SIGTERM, :meth:`kill` SIGKILL (a crashed server)."""

    def __init__(self, root: Path, *, port: int | None = None, posix_rename: bool = True) -> None:
        from .samba import free_port

        self.posix_rename = posix_rename
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port if port is not None else free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.kills = 0
        """How often :meth:`kill` ended a running server."""
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.sftpserver",
                str(self.root),
                str(self.port),
                *(() if self.posix_rename else ("no-posix-rename",)),
            ],
            cwd=ROOT_DIR,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.stop()
            raise RuntimeError(f"the SFTP server did not start: {line!r}")

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
        return f"sftp://{USER}@127.0.0.1:{self.port}/{path}"

    def options(self) -> dict[str, str]:
        return {"password": PASSWORD}


async def _serve(root: str, port: int, *, posix_rename: bool) -> None:
    import asyncssh

    class NoPosixRename(asyncssh.SFTPServer):
        def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
            raise asyncssh.SFTPOpUnsupported("posix-rename is switched off")

    server_class = asyncssh.SFTPServer if posix_rename else NoPosixRename

    class Server(asyncssh.SSHServer):
        def begin_auth(self, username: str) -> bool:
            return True

        def password_auth_supported(self) -> bool:
            return True

        def validate_password(self, username: str, password: str) -> bool:
            return username == USER and password == PASSWORD

    key = asyncssh.generate_private_key("ssh-ed25519")
    await asyncssh.listen(
        "127.0.0.1",
        port,
        server_host_keys=[key],
        server_factory=Server,
        sftp_factory=lambda chan: server_class(chan, chroot=root.encode()),
        allow_scp=False,
        process_factory=None,
    )
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(sys.argv[1], int(sys.argv[2]), posix_rename=sys.argv[3:] == []))
