"""Planted liars: ``linkdir`` backends that each break one promise of the backend contract (or
declare a capability they do not have), so the test can show the contract catches each one."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from commitstore.backends.base import (
    Capabilities,
    CommitInfo,
    DirSink,
    FileInfo,
    FileSink,
    PutMode,
)
from commitstore.errors import AlreadyExistsError
from commitstore.layout import Parts
from commitstore.testing.linkdir import LinkDirBackend, LinkDirSink, LinkFileSink


class EarlyBytes(LinkDirBackend):
    """Writes a ``CREATE`` file straight under its final name: bytes visible before publish."""

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        sink = LinkFileSink(self, parts, mode)
        assert sink.fd is not None
        os.close(sink.fd)
        os.unlink(sink.staging)
        sink.staging = sink.final
        sink.fd = os.open(sink.final, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sink.mode = PutMode.REPLACE  # os.replace onto itself: a no-op
        return sink


class _CheckThenRename(LinkFileSink):
    """``CREATE`` as "is the name free? then rename over it": a window between the two."""

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        if self.mode is PutMode.CREATE:
            if os.path.lexists(self.final):
                self.abort()
                raise AlreadyExistsError(f"{self.final} already exists")
            time.sleep(0.2)  # the window a racing writer falls into
            self.mode = PutMode.REPLACE
        return super().publish(size=size, digest=digest)


class NotExclusive(LinkDirBackend):
    """Declares ``exclusive_create`` but checks, then renames: two racing writers both win."""

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return _CheckThenRename(self, parts, mode)


class IgnoresCreate(LinkDirBackend):
    """Declares no ``exclusive_create`` and publishes ``CREATE`` as a replace: a taken name is
    overwritten at publish."""

    capabilities = dataclasses.replace(LinkDirBackend.capabilities, exclusive_create=False)

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return LinkFileSink(self, parts, PutMode.REPLACE)


class _InPlace(LinkFileSink):
    """``REPLACE`` as a copy into the final file, truncated first, in small pieces."""

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        if self.mode is not PutMode.REPLACE or not os.path.exists(self.final):
            return super().publish(size=size, digest=digest)
        assert self.fd is not None
        os.close(self.fd)
        self.fd = None
        data = Path(self.staging).read_bytes()
        with open(self.final, "r+b") as f:
            f.truncate(0)
            for i in range(0, len(data), 16 * 1024):
                f.write(data[i : i + 16 * 1024])
                f.flush()
                time.sleep(0.001)
        os.unlink(self.staging)
        return CommitInfo(bytes_written=size)


class TornReplace(LinkDirBackend):
    """Declares ``atomic_replace`` but rewrites the file in place: readers see torn bytes."""

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return _InPlace(self, parts, mode)


class _FileByFile(LinkDirSink):
    """Publishes a folder by making it, then moving its files in one at a time."""

    def publish(self) -> CommitInfo:
        info = CommitInfo(bytes_written=0)
        os.mkdir(self.final)
        for entry in sorted(os.listdir(self.local_path)):
            os.rename(self.local_path / entry, self.final / entry)
            time.sleep(0.005)
        os.rmdir(self.local_path)
        return info


class PiecemealFolder(LinkDirBackend):
    """Declares ``atomic_dir_publish`` but fills the folder file by file."""

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        return _FileByFile(self, parts, mode)


class _LeavesStaging(LinkFileSink):
    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None  # the staging file stays


class LeakyAbort(LinkDirBackend):
    """``abort`` closes the staging file but leaves it on disk."""

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return _LeavesStaging(self, parts, mode)


class NoFreeSpace(LinkDirBackend):
    """Declares ``free_space`` but never answers with a number."""

    def free_space(self, parts: Parts) -> int | None:
        return None


class _DropsEmpty(LinkDirSink):
    def publish(self) -> CommitInfo:
        if not os.listdir(self.local_path):  # as a store without folders: nothing to upload
            os.rmdir(self.local_path)
            return CommitInfo(bytes_written=0)
        return super().publish()


class DropsEmptyFolders(LinkDirBackend):
    """Declares ``empty_folders`` but publishes an empty folder as nothing."""

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        return _DropsEmpty(self, parts, mode)


class LaggingClock(LinkDirBackend):
    """Declares ``mtime_resolution=0`` but reports modification times 5 s late."""

    def stat(self, parts: Parts) -> FileInfo | None:
        info = super().stat(parts)
        return info if info is None else _late(info)

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        return [(rel, _late(info)) for rel, info in super().walk(parts)]


def _late(info: FileInfo) -> FileInfo:
    mtime = None if info.mtime is None else info.mtime - 5
    return dataclasses.replace(info, mtime=mtime)


class CachedStat(LinkDirBackend):
    """``stat`` answers from a cache: a file changed behind its back is not seen."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self.cache: dict[Parts, FileInfo | None] = {}

    def stat(self, parts: Parts) -> FileInfo | None:
        if parts not in self.cache:
            self.cache[parts] = super().stat(parts)
        return self.cache[parts]


