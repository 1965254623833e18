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

import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from commitstore import open_store
from commitstore.testing import LocalBackdoor

from .faultshim.check import chain_of, check_case
from .faultshim.ops import OPS
from .faultshim.runner import FAULTS, MatrixSummary, Worker, build_shim

MATRIX: dict[str, int] = {}
"""Cases run, by (operation, fault)."""


@pytest.fixture(scope="module")
def worker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Worker]:
    MatrixSummary.of(request.config).sizes["syscall fault matrix (local)"] = MATRIX
    w = Worker(build_shim(tmp_path_factory.mktemp("shim")))
    try:
        yield w
    finally:
        w.stop()


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
    in order: the lock, the pending record (an earlier one unlinked, then created in place),
    the data rename, the record rename (the pending record renamed onto the record: nothing is
    left to remove). Without this the matrix could be failing calls that do not matter."""
    seq = [c.split(" ", 1) for c in calls["put_overwrite"]]
    fns = [fn for fn, _ in seq]
    assert "flock" in fns
    assert "fsync" in fns
    assert "write" in fns

    def index(fn: str, where: str) -> int:
        return next(i for i, (f, p) in enumerate(seq) if f == fn and where in p)

    unlinked = index("unlinkat", ".commitstore.new.w.bin.json")
    pending = next(
        i
        for i in range(unlinked + 1, len(seq))
        if seq[i][0].startswith("open") and seq[i][1] == ".commitstore.new.w.bin.json"
    )
    data = index("renameat", "w.bin")
    while seq[data][1] != "w.bin":
        data = next(i for i in range(data + 1, len(seq)) if seq[i][0].startswith("renameat"))
    record = next(i for i, (f, p) in enumerate(seq) if f.startswith("rename") and ".rec." in p)
    assert fns.index("flock") < unlinked < pending < data < record
    assert not [p for f, p in seq if f.startswith("rename") and ".commitstore.new." in p]
    assert [i for i, (f, p) in enumerate(seq) if f.startswith("unlink") and ".new." in p] == [
        unlinked
    ]


FULL = ("put_new", "put_overwrite", "put_overwrite_bridge", "delete_file")
"""Operations whose every call is in the default run; of the others, the default run takes the
calls that change the store or make it durable (:data:`CHANGING`), ``soak`` the rest."""
CHANGING = (
    "write",
    "pwrite",
    "fsync",
    "fdatasync",
    "flock",
    "ftruncate",
    "fallocate",
    "posix_fallocate",
    "rename",
    "link",
    "unlink",
    "mkdir",
    "rmdir",
)


def picked(op: str, seq: list[str], part: str) -> list[int]:
    """The 1-based call indices of ``op`` in ``part`` ("core": the default run; "rest": soak)."""
    core = [k for k, c in enumerate(seq, 1) if op in FULL or c.split(" ")[0].startswith(CHANGING)]
    if part == "core":
        return core
    return [k for k in range(1, len(seq) + 1) if k not in set(core)]


CASES = [
    pytest.param(
        op, err, part, id=f"{op}-{err}-{part}", marks=[pytest.mark.soak] * (part == "rest")
    )
    for op in OPS
    for err in FAULTS
    for part in ("core", *(() if op in FULL else ("rest",)))
]


@pytest.mark.parametrize(("op", "err", "part"), CASES)
def test_fault_matrix(
    worker: Worker, calls: dict[str, list[str]], tmp_path: Path, *, op: str, err: str, part: str
) -> None:
    """Each call of ``op`` in turn fails with ``err`` (or the process dies there): old or new."""
    failures = []
    ks = picked(op, calls[op], part)
    for k in ks:
        call = calls[op][k - 1]
        where = tmp_path / f"k{k}"
        reply = worker.run(op, where, k, FAULTS[err])
        reply["call"] = call
        root = where / "store"
        problems = check_case(
            LocalBackdoor(root),
            partial(open_store, root, strategy=OPS[op].strategy),
            OPS[op],
            reply,
            err,
            binary=err != "SIGKILL",
        )
        if problems:
            failures.append(f"[{op} call {k} {call!r} {err}] {chain_of(reply)}: {problems}")
        shutil.rmtree(where)
    MATRIX[f"{op} {err} {part}"] = len(ks)
    assert not failures, "\n".join(failures)


def test_matrix_size(calls: dict[str, list[str]]) -> None:
    """Several hundred cases in the default run, over a thousand with soak: every operation
    under every fault."""
    core = {op: len(picked(op, seq, "core")) for op, seq in calls.items()}
    assert all(n >= 8 for n in core.values()), core
    assert sum(core.values()) * len(FAULTS) >= 600, core
    assert sum(len(seq) for seq in calls.values()) * len(FAULTS) >= 2000


def test_the_direct_put_goes_through_the_direct_writer(calls: dict[str, list[str]]) -> None:
    """``put_overwrite_direct`` writes its 8 KiB buffered head, four 8 KiB direct buffers (from
    the worker thread) and its tail: six data writes where ``put_overwrite`` makes one (both
    then write the same two records). So its cases fail the direct writes themselves."""

    def writes(op: str) -> int:
        return sum(c.split(" ")[0] in ("write", "pwrite64") for c in calls[op])

    assert writes("put_overwrite_direct") - writes("put_overwrite") == 5, calls
