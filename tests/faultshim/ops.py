"""The operations of the syscall fault matrix: how each one's store is set up, the one call that
is made under fault injection, and which versions each name may verify as afterwards.

Shared by the worker (which sets up and runs) and the test (which checks, with no shim loaded).
A version is a file's bytes, or a folder's ``{relative path: bytes}``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from commitstore import CommitStore, Record, open_store

Version = bytes | dict[str, bytes]

OLD = b"old version " * 400
NEW = b"the new version " * 300
OLD_DIR: dict[str, bytes] = {
    "model.bin": b"old weights " * 300,
    "sub/optim.bin": b"old optimizer " * 100,
    "config.json": b'{"old": true}',
}
NEW_DIR: dict[str, bytes] = {
    "model.bin": b"new weights " * 350,
    "sub/optim.bin": b"new optimizer " * 90,
    "extra.txt": b"only in the new one",
}
LONG_AGO = 1_000_000_000.0
"""An mtime far in the past (2001), so prune's and gc's age limits pass."""

GONE = "gone"
"""Allowed state: no record claims the name (its data may be left, unclaimed, or removed)."""


def fill(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def age_everything(root: Path) -> None:
    """Set every mtime below the root far into the past (data, records, staging)."""
    for dirpath, dirs, files in os.walk(root):
        for n in (*dirs, *files):
            os.utime(os.path.join(dirpath, n), (LONG_AGO, LONG_AGO))


@dataclass(frozen=True)
class Op:
    """One operation of the matrix.

    ``setup(store, root)`` commits the starting state (``root``: the store's local folder, for
    the operations that also touch raw files);
    ``run(store, pause)`` is the operation (``pause(True/False)`` stops counting calls around
    what a caller, not commitstore, does); it returns a JSON summary on success.
    ``versions``: every name the check covers, with its possible versions by label;
    ``allowed``: the labels (or :data:`GONE`) each name may verify as after any fault;
    ``on_success``: the labels after the operation succeeded (None: the summary decides).
    """

    name: str
    setup: Callable[[CommitStore, Path], None]
    run: Callable[[CommitStore, Callable[[bool], None]], dict[str, Any]]
    versions: dict[str, dict[str, Version]]
    allowed: dict[str, set[str]]
    on_success: dict[str, set[str]] | None = None
    new_name: set[str] = field(default_factory=set)
    on_raise: dict[str, set[str]] | None = None
    """A write call: the labels each name may verify as when the call raised (an exception
    means nothing changed: the old version, or none for a new name)."""
    strategy: str = "auto"
    """``open_store(strategy=)``: "bridge" runs the mounted-network recipe on a local folder
    (fresh stat, read-back, size check after the rename, rename retries)."""


def _commit(*files: tuple[str, Version]) -> Callable[[CommitStore, Path], None]:
    return lambda store, root: _store(store, *files)


def _store(store: CommitStore, *files: tuple[str, Version]) -> None:
    for name, version in files:
        if isinstance(version, bytes):
            store.put_bytes(name, version)
        else:
            with store.stage_dir(name) as d:
                fill(d, version)


Run = Callable[[CommitStore, Callable[[bool], None]], dict[str, Any]]


class Warnings(logging.Handler):
    """The warnings commitstore logs while an operation runs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> Warnings:
        logging.getLogger("commitstore").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("commitstore").removeHandler(self)


def outcome(record: Record, warned: Warnings) -> dict[str, Any]:
    """What a write call returned about its commit (``Record.outcome``), and the warnings."""
    got = getattr(record, "outcome", None)  # (absent before commits reported their outcome)
    return {
        "durable": True if got is None else got.durable,
        "notes": [] if got is None else list(got.notes),
        "warned": warned.messages,
    }


def _put(name: str, overwrite: bool) -> Run:
    def run(store: CommitStore, pause: Callable[[bool], None]) -> dict[str, Any]:
        with Warnings() as warned:
            record = store.put_bytes(name, NEW, overwrite=overwrite)
        return outcome(record, warned)

    return run


NEW_BIG = bytes(range(256)) * 160 + b"tail"
"""Written with direct I/O by :func:`_put_direct` (four aligned buffers and an unaligned tail)."""


def _put_direct(name: str) -> Run:
    """``put_bytes`` of :data:`NEW_BIG` through the ``O_DIRECT`` writer, its sizes scaled down
    (8 KiB buffered, then 8 KiB aligned buffers written by the worker thread)."""

    def run(store: CommitStore, pause: Callable[[bool], None]) -> dict[str, Any]:
        from commitstore.backends.rename.posix import _direct
        from commitstore.backends.rename.posix import backend as posix

        posix.DIRECT_AFTER = _direct.BUFFER = 8192
        # one write in flight: the k-th call is the same one in every run of a case (failures
        # with several in flight: tests/test_local_direct_ring.py)
        _direct.DEPTH = 1
        store.put_bytes(name, NEW_BIG, overwrite=True)
        return {}

    return run


def _delete(name: str) -> Run:
    def run(store: CommitStore, pause: Callable[[bool], None]) -> dict[str, Any]:
        store.delete(name)
        return {}

    return run


def _gc(store: CommitStore, pause: Callable[[bool], None]) -> dict[str, Any]:
    return {"removed": len(store.gc(min_age=60).removed)}


def _stage_dir(name: str, files: dict[str, bytes], overwrite: bool) -> Run:
    def run(store: CommitStore, pause: Callable[[bool], None]) -> dict[str, Any]:
        got: list[Record] = []
        with Warnings() as warned, store._stage_dir(name, got, overwrite=overwrite) as d:
            pause(True)
            fill(d, files)
            pause(False)
        return outcome(got[0], warned)

    return run


