"""Building the shim and driving the warm worker (``worker.py``) from the test process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import commitstore

ROOT_DIR = Path(__file__).resolve().parent.parent.parent
SHIM_SRC = Path(__file__).resolve().parent / "faultshim.c"
FAULTS = {"EIO": 5, "ENOSPC": 28, "EACCES": 13, "SIGKILL": -9}
"""The faults of every matrix, as the worker takes them (-9: SIGKILL)."""


def build_shim(out: Path) -> Path:
    """Compile ``faultshim.c`` into ``out`` (gcc comes with dev.sh's system packages)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: dev.sh installs gcc (SYSTEM_PACKAGES)")
    so = out / "faultshim.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(SHIM_SRC), "-ldl", "-pthread"],
        check=True,
        capture_output=True,
    )
    return so


class Worker:
    """The warm worker process, one JSON line each way. ``shim``: preload it (the syscall
    matrix); None: no shim (faults come from faultfs)."""

    def __init__(self, shim: Path | None) -> None:
        src = str(Path(commitstore.__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT_DIR), src])}
        if shim is not None:
            env["LD_PRELOAD"] = str(shim)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faultshim.worker", *([str(shim)] if shim else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT_DIR,
            env=env,
            text=True,
        )

    def run(self, op: str, where: Path, k: int, err: int, **extra: str) -> dict[str, Any]:
        """One case: ``op`` set up under ``where`` (created here), its k-th call failed with
        ``err`` (k == 0: counted). The worker's reply."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        where.mkdir(parents=True)
        req = {"op": op, "dir": str(where), "k": k, "err": err, **extra}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the matrix worker died"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class MatrixSummary:
    """A pytest plugin, registered by the matrix modules, that prints each matrix's size at the
    end of the session's terminal summary: ``sizes[title] = {case group: cases run}``."""

    NAME = "commitstore-fault-matrix-summary"

    def __init__(self) -> None:
        self.sizes: dict[str, dict[str, int]] = {}

    @classmethod
    def of(cls, config: pytest.Config) -> MatrixSummary:
        found = config.pluginmanager.get_plugin(cls.NAME)
        if isinstance(found, MatrixSummary):
            return found
        summary = cls()
        config.pluginmanager.register(summary, cls.NAME)
        return summary

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for title, groups in self.sizes.items():
            if groups:
                terminalreporter.write_line(
                    f"{title}: {sum(groups.values())} cases run in {len(groups)} groups"
                )
