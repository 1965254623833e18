"""How ``sync`` drives a mirror: one listing of its records, bounded concurrent publishes.

Counts come from wrapping the mirror store's own methods; the copies are checked through the
backdoor (the mirror's folder), not through the API under test.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from commitstore import CommitStore, open_store
from commitstore.mirrors.sync import TRANSFERS
from commitstore.testing import LocalBackdoor, record_path, xxh

NAMES = [f"step_{i:04d}.pt" for i in range(8)]


def _primary(tmp_path: Path) -> dict[str, bytes]:
    store = open_store(tmp_path / "primary")
    data = {name: name.encode() * (1000 + i) for i, name in enumerate(NAMES)}
    for name, body in data.items():
        store.put_bytes(name, body)
    return data


def _count_record_reads(mirror: CommitStore) -> list[str]:
    reads: list[str] = []
    backend: Any = mirror.backend
    original = backend.open_read

    def counted(parts: tuple[str, ...]) -> Any:
        if parts[:2] == (".commitstore", "records"):
            reads.append("/".join(parts))
        return original(parts)

    backend.open_read = counted
    return reads


def test_sync_looks_up_only_the_records_a_mirror_has(tmp_path: Path) -> None:
    data = _primary(tmp_path)
    door = LocalBackdoor(tmp_path / "mirror")
    store = open_store(tmp_path / "primary", mirrors=[str(tmp_path / "mirror")])
    reads = _count_record_reads(store.mirrors[0])
    report = store.sync()
    assert sorted(report.mirrors[0].copied) == NAMES
    # An empty mirror: one listing and no per-artifact lookup; only sync's closing scan (which
    # reports foreign artifacts) reads each new record, once.
    assert sorted(Counter(reads).values()) == [1] * len(NAMES)
    for name, body in data.items():
        assert door.read(name) == body
        assert door.read(record_path(name)) is not None
    # A second sync finds every copy: each mirror record is compared once, then scanned once.
    reads.clear()
    again = store.sync()
    assert sorted(again.mirrors[0].ok) == NAMES
    assert sorted(Counter(reads).values()) == [2] * len(NAMES)


def test_sync_publishes_at_most_transfers_at_once_and_stages_meanwhile(tmp_path: Path) -> None:
    data = _primary(tmp_path)
    store = open_store(tmp_path / "primary", mirrors=[str(tmp_path / "mirror")])
    mirror = store.mirrors[0]
    lock = threading.Lock()
    publishing = [0]
    most = [0]
    staged_while_publishing = [0]
    full = threading.Event()
    commit, open_sink = mirror.committer.commit, mirror.backend.open_sink

    def slow_commit(*args: Any, **kwargs: Any) -> Any:
        with lock:
            publishing[0] += 1
            most[0] = max(most[0], publishing[0])
            if publishing[0] >= TRANSFERS:
                full.set()
        try:
            full.wait(10)  # the first publishers hold their slots until all slots are taken
            time.sleep(0.05)  # a slow mirror: publishing dominates
            return commit(*args, **kwargs)
        finally:
            with lock:
                publishing[0] -= 1

    def watched_sink(parts: tuple[str, ...], **kwargs: Any) -> Any:
        with lock:
            if publishing[0] and parts[0] != ".commitstore":
                staged_while_publishing[0] += 1
        return open_sink(parts, **kwargs)

    mirror.committer.commit = slow_commit  # type: ignore[method-assign]
    mirror.backend.open_sink = watched_sink  # type: ignore[method-assign]
    report = store.sync()
    assert sorted(report.mirrors[0].copied) == NAMES
    assert most[0] == TRANSFERS  # bounded by the publish slots, and reached
    assert staged_while_publishing[0] > 0  # the extra worker read and staged meanwhile
    door = LocalBackdoor(tmp_path / "mirror")
    for name, body in data.items():
        assert xxh(door.read(name) or b"") == xxh(body)
