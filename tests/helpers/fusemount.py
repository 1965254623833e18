"""Mount commitstore's fault-injecting FUSE filesystem for a test, and unmount it by PID."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


class FaultMount:
    """A running ``commitstore.testing.faultfs`` over ``backing``, mounted at ``mnt``."""

    def __init__(self, base: Path, *, attr_timeout: float = 1.0) -> None:
        self.backing = base / "backing"
        self.mnt = base / "mnt"
        self.control = base / "control.json"
        self.backing.mkdir(parents=True)
        self.mnt.mkdir()
        self.control.write_text("{}")
        self._err = open(base / "faultfs.stderr", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "commitstore.testing.faultfs",
                str(self.backing),
                str(self.mnt),
                str(self.control),
                str(attr_timeout),
            ],
            stdout=self._err,
            stderr=self._err,
        )
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"faultfs did not mount: {(base / 'faultfs.stderr').read_text()}"
                )
            time.sleep(0.02)

    def set(self, **faults: dict[str, Any]) -> None:
        """Replace the active faults (counters reset)."""
        self.control.write_text(json.dumps(faults))
        # Make sure the change is visible even within the same mtime tick.
        os.utime(self.control, (time.time(), time.time() + 0.001))

    def clear(self) -> None:
        self.set()

    def events(self) -> list[dict[str, Any]]:
        log = Path(str(self.control) + ".log")
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line]

    def stop(self) -> None:
        subprocess.run(["fusermount", "-u", str(self.mnt)], check=False, capture_output=True)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], check=False)
        self._err.close()