def _gc_setup(store: CommitStore, root: Path) -> None:
    """``a.bin`` whole; ``w.bin``: its new data published, the record not yet (a pending record
    that the data matches: gc makes it the record); ``v.bin``: a pending record written, the
    data not yet published (gc drops it); a stale staging file and staging folder."""
    _store(store, ("a.bin", OLD), ("w.bin", OLD), ("v.bin", OLD))
    scratch = root.parent / "scratch"
    other = open_store(scratch)
    other.put_bytes("w.bin", NEW)
    other.put_bytes("v.bin", NEW)
    records = root / ".commitstore" / "records"
    for name in ("w.bin", "v.bin"):
        shutil.copyfile(
            scratch / ".commitstore/records" / f".commitstore.rec.{name}.json",
            records / f".commitstore.new.{name}.json",
        )
    (root / "w.bin").write_bytes(NEW)
    (root / ".commitstore.tmp.0123456789abcdef.step_9.pt").write_bytes(b"half a checkpoint")
    fill(root / ".commitstore.tmp.fedcba9876543210.ckpt-9", {"a.bin": b"x", "s/b.bin": b"y"})
    age_everything(root)
    shutil.rmtree(scratch)


def _prune_setup(store: CommitStore, root: Path) -> None:
    _store(
        store,
        ("step_1.pt", OLD + b"1"),
        ("ckpt-2", OLD_DIR),
        ("step_3.pt", OLD + b"3"),
    )
    age_everything(root)


def _prune(store: CommitStore, pause: Callable[[bool], None]) -> dict[str, Any]:
    report = store.prune(keep_last=1, min_age=0)
    return {"deleted": sorted(report.deleted)}


OLD_NEW: dict[str, Version] = {"old": OLD, "new": NEW}
OLD_NEW_DIR: dict[str, Version] = {"old": OLD_DIR, "new": NEW_DIR}

OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op(
            "put_new",
            _commit(("a.bin", OLD)),
            _put("n/new.bin", False),
            {"a.bin": {"old": OLD}, "n/new.bin": {"new": NEW}},
            {"a.bin": {"old"}, "n/new.bin": {"new", GONE}},
            {"a.bin": {"old"}, "n/new.bin": {"new"}},
            new_name={"n/new.bin"},
        ),
        Op(
            "put_overwrite",
            _commit(("w.bin", OLD)),
            _put("w.bin", True),
            {"w.bin": OLD_NEW},
            {"w.bin": {"old", "new"}},
            {"w.bin": {"new"}},
        ),
        Op(
            "put_overwrite_direct",
            _commit(("w.bin", OLD)),
            _put_direct("w.bin"),
            {"w.bin": {"old": OLD, "new": NEW_BIG}},
            {"w.bin": {"old", "new"}},
            {"w.bin": {"new"}},
        ),
        Op(
            "put_overwrite_bridge",
            _commit(("w.bin", OLD)),
            _put("w.bin", True),
            {"w.bin": OLD_NEW},
            {"w.bin": {"old", "new"}},
            {"w.bin": {"new"}},
            strategy="bridge",
        ),
        Op(
            "dir_new",
            _commit(("a.bin", OLD)),
            _stage_dir("ck/new", NEW_DIR, False),
            {"a.bin": {"old": OLD}, "ck/new": {"new": NEW_DIR}},
            {"a.bin": {"old"}, "ck/new": {"new", GONE}},
            {"a.bin": {"old"}, "ck/new": {"new"}},
            new_name={"ck/new"},
        ),
        Op(
            "dir_overwrite",
            _commit(("ck/w", OLD_DIR)),
            _stage_dir("ck/w", NEW_DIR, True),
            {"ck/w": OLD_NEW_DIR},
            {"ck/w": {"old", "new"}},
            {"ck/w": {"new"}},
        ),
        Op(
            "delete_file",
            _commit(("a.bin", OLD), ("d.bin", OLD)),
            _delete("d.bin"),
            {"a.bin": {"old": OLD}, "d.bin": {"old": OLD}},
            {"a.bin": {"old"}, "d.bin": {"old", GONE}},
            {"a.bin": {"old"}, "d.bin": {GONE}},
        ),
        Op(
            "delete_dir",
            _commit(("ck/d", OLD_DIR)),
            _delete("ck/d"),
            {"ck/d": {"old": OLD_DIR}},
            {"ck/d": {"old", GONE}},
            {"ck/d": {GONE}},
        ),
        Op(
            "prune",
            _prune_setup,
            _prune,
            {
                "step_1.pt": {"old": OLD + b"1"},
                "ckpt-2": {"old": OLD_DIR},
                "step_3.pt": {"old": OLD + b"3"},
            },
            {"step_1.pt": {"old", GONE}, "ckpt-2": {"old", GONE}, "step_3.pt": {"old"}},
        ),
        Op(
            "gc",
            _gc_setup,
            _gc,
            {"a.bin": {"old": OLD}, "w.bin": OLD_NEW, "v.bin": OLD_NEW},
            {"a.bin": {"old"}, "w.bin": {"new"}, "v.bin": {"old"}},
            {"a.bin": {"old"}, "w.bin": {"new"}, "v.bin": {"old"}},
        ),
    )
}

WRITES: tuple[str, ...] = ("put_new", "put_overwrite", "put_overwrite_direct")
WRITES += ("put_overwrite_bridge", "dir_new", "dir_overwrite")
"""The write calls, whose outcome is binary: raised, every name holds what it held before."""
for _name in WRITES:
    _op = OPS[_name]
    OPS[_name] = replace(
        _op, on_raise={n: {GONE} if n in _op.new_name else {"old"} for n in _op.versions}
    )
