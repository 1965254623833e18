"""Backend contract, publishing: staged bytes stay invisible until the one publish step, abort
leaves nothing, create-only refuses a taken name (atomically among racing writers where
``exclusive_create`` is declared), and a replace is seen whole (where ``atomic_replace`` is
declared). Every observation goes through the subject's backdoor, never the backend."""

from __future__ import annotations

import threading

import pytest

from commitstore.backends.base import PutMode
from commitstore.errors import AlreadyExistsError
from commitstore.testing.subject import (
    BackendSubject,
    digest,
    files_under,
    put,
    put_folder,
    staged,
    staging_leftovers,
    visible,
)

KiB = 1024
MiB = 1024 * KiB


class PublishContract:
    """Mixed into :class:`BackendContract`; uses its ``subject`` fixture."""

    payload_size = MiB + 17
    """Bytes of the payloads of the staging cases: large enough that an object store uploads
    them in parts when the subject is opened with small part sizes."""
    replace_rounds = 6
    """How many replaces the atomic-replace case runs while a reader reads."""

    def test_staged_file_invisible_until_publish(self, subject: BackendSubject) -> None:
        """A file sink's bytes never appear under the final name before ``publish`` (neither
        after the first write, nor after the last, nor after ``prepare``), missing parent
        folders are made by the publish, and after it the name holds exactly the bytes, with no
        staging entry left behind."""
        data = bytes(range(256)) * (self.payload_size // 256) + b"tail"
        name = "deep/er/file.bin"
        sink = subject.backend.open_sink(("deep", "er", "file.bin"), mode=PutMode.CREATE)
        sink.write(memoryview(data[: len(data) // 2]))
        assert subject.door.read(name) is None, "bytes visible after the first write"
        sink.write(memoryview(data[len(data) // 2 :]))
        assert subject.door.read(name) is None, "bytes visible after the last write"
        sink.prepare()
        assert subject.door.read(name) is None, "bytes visible after prepare()"
        assert name not in visible(subject.door)
        info = sink.publish(size=len(data), digest=digest(data))
        assert subject.door.read(name) == data
        assert info.bytes_written == len(data)
        assert staging_leftovers(subject.door) == []

    def test_staged_folder_invisible_until_publish(self, subject: BackendSubject) -> None:
        """A folder sink's files never appear under the folder's name before ``publish``; after
        it, exactly those files are there, and ``CommitInfo.files`` names each with its size
        and digest, sorted by path."""
        files = {"a.bin": b"A" * 3000, "sub/b.bin": b"B" * 10, "sub/deeper/.hidden": b"h"}
        sink = subject.backend.open_dir_sink(("dirs", "step_1"), mode=PutMode.CREATE)
        for rel, data in files.items():
            path = sink.local_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            assert files_under(subject.door, "dirs/step_1") == {}, f"{rel} visible before publish"
        info = sink.publish()
        assert files_under(subject.door, "dirs/step_1") == files
        assert info.files == sorted((rel, len(d), digest(d)) for rel, d in files.items())
        assert staging_leftovers(subject.door) == []

    def test_abort_leaves_nothing(self, subject: BackendSubject) -> None:
        """``abort`` of a written file sink and of a filled folder sink leaves the storage as it
        was (no staging entry, nothing under the names), and is idempotent."""
        put(subject.backend, "keep.bin", b"kept")
        before = subject.door.files()
        sink = staged(subject.backend, "gone/file.bin", b"x" * self.payload_size, PutMode.CREATE)
        sink.abort()
        sink.abort()
        dsink = subject.backend.open_dir_sink(("gone", "folder"), mode=PutMode.CREATE)
        (dsink.local_path / "f.bin").write_bytes(b"f" * 1000)
        dsink.abort()
        dsink.abort()
        assert subject.door.files() == before
        assert subject.door.read("keep.bin") == b"kept"

    def test_create_refuses_a_taken_name(self, subject: BackendSubject) -> None:
        """A ``CREATE`` publish onto a name that holds a file (put there behind the backend's
        back, after the sink was opened) raises AlreadyExistsError at publish, whatever
        ``exclusive_create`` says: the old bytes stay, nothing staged is left."""
        sink = staged(subject.backend, "taken.bin", b"new bytes", PutMode.CREATE)
        subject.door.write("taken.bin", b"old bytes")
        with pytest.raises(AlreadyExistsError):
            sink.publish(size=9, digest=digest(b"new bytes"))
        assert subject.door.read("taken.bin") == b"old bytes"
        assert staging_leftovers(subject.door) == []

    def test_replace_publishes_over_a_file(self, subject: BackendSubject) -> None:
        """A ``REPLACE`` publish onto a taken name leaves exactly the new bytes; a ``REPLACE``
        folder publish onto a folder leaves exactly the new folder's files (none of the old)."""
        subject.door.write("r.bin", b"old" * 100)
        put(subject.backend, "r.bin", b"new", PutMode.REPLACE)
        assert subject.door.read("r.bin") == b"new"
        put_folder(subject.backend, "rd", {"old.bin": b"o", "same.bin": b"1"})
        put_folder(
            subject.backend, "rd", {"same.bin": b"2", "n/new.bin": b"n"}, mode=PutMode.REPLACE
        )
        assert files_under(subject.door, "rd") == {"same.bin": b"2", "n/new.bin": b"n"}
        assert staging_leftovers(subject.door) == []

    # -- capabilities about publishing: see CapabilityContract for the field index -------------
    def test_capability_exclusive_create(self, subject: BackendSubject) -> None:
        """Where ``exclusive_create`` is declared: two writers (two backend instances) stage the
        same new name and publish ``CREATE`` at once; exactly one publish returns, the other
        raises AlreadyExistsError, and the storage holds the winner's bytes whole. Not declared:
        the core checks absence under its publish lock instead; nothing to hold the backend to.
        """
        if not subject.backend.capabilities.exclusive_create:
            pytest.skip("exclusive_create not declared")
        payloads = [b"A" * self.payload_size, b"B" * self.payload_size]
        writers = [subject.backend, subject.another()]
        sinks = [
            staged(w, "race.bin", p, PutMode.CREATE) for w, p in zip(writers, payloads, strict=True)
        ]
        barrier = threading.Barrier(2)
        outcome: dict[int, str] = {}

        def publish(i: int) -> None:
            barrier.wait(60)
            try:
                sinks[i].publish(size=len(payloads[i]), digest=digest(payloads[i]))
                outcome[i] = "won"
            except AlreadyExistsError:
                outcome[i] = "lost"
            except Exception as exc:  # reported by the assertion below
                outcome[i] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=publish, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcome.values()) == ["lost", "won"], outcome
        winner = next(i for i, o in outcome.items() if o == "won")
        assert subject.door.read("race.bin") == payloads[winner]
        assert staging_leftovers(subject.door) == []

    def test_capability_atomic_replace(self, subject: BackendSubject) -> None:
        """Where ``atomic_replace`` is declared: while the name is replaced again and again, a
        reader reading it through the backdoor in another thread only ever finds one whole
        version (never nothing, never a torn or partial file). Not declared: the core's
        move-aside protocol covers the gap; nothing to hold the backend to."""
        if not subject.backend.capabilities.atomic_replace:
            pytest.skip("atomic_replace not declared")
        size = 256 * KiB
        versions = [bytes([i]) * size for i in range(self.replace_rounds + 1)]
        put(subject.backend, "swap.bin", versions[0], PutMode.CREATE)
        done = threading.Event()
        seen: list[bytes | None] = []

        def reader() -> None:
            while not done.is_set():
                seen.append(subject.door.read("swap.bin"))
            seen.append(subject.door.read("swap.bin"))

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for data in versions[1:]:
                put(subject.backend, "swap.bin", data, PutMode.REPLACE)
        finally:
            done.set()
            thread.join()
        whole = set(versions)
        bad = [(None if s is None else (len(s), s[:1], s[-1:])) for s in seen if s not in whole]
        assert bad == [], f"{len(bad)} of {len(seen)} reads saw neither version: {bad[:3]}"
        assert seen[-1] == versions[-1]

    def test_capability_atomic_dir_publish(self, subject: BackendSubject) -> None:
        """Where ``atomic_dir_publish`` is declared: a reader listing the folder's name through
        the backdoor while a folder of many files is published sees either none of its files or
        all of them, never some. Not declared (object stores): the record, written last, is the
        folder's commit; nothing to hold the backend to."""
        if not subject.backend.capabilities.atomic_dir_publish:
            pytest.skip("atomic_dir_publish not declared")
        files = {f"part_{i:02d}.bin": bytes([i]) * 100 for i in range(12)}
        done = threading.Event()
        seen: list[int] = []

        def reader() -> None:
            while not done.is_set():
                seen.append(len(files_under(subject.door, "atomic")))
            seen.append(len(files_under(subject.door, "atomic")))

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            put_folder(subject.backend, "atomic", files)
        finally:
            done.set()
            thread.join()
        partial = sorted({n for n in seen if n not in (0, len(files))})
        assert partial == [], f"readers saw {partial} of {len(files)} files"
        assert seen[-1] == len(files)
