"""How ``sync`` drives a mirror: one listing of its records, bounded concurrent publishes, and
bounded memory for copies to an object store.

Counts come from wrapping the mirror store's own methods; the copies are checked through the
backdoor (the mirror's folder), not through the API under test.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore.mirrors.sync import STAGING_MEMORY, TRANSFERS, sync_mirrors
from commitstore.testing import LocalBackdoor, record_path, xxh

from .helpers.s3servers import BUCKET, MotoServer

NAMES = [f"step_{i:04d}.pt" for i in range(8)]


def _primary(tmp_path: Path) -> dict[str, bytes]:
    store = open_store(tmp_path / "primary")
    data = {name: name.encode() * (1000 + i) for i, name in enumerate(NAMES)}
    for name, body in data.items():
        store.put_bytes(name, body)
    return data


def _count_record_reads(mirror: CommitStore) -> list[str]:
    """Record reads of ``mirror``: single reads (``open_read``) and a scan's (``small_reads``)."""
    reads: list[str] = []
    backend: Any = mirror._backend
    original = backend.open_read
    original_reads = backend.small_reads

    def counted(parts: tuple[str, ...]) -> Any:
        if parts[:2] == (".commitstore", "records"):
            reads.append("/".join(parts))
        return original(parts)

    @contextlib.contextmanager
    def counted_reads(folder: tuple[str, ...], **kwargs: Any) -> Iterator[Any]:
        with original_reads(folder, **kwargs) as read:

            def one(rel: tuple[str, ...]) -> Any:
                reads.append("/".join((*folder, *rel)))
                return read(rel)

            yield one

    backend.open_read = counted
    backend.small_reads = counted_reads
    return reads


def test_sync_looks_up_only_the_records_a_mirror_has(tmp_path: Path) -> None:
    data = _primary(tmp_path)
    door = LocalBackdoor(tmp_path / "mirror")
    store = open_store(tmp_path / "primary", mirrors=[str(tmp_path / "mirror")])
    reads = _count_record_reads(store.mirrors[0])
    report = store.sync()
    assert sorted(report.mirrors[0].copied) == NAMES
    # An empty mirror: one listing and no per-artifact lookup; only sync's closing scan (which
    # reports foreign artifacts) reads each new record, once. Each copy's commit also looks for
    # an earlier commit's pending record of its name (a miss), once.
    records = [r for r in reads if "/.commitstore.rec." in r]
    pending = [r for r in reads if "/.commitstore.new." in r]
    assert sorted(Counter(records).values()) == [1] * len(NAMES)
    assert sorted(Counter(pending).values()) == [1] * len(NAMES)
    assert len(records) + len(pending) == len(reads), reads
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
    commit, open_sink = mirror._committer.commit, mirror._backend.open_sink

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

    mirror._committer.commit = slow_commit  # type: ignore[method-assign]
    mirror._backend.open_sink = watched_sink  # type: ignore[method-assign]
    report = store.sync()
    assert sorted(report.mirrors[0].copied) == NAMES
    assert most[0] == TRANSFERS  # bounded by the publish slots, and reached
    assert staged_while_publishing[0] > 0  # the extra worker read and staged meanwhile
    door = LocalBackdoor(tmp_path / "mirror")
    for name, body in data.items():
        assert xxh(door.read(name) or b"") == xxh(body)


def _count_held(mirrors: list[CommitStore], *, roomy: bool) -> list[int]:
    """[bytes held now, most ever]: what the artifact sinks of all ``mirrors`` were given and
    had not published or dropped yet (an object store's sink holds exactly that in memory).
    Each sink, given its first bytes, waits for another to hold bytes too (``roomy``: until it
    does; else briefly, the time another copy would need to start if the budget let it)."""
    lock = threading.Lock()
    held = [0, 0]
    overlap = threading.Event()  # two sinks held bytes at once

    def wrap(backend: Any) -> None:
        open_sink = backend.open_sink

        def counted_sink(parts: tuple[str, ...], **kwargs: Any) -> Any:
            sink = open_sink(parts, **kwargs)
            if parts[0] == ".commitstore":
                return sink
            write, publish, abort = sink.write, sink.publish, sink.abort
            mine = [0]

            def counted_write(data: memoryview) -> None:
                with lock:
                    if held[0] and not mine[0]:
                        overlap.set()
                    mine[0] += data.nbytes
                    held[0] += data.nbytes
                    held[1] = max(held[1], held[0])
                write(data)
                if mine[0] == data.nbytes:  # its first bytes: give another copy time to start
                    overlap.wait(10 if roomy else 0.3)

            def done() -> None:
                with lock:
                    held[0] -= mine[0]
                    mine[0] = 0

            def publish_counted(**kw: Any) -> Any:
                try:
                    return publish(**kw)
                finally:
                    done()

            def abort_counted() -> None:
                abort()
                done()

            sink.write, sink.publish, sink.abort = counted_write, publish_counted, abort_counted
            return sink

        backend.open_sink = counted_sink

    for mirror in mirrors:
        wrap(mirror._backend)
    return held


@pytest.mark.parametrize("budget", ["one artifact", "default"])
def test_sync_holds_copies_to_object_stores_within_one_memory_budget(
    moto: MotoServer, budget: str
) -> None:
    """Copies to object stores whose sinks hold the bytes (the primary here cannot give them
    again: ``memory://``) reserve them against one budget for every mirror of the sync: with
    room for one artifact, never two are held at once, whatever the number of mirrors; with the
    default budget they are (so the count does see overlap when it happens)."""
    size = 256 * 1024
    store = open_store(f"memory://sync-budget-{budget[0]}-{time.monotonic_ns()}")
    data = {name: bytes([i]) * size for i, name in enumerate(NAMES[:4])}
    for name, body in data.items():
        store.put_bytes(name, body)
    prefixes = [f"budget-{budget[0]}-{m}-{time.monotonic_ns()}" for m in ("a", "b")]
    mirrors = [open_store(moto.url(p), **moto.options(), single_put_max=size) for p in prefixes]
    held = _count_held(mirrors, roomy=budget == "default")
    staging = size if budget == "one artifact" else STAGING_MEMORY
    report = sync_mirrors(
        store._committer, [m._committer for m in mirrors], repair=True, staging_memory=staging
    )
    for m in report.mirrors:
        assert sorted(m.copied) == sorted(data)
    if budget == "one artifact":
        assert held[1] == size  # one at a time, across both mirrors
    else:
        assert held[1] >= 2 * size
    client = moto.client()
    for prefix in prefixes:
        for name, body in data.items():
            got = client.get_object(Bucket=BUCKET, Key=f"{prefix}/{name}")["Body"].read()
            assert xxh(got) == xxh(body)
