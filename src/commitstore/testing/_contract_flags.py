"""Backend contract, declared behaviours: the :class:`Capabilities` fields that steer how the core
drives a backend (where staged bytes live, how many reads may run at once, what a sink holds in
memory, whether writers need slots of their own), one case each, provoking what the field
promises and observing the storage through the backdoor."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator

import pytest

from commitstore.backends.base import PutMode, Rereadable
from commitstore.testing.subject import (
    BackendSubject,
    digest,
    put,
    staged,
    staging_leftovers,
    visible,
)

MiB = 1024 * 1024

LOCK_GUARD = 60.0
"""Seconds a second writer may wait for a publish lock that is declared to hold nothing,
before the case reports it blocked (a guard against a hang, not a duration bound)."""


class _FileSource:
    """A :class:`Rereadable` over a local file (``os.pread``), as a local reader's raw file."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def pread(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)


class FlagContract:
    """Mixed into :class:`BackendContract`; uses its ``subject`` fixture."""

    def test_capability_staging_names(self, subject: BackendSubject) -> None:
        """A file staged and not yet published (larger than the sink holds in memory, up to
        8 MiB) shows nothing but entries under staging names (``.commitstore.tmp.*``). Where
        ``staging_names`` is declared a write may leave such entries (gc, deletes and reads
        look for them); not declared, none ever appears, so nothing looks for one. Aborted,
        none stays."""
        backend = subject.backend
        size = min(backend.capabilities.whole_max + 1, 8 * MiB)
        sink = staged(backend, "stage/f.bin", os.urandom(size), PutMode.CREATE)
        try:
            seen = visible(subject.door)
            leftovers = staging_leftovers(subject.door)
        finally:
            sink.abort()
        assert sorted(seen) == sorted(leftovers), seen
        if not backend.capabilities.staging_names:
            assert leftovers == [], leftovers
        assert staging_leftovers(subject.door) == []

    def test_capability_writer_slots(self, subject: BackendSubject) -> None:
        """Where ``writer_slots`` is declared the publish lock holds nothing across processes
        (the core gives each writer a pending-record slot of its own instead): a second
        instance takes it while the first holds it. Not declared: the core relies on the lock
        (skipped: whether it excludes another process is the storage's)."""
        if not subject.backend.capabilities.writer_slots:
            pytest.skip("writer_slots not declared")
        other = subject.another()
        entered = threading.Event()

        def second() -> None:
            with other.publish_lock():
                entered.set()

        with subject.backend.publish_lock():
            thread = threading.Thread(target=second, daemon=True)
            thread.start()
            thread.join(LOCK_GUARD)
            assert entered.is_set(), "the second writer waited for a lock declared to hold nothing"

    def test_capability_plans_from_records(self, subject: BackendSubject) -> None:
        """Where ``plans_from_records`` is declared data only changes by a whole replace: while
        a replace is staged the name holds its old bytes whole and nothing else is listed, and
        once published exactly the new ones, whose modification time is known (a prune then
        dates an artifact by its record). Not declared: the core lists the data instead."""
        if not subject.backend.capabilities.plans_from_records:
            pytest.skip("plans_from_records not declared")
        backend = subject.backend
        put(backend, "plan/f.bin", b"old" * 1000, PutMode.CREATE)
        new = os.urandom(min(backend.capabilities.whole_max + 1, 8 * MiB))
        sink = staged(backend, "plan/f.bin", new, PutMode.REPLACE)
        try:
            assert subject.door.read("plan/f.bin") == b"old" * 1000
            assert visible(subject.door) == ["plan/f.bin"]
            sink.publish(size=len(new), digest=digest(new))
        except BaseException:
            sink.abort()
            raise
        assert subject.door.read("plan/f.bin") == new
        info = backend.stat(("plan", "f.bin"))
        assert info is not None and info.size == len(new)
        assert info.mtime is not None and info.mtime > 0, info

    def test_capability_read_concurrency(self, subject: BackendSubject) -> None:
        """``read_concurrency`` is at least 1, and that many threads reading small files at
        once through one :meth:`~Backend.small_reads` reader each get their own file's bytes
        (the core scans records that way)."""
        workers = subject.backend.capabilities.read_concurrency
        assert isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1
        bodies = {f"r{i:02d}.json": f"record {i} ".encode() * (i + 1) for i in range(2 * workers)}
        for name, body in bodies.items():
            put(subject.backend, f"small/{name}", body, PutMode.CREATE)
        with (
            subject.backend.small_reads(("small",)) as read,
            concurrent.futures.ThreadPoolExecutor(workers) as pool,
        ):
            got = dict(zip(bodies, pool.map(lambda n: read((n,))[0], bodies), strict=True))
        assert got == bodies
        assert {n: subject.door.read(f"small/{n}") for n in bodies} == bodies

    def test_capability_rereads_locally(self, subject: BackendSubject) -> None:
        """Where ``rereads_locally`` is declared a reader from :meth:`~Backend.open_read` has a
        :class:`Rereadable` raw file that gives the stored bytes again by position, as often as
        asked (a mirror copy then sends from it instead of holding the bytes). Not declared:
        the core holds what the destination's sink needs."""
        data = os.urandom(256 * 1024)
        put(subject.backend, "again/f.bin", data, PutMode.CREATE)
        if not subject.backend.capabilities.rereads_locally:
            pytest.skip("rereads_locally not declared")
        with subject.backend.open_read(("again", "f.bin")) as f:
            raw = getattr(f, "raw", f)
            assert isinstance(raw, Rereadable), type(raw)
            stored = subject.door.read("again/f.bin")
            assert stored == data
            for offset, n in ((0, 100), (1000, 64 * 1024), (len(data) - 10, 100), (5, 7)):
                assert raw.pread(offset, n) == data[offset : offset + n]
                assert raw.pread(offset, n) == data[offset : offset + n]

    def test_capability_reread_bodies(self, subject: BackendSubject) -> None:
        """Where ``reread_bodies`` is declared a file sink takes a :class:`Rereadable` source
        offered before its first write (``reread_from`` answers True) and publishes exactly the
        bytes written, sent from that source; not declared, it refuses the offer (False), so
        the core never keeps a source open for it."""
        data = os.urandom(min(subject.backend.capabilities.whole_max + 1, 8 * MiB))
        with _source(data) as source:
            sink = subject.backend.open_sink(("bodies", "f.bin"), mode=PutMode.CREATE)
            try:
                taken = sink.reread_from(source, len(data))
                sink.write(memoryview(data))
                sink.prepare()
                sink.publish(size=len(data), digest=digest(data))
            except BaseException:
                sink.abort()
                raise
        assert taken is subject.backend.capabilities.reread_bodies
        assert subject.door.read("bodies/f.bin") == data

    def test_capability_whole_max(self, subject: BackendSubject) -> None:
        """``whole_max`` is a number of bytes (0 or more), and ``sink_memory`` follows from it.
        Where it is above 0, a file of up to that size (8 MiB at most here) is held by its sink
        until the publish: nothing of it reaches the storage before (no file, no unfinished
        upload), and the publish stores it whole."""
        caps = subject.backend.capabilities
        assert isinstance(caps.whole_max, int) and caps.whole_max >= 0
        assert subject.backend.sink_memory(10 * MiB, source_rereads=False) == min(
            10 * MiB, caps.whole_max
        )
        if caps.whole_max == 0:
            pytest.skip("whole_max is 0: the sink stages on the storage")
        data = os.urandom(min(caps.whole_max, 8 * MiB))
        sink = staged(subject.backend, "held/f.bin", data, PutMode.CREATE)
        try:
            assert visible(subject.door) == []
            assert subject.backend.pending_uploads() == []
            sink.publish(size=len(data), digest=digest(data))
        except BaseException:
            sink.abort()
            raise
        assert subject.door.read("held/f.bin") == data


@contextlib.contextmanager
def _source(data: bytes) -> Iterator[_FileSource]:
    """A :class:`Rereadable` over a temporary local file holding ``data``, closed and removed
    on exit."""
    fd, path = tempfile.mkstemp(prefix="contract-source-")
    try:
        os.write(fd, data)
        yield _FileSource(fd)
    finally:
        os.close(fd)
        os.unlink(path)
