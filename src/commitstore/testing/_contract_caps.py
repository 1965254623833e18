"""Backend contract, declared capabilities: one case per :class:`Capabilities` field, each
provoking what the field promises and observing the storage. The publishing fields
(``exclusive_create``, ``atomic_replace``, ``atomic_dir_publish``) are held in
``_contract_publish``, the behaviour fields (``staging_names``, ``read_concurrency``, ...) in
``_contract_flags``; the others here."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

from commitstore.backends.base import Capabilities, PutMode
from commitstore.testing.backdoor import LocalBackdoor
from commitstore.testing.subject import BackendSubject, files_under, put, put_folder

CLOCK_SLACK = 0.05
"""Seconds a file system's timestamp may trail ``time.time()`` on the same host: the kernel
stamps files from its coarse clock, which lags by up to a tick. Not a duration bound: it
widens the interval a modification time must fall in."""


class CapabilityContract:
    """Mixed into :class:`BackendContract`; uses its ``subject`` fixture."""

    def test_every_capability_has_a_case(self) -> None:
        """Each field of :class:`Capabilities` has its ``test_capability_<field>`` case here, so
        a new field cannot be declared without the contract holding backends to it."""
        missing = [
            f.name
            for f in dataclasses.fields(Capabilities)
            if not callable(getattr(self, f"test_capability_{f.name}", None))
        ]
        assert missing == [], f"no test_capability_<field> case for {missing}"

    def test_capability_dir_fsync(self, subject: BackendSubject) -> None:
        """Where ``dir_fsync`` is declared: a publish reports itself durable (``CommitInfo``
        durable, no note of a refused folder sync), and where the storage is a local folder the
        backdoor sees, that folder can be fsynced. Not declared: a publish may report
        durability either way (the core passes it on)."""
        info = put(subject.backend, "sync/f.bin", b"durable", PutMode.CREATE)
        if not subject.backend.capabilities.dir_fsync:
            pytest.skip("dir_fsync not declared")
        assert info.durable, info.notes
        assert not [n for n in info.notes if "sync" in n.lower()], info.notes
        if isinstance(subject.door, LocalBackdoor):
            fd = os.open(subject.door.root / "sync", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def test_capability_free_space(self, subject: BackendSubject) -> None:
        """``free_space`` answers with a number of bytes (at the root and at a path not made
        yet, before anything is stored and after) exactly where the capability is declared, and
        None elsewhere: the core refuses a commit too large for the number it gets."""
        declared = subject.backend.capabilities.free_space
        before = subject.backend.free_space(("not", "made", "yet"))
        put(subject.backend, "space/f.bin", b"x", PutMode.CREATE)
        answers = [before, subject.backend.free_space(()), subject.backend.free_space(("space",))]
        if declared:
            assert all(isinstance(a, int) and a >= 0 for a in answers), answers
        else:
            assert answers == [None, None, None]

    def test_capability_empty_folders(self, subject: BackendSubject) -> None:
        """Where ``empty_folders`` is declared: an empty folder artifact is there after its
        publish (the backdoor sees a folder; ``stat`` says ``is_dir``; ``walk`` lists nothing
        below it), so the core can verify it by its presence. Not declared (object stores): the
        publish still succeeds and puts no file anywhere, and the core verifies the folder by
        its record alone."""
        put_folder(subject.backend, "empty", {})
        put_folder(subject.backend, "outer", {"f.bin": b"f"}, empty=("inner",))
        assert files_under(subject.door, "empty") == {}
        assert files_under(subject.door, "outer") == {"f.bin": b"f"}
        if not subject.backend.capabilities.empty_folders:
            pytest.skip("empty_folders not declared")
        assert subject.door.is_dir("empty")
        info = subject.backend.stat(("empty",))
        assert info is not None and info.is_dir
        assert subject.backend.walk(("empty",)) == []

    def test_capability_mtime_resolution(self, subject: BackendSubject) -> None:
        """The modification time ``stat`` and ``walk`` report for a file just published is no
        earlier than the write's start less ``mtime_resolution`` (gc trusts that bound when it
        ages entries) and no later than its end; None or 0 (unknown) is allowed. The storage
        runs on this host's clock (``CLOCK_SLACK``: its coarse tick)."""
        lag = subject.backend.capabilities.mtime_resolution
        assert lag >= 0
        start = time.time()
        put(subject.backend, "times/f.bin", b"dated", PutMode.CREATE)
        end = time.time()
        info = subject.backend.stat(("times", "f.bin"))
        assert info is not None
        listed = dict(subject.backend.walk(("times",)))[("f.bin",)]
        for mtime in (info.mtime, listed.mtime):
            if mtime:
                assert start - lag - CLOCK_SLACK <= mtime <= end + CLOCK_SLACK, (start, mtime, end)

    def test_capability_client_retries(self, subject: BackendSubject) -> None:
        """Where ``client_retries`` is declared: a connection broken once mid-request does not
        fail a publish (the store's client retried it), and the bytes stand whole. Needs the
        subject's ``faulty`` hook; not declared: the core retries a copy as a whole instead."""
        if not subject.backend.capabilities.client_retries:
            pytest.skip("client_retries not declared")
        if subject.faulty is None:
            pytest.skip("the subject has no way to break a connection (faulty=None)")
        data = os.urandom(600 * 1024)
        with subject.faulty() as backend:
            put(backend, "retried.bin", data, PutMode.CREATE)
        assert subject.door.read("retried.bin") == data
