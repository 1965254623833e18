"""The syncs of one small local commit: how many, on what, in which order.

Every ``os.fsync`` / ``os.fdatasync`` the commit makes is counted by wrapping the real call
(the sync still happens) and naming what it synced (``/proc/self/fd``). The order is the crash
argument of ``Committer.commit``: the pending record whole and named before the data is renamed
into place, the data's rename durable before the record is published, and the record published
by renaming the pending record onto it (no second copy written and synced), then its folder
synced. What the commit left is read through the backdoor.
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
        elif rel.startswith(f"{RECORDS}/.commitstore.tmp.") and ".commitstore.new." in rel:
            out.append("pending record")
        elif rel.startswith(f"{RECORDS}/.commitstore.tmp."):
            out.append("record")
        elif rel.startswith(".commitstore.tmp."):
            out.append("data")
        else:
            out.append(rel)
    return out


EXPECTED = ["pending record", "records folder", "data", "data folder", "records folder"]


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
    assert _kinds(syncs, root) == EXPECTED
    _check_committed(root, "small", DATA)


def test_small_replace_makes_five_syncs_too(tmp_path: Path, syncs: list[str]) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    store.put_bytes("small", b"old version")
    syncs.clear()
    rec = store.put_bytes("small", DATA, overwrite=True)
    assert rec.outcome is not None and rec.outcome.durable
    assert _kinds(syncs, root) == EXPECTED
    _check_committed(root, "small", DATA)
