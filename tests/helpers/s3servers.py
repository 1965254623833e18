"""S3 servers on 127.0.0.1 for the tests: moto server and ``rclone serve s3``, stopped by PID."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from .samba import free_port

ACCESS_KEY = "cs-test-access"
SECRET_KEY = "cs-test-secret-9"
BUCKET = "commitstore-test"


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.05)


class S3Server:
    """Common surface: endpoint, credentials, a boto3 client, store options."""

    name = "s3"

    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = base / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def env(self) -> dict[str, str]:
        """Environment for a child process that opens the store by URL alone."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def alive(self) -> bool:
        """The server process is running and accepts connections."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class MotoServer(S3Server):
    """moto's S3 server (in memory), one request at a time (see ``moto_serial``); honours
    IfNoneMatch."""

    name = "moto"

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.moto_serial", "127.0.0.1", str(self.port)],
                cwd=Path(__file__).resolve().parent.parent.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        _wait_port(self.port, self.proc, self.log, "moto_server")
        self.client().create_bucket(Bucket=BUCKET)

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()
        self.client().create_bucket(Bucket=BUCKET)


class RcloneS3(S3Server):
    """``rclone serve s3`` over a real folder; ignores IfNoneMatch."""

    name = "rclone"

    def __init__(self, base: Path) -> None:
        super().__init__(base)
        exe = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
        self.root = base / "data"
        (self.root / BUCKET).mkdir(parents=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    exe,
                    "serve",
                    "s3",
                    "--config",
                    "/dev/null",
                    "--auth-key",
                    f"{ACCESS_KEY},{SECRET_KEY}",
                    "--addr",
                    f"127.0.0.1:{self.port}",
                    str(self.root),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        _wait_port(self.port, self.proc, self.log, "rclone serve s3")