class GreedyRemoveFiles(LinkDirBackend):
    """``remove_files`` removes the whole folder, files it was not told to included."""

    def remove_files(self, parts: Parts, files: list[Parts]) -> bool:
        found = any(os.path.lexists(self.path((*parts, *rel))) for rel in files)
        shutil.rmtree(self.path(parts), ignore_errors=True)
        return found


class NotDurable(LinkDirBackend):
    """Declares ``dir_fsync`` but its publishes report a refused folder sync."""

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return _Undurable(self, parts, mode)


class _Undurable(LinkFileSink):
    def publish(self, *, size: int, digest: str) -> CommitInfo:
        info = super().publish(size=size, digest=digest)
        info.durable = False
        info.notes.append("folder sync refused (EINVAL)")
        return info


class _FilledInPlace(LinkDirSink):
    """Hands out the final folder itself to fill: files visible while they are written."""

    def __init__(self, backend: LinkDirBackend, parts: Parts, mode: PutMode) -> None:
        super().__init__(backend, parts, mode)
        os.rmdir(self.local_path)
        os.makedirs(self.final, exist_ok=True)
        self.local_path = self.final

    def publish(self) -> CommitInfo:
        return CommitInfo(bytes_written=0)


class EarlyFolder(LinkDirBackend):
    """Folder files appear under the folder's name as they are written."""

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        return _FilledInPlace(self, parts, mode)


class _Merges(LinkDirSink):
    def publish(self) -> CommitInfo:
        if self.mode is PutMode.REPLACE and self.final.is_dir():
            shutil.copytree(self.local_path, self.final, dirs_exist_ok=True)
            shutil.rmtree(self.local_path)
            return CommitInfo(bytes_written=0)
        return super().publish()


class MergingReplace(LinkDirBackend):
    """A folder ``REPLACE`` copies the new files over the old folder: old files stay."""

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        return _Merges(self, parts, mode)


class MakesRootAtOpen(LinkDirBackend):
    """Opening writes a marker file into the root."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        os.makedirs(self.root, exist_ok=True)
        (self.root / ".opened").write_bytes(b"")


class HidesDotfiles(LinkDirBackend):
    """``walk`` leaves out hidden files."""

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        return [(rel, i) for rel, i in super().walk(parts) if not rel[-1].startswith(".")]


class ReadsPrefix(LinkDirBackend):
    """``open_read`` serves a reader that ignores ``seek``."""

    def open_read(self, parts: Parts) -> BinaryIO:
        data = super().open_read(parts).read()
        reader = io.BytesIO(data)
        reader.seek = lambda *_a, **_k: 0  # type: ignore[method-assign]
        return reader


class RemoveSaysTrue(LinkDirBackend):
    """``remove`` says True even when nothing was there."""

    def remove(self, parts: Parts) -> bool:
        super().remove(parts)
        return True


class RemovesFullFolders(LinkDirBackend):
    """``remove_empty_folder`` removes a folder whatever it holds."""

    def remove_empty_folder(self, parts: Parts) -> bool:
        return bool(parts) and self.remove(parts)


def _declares(**fields: object) -> Capabilities:
    """``linkdir``'s capabilities with ``fields`` declared instead."""
    return dataclasses.replace(LinkDirBackend.capabilities, **fields)  # type: ignore[arg-type]


