"""Azurite (Azure Blob emulator) on 127.0.0.1 for the tests, stopped by PID.

Installed by ``./dev.sh test`` with npm into ``.cache/azurite`` (or found on PATH).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from commitstore.testing import AzureBackdoor

from .samba import free_port

ACCOUNT = "devstoreaccount1"
# Azurite's published well-known development key (not a secret).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "commitstore-test"
ROOT = Path(__file__).resolve().parent.parent.parent


def azurite_binary() -> str:
    local = ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    found = shutil.which("azurite-blob")
    if found is None:
        raise RuntimeError("azurite-blob not found: ./dev.sh test installs it with npm")
    return found


class Azurite:
    """``azurite-blob`` with a fresh data folder and one container."""

    def __init__(self, base: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        self.log = base / "azurite.log"
        data = base / "data"
        data.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    azurite_binary(),
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    str(self.port),
                    "--location",
                    str(data),
                    "--silent",
                    "--disableTelemetry",
                    "--skipApiVersionCheck",
                    "--loose",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"azurite did not start: {self.log.read_text()}") from None
                time.sleep(0.05)
        self.service().create_container(CONTAINER)

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.endpoint};"
        )

    def service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    def url(self, prefix: str) -> str:
        return f"az://{CONTAINER}/{prefix}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def azure_backdoor(server: Azurite, prefix: str) -> AzureBackdoor:
    """The package's Azure backdoor on ``prefix`` of the test container."""
    return AzureBackdoor(server.service().get_container_client(CONTAINER), prefix)
