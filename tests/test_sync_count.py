"""The syncs of one small local commit: how many, on what, in which order.

Every ``os.fsync`` / ``os.fdatasync`` the commit makes is counted by wrapping the real call
(the sync still happens) and naming what it synced (``/proc/self/fd``). The order is the crash
argument of ``Committer.commit``: the pending record whole and named (written in place, its
file and its folder synced at once) before the data is renamed into place, the data's rename
durable before the record is published, and the record published by renaming the pending
record onto it (no second copy written and synced), then its folder synced. The syncs of a
worker thread (the data's early fsync, the pending record's file) count too. What the commit
left is read through the backdoor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash

from commitstore import open_store
from commitstore.testing import LocalBackdoor

DATA = b"s" * 1024
RECORDS = ".commitstore/records"


def _synced_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each sync made durable, in order (the real syncs run)."""
    seen: list[str] = []

    def counting(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            seen.append(_synced_path(fd))
            real(fd)

        return sync

    monkeypatch.setattr(os, "fsync", counting(os.fsync))
    monkeypatch.setattr(os, "fdatasync", counting(os.fdatasync))
    return seen


def _kinds(paths: list[str], root: Path) -> list[str]:
    """Each synced path as what it is: the records folder, the root folder, a staging file of
    the pending record, of the record, or of the data."""
    out = []
    for p in paths:
        rel = os.path.relpath(p, root)
        if rel == RECORDS:
            out.append("records folder")
        elif rel == ".":
            out.append("data folder")
        elif rel.startswith(f"{RECORDS}/.commitstore.new."):
            out.append("pending record")  # written in place (``LocalBackend.put_pending``)
        elif rel.startswith(f"{RECORDS}/.commitstore.tmp.") and ".commitstore.new." in rel:
            out.append("staged pending record")
        elif rel.startswith(f"{RECORDS}/.commitstore.tmp."):
            out.append("record")
        elif rel.startswith(".commitstore.tmp."):
            out.append("data")
        else:
            out.append(rel)
    return out


EXPECTED = ["data", "data folder", "pending record", "records folder", "records folder"]
"""The five syncs (sorted): the record's own file is never synced (it is the pending record)."""


def _check_order(kinds: list[str]) -> None:
    """The orderings of the crash argument. The data's fsync and the pending record's file
    fsync run in workers, beside the records folder's first fsync (the pending record's name),
    so those three come in any order; all three are done before the data's rename is issued
    (its folder's sync follows them), and the record's rename (the records folder's second
    sync) follows the data folder's sync. The pending record is written in place, never
    staged and renamed (no sync of a staging file of it)."""
    assert sorted(kinds) == EXPECTED, kinds
    first, second = (i for i, k in enumerate(kinds) if k == "records folder")
    data_folder = kinds.index("data folder")
    assert max(kinds.index("pending record"), first, kinds.index("data")) < data_folder, kinds
    assert data_folder < second == len(kinds) - 1, kinds


def _check_committed(root: Path, name: str, data: bytes) -> None:
    door = LocalBackdoor(root)
    assert door.read(name) == data
    raw = door.read(f"{RECORDS}/.commitstore.rec.{name}.json")
    assert raw is not None
    record = json.loads(raw)
    assert record["size"] == len(data)
    assert record["digest"] == f"xxh3_128:{xxhash.xxh3_128_hexdigest(data)}"
    assert door.read(f"{RECORDS}/.commitstore.new.{name}.json") is None  # no pending left
    assert not [f for f in door.files() if ".commitstore.tmp." in f]


def test_small_commit_makes_five_syncs_in_crash_order(tmp_path: Path, syncs: list[str]) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    store.put_bytes("warm", DATA)  # folders and the lock file exist from here
    syncs.clear()
    rec = store.put_bytes("small", DATA)
    assert rec.outcome is not None and rec.outcome.durable
    _check_order(_kinds(syncs, root))
    _check_committed(root, "small", DATA)


def test_small_replace_makes_five_syncs_too(tmp_path: Path, syncs: list[str]) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    store.put_bytes("small", b"old version")
    syncs.clear()
    rec = store.put_bytes("small", DATA, overwrite=True)
    assert rec.outcome is not None and rec.outcome.durable
    _check_order(_kinds(syncs, root))
    _check_committed(root, "small", DATA)
