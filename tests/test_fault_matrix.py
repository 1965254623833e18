"""The syscall fault matrix of local commits: every libc call a commit, delete, prune or gc makes
on the store's files fails in turn with EIO, ENOSPC and EACCES, and the process is SIGKILLed at
each one.

An LD_PRELOAD shim of the project's own (``tests/faultshim/faultshim.c``, compiled here with
``cc``) counts the calls made on paths and descriptors below the store's root, and fails the k-th.
A warm worker (the shim preloaded, commitstore imported) forks a child per case; the child sets
the store up, arms the shim, runs the operation and reports what escaped. This process, with no
shim, then checks from the raw files (``tests/faultshim/check.py``): the error is typed (ENOSPC:
``InsufficientSpaceError``), every name is its old or its new version (a new name absent or whole
new; a deleted one no longer claimed), never neither, before and after a fresh store's gc; gc
leaves no staging or pending record; ``verify()`` reports no damage.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import commitstore

from .faultshim.check import check_case
from .faultshim.ops import OPS

ROOT_DIR = Path(__file__).resolve().parent.parent
SHIM_SRC = Path(__file__).resolve().parent / "faultshim" / "faultshim.c"
FAULTS = {"EIO": 5, "ENOSPC": 28, "EACCES": 13, "SIGKILL": -9}
MATRIX: dict[tuple[str, str], int] = {}
"""Cases run, by (operation, fault)."""


def build_shim(out: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: dev.sh installs gcc (SYSTEM_PACKAGES)")
    so = out / "faultshim.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(SHIM_SRC), "-ldl"],
        check=True,
        capture_output=True,
    )
    return so


class Worker:
    """The warm worker process (``tests/faultshim/worker.py``), one JSON line each way."""

    def __init__(self, shim: Path) -> None:
        src = str(Path(commitstore.__file__).resolve().parent.parent)
        env = {
            **os.environ,
            "LD_PRELOAD": str(shim),
            "PYTHONPATH": os.pathsep.join([str(ROOT_DIR), src]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faultshim.worker", str(shim)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT_DIR,
            env=env,
            text=True,
        )

    def run(self, op: str, where: Path, k: int, err: int) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        where.mkdir(parents=True)
        req = {"op": op, "dir": str(where), "k": k, "err": err}
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


@pytest.fixture(scope="module")
def worker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Worker]:
    w = Worker(build_shim(tmp_path_factory.mktemp("shim")))
    try:
        yield w
    finally:
        w.stop()
        if MATRIX:
            reporter = request.config.pluginmanager.get_plugin("terminalreporter")
            line = (
                f"syscall fault matrix: {sum(MATRIX.values())} cases "
                f"({len(OPS)} operations x {len(FAULTS)} faults x every call)"
            )
            if reporter is not None:
                reporter.write_line("")
                reporter.write_line(line)


@pytest.fixture(scope="module")
def calls(worker: Worker, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The calls each operation makes on the store's files, in order (a count run each)."""
    base = tmp_path_factory.mktemp("count")
    out = {}
    for name in OPS:
        reply = worker.run(name, base / name, 0, 0)
        assert reply.get("outcome") == "ok", reply
        out[name] = reply["calls"]
        assert len(out[name]) == reply["count"] > 0
    return out


def test_the_shim_sees_every_step_of_a_commit(calls: dict[str, list[str]]) -> None:
    """The count run of an overwrite holds the steps of the commit protocol (docs/guarantees.md),
    in order: the lock, the pending record, the data rename, the record rename, the pending
    record's removal. Without this the matrix could be failing calls that do not matter."""
    seq = [c.split(" ", 1) for c in calls["put_overwrite"]]
    fns = [fn for fn, _ in seq]
    assert "flock" in fns
    assert "fsync" in fns
    assert "write" in fns

    def index(fn: str, where: str) -> int:
        return next(i for i, (f, p) in enumerate(seq) if f == fn and where in p)

    pending = index("renameat", ".commitstore.new.w.bin.json")
    data = index("renameat", "w.bin")
    while seq[data][1] != "w.bin":
        data = next(i for i in range(data + 1, len(seq)) if seq[i][0].startswith("renameat"))
    record = next(i for i, (f, p) in enumerate(seq) if f.startswith("rename") and ".rec." in p)
    drop = index("unlinkat", ".commitstore.new.w.bin.json")
    assert fns.index("flock") < pending < data < record < drop


@pytest.mark.parametrize("err", list(FAULTS))
@pytest.mark.parametrize("op", list(OPS))
def test_fault_matrix(
    worker: Worker, calls: dict[str, list[str]], tmp_path: Path, op: str, err: str
) -> None:
    """Each call of ``op`` in turn fails with ``err`` (or the process dies there): old or new."""
    failures = []
    for k, call in enumerate(calls[op], start=1):
        where = tmp_path / f"k{k}"
        reply = worker.run(op, where, k, FAULTS[err])
        problems = check_case(where / "store", OPS[op], reply, err)
        if problems:
            outcome = reply.get("chain", reply.get("outcome"))
            failures.append(f"[{op} call {k} {call!r} {err}] outcome {outcome}: {problems}")
        shutil.rmtree(where)
    MATRIX[(op, err)] = len(calls[op])
    assert not failures, "\n".join(failures)


def test_matrix_size(calls: dict[str, list[str]]) -> None:
    """Several hundred cases: every call of every operation, under every fault."""
    sizes = {op: len(seq) for op, seq in calls.items()}
    assert all(n >= 10 for n in sizes.values()), sizes
    assert sum(sizes.values()) * len(FAULTS) >= 400, sizes