class HiddenStaging(LinkDirBackend):
    """Declares no ``staging_names`` but stages under staging names, as ``linkdir`` does: gc
    and deletes would never look for them."""

    capabilities = _declares(staging_names=False)


class UndatedPlans(LinkDirBackend):
    """Declares ``plans_from_records`` but reports no modification time for its data."""

    capabilities = _declares(plans_from_records=True)

    def stat(self, parts: Parts) -> FileInfo | None:
        info = super().stat(parts)
        return info if info is None else dataclasses.replace(info, mtime=None)


class SharedReader(LinkDirBackend):
    """Declares ``read_concurrency=4`` but its small-file reader keeps the name it reads in
    state shared by every thread."""

    capabilities = _declares(read_concurrency=4)

    def small_reads(
        self, folder: Parts, *, max_bytes: int | None = None
    ) -> contextlib.AbstractContextManager[Callable[[Parts], tuple[bytes, str | None]]]:
        state: dict[str, Parts] = {}

        def read(rel: Parts) -> tuple[bytes, str | None]:
            state["rel"] = rel
            time.sleep(0.05)  # the window another thread's name falls into
            return self.read_small_tagged((*folder, *state["rel"]))

        return contextlib.nullcontext(read)


class NoPread(LinkDirBackend):
    """Declares ``rereads_locally`` but its readers are plain files (no ``pread``)."""

    capabilities = _declares(rereads_locally=True)


class RefusesRereads(LinkDirBackend):
    """Declares ``reread_bodies`` but its sinks refuse every rereadable source."""

    capabilities = _declares(reread_bodies=True)


class StagesWhatItHolds(LinkDirBackend):
    """Declares ``whole_max`` (1 MiB held in memory) but stages every byte on disk."""

    capabilities = _declares(whole_max=1024 * 1024)


LIARS: dict[type[LinkDirBackend], str] = {
    EarlyBytes: "test_staged_file_invisible_until_publish",
    NotExclusive: "test_capability_exclusive_create",
    IgnoresCreate: "test_create_refuses_a_taken_name",
    TornReplace: "test_capability_atomic_replace",
    PiecemealFolder: "test_capability_atomic_dir_publish",
    LeakyAbort: "test_abort_leaves_nothing",
    NoFreeSpace: "test_capability_free_space",
    DropsEmptyFolders: "test_capability_empty_folders",
    LaggingClock: "test_capability_mtime_resolution",
    CachedStat: "test_stat_reports_what_is_stored",
    GreedyRemoveFiles: "test_remove_files_removes_exactly_those",
    NotDurable: "test_capability_dir_fsync",
    EarlyFolder: "test_staged_folder_invisible_until_publish",
    MergingReplace: "test_replace_publishes_over_a_file",
    MakesRootAtOpen: "test_opening_creates_nothing",
    HidesDotfiles: "test_walk_lists_every_file_below",
    ReadsPrefix: "test_open_read_reads_and_seeks",
    HiddenStaging: "test_capability_staging_names",
    UndatedPlans: "test_capability_plans_from_records",
    SharedReader: "test_capability_read_concurrency",
    NoPread: "test_capability_rereads_locally",
    RefusesRereads: "test_capability_reread_bodies",
    StagesWhatItHolds: "test_capability_whole_max",
    RemoveSaysTrue: "test_remove_file_and_tree",
    RemovesFullFolders: "test_remove_empty_folder_spares_a_full_one",
}
"""Each liar and the contract case that must catch it."""
