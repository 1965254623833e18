"""Folder artifacts on object stores, shared by every object store.

There is no atomic folder publish on an object store: each file is its own checked upload, and the
record, written after the last one, is what commits the folder. Create-only: where the store has
conditional writes the core relies on them and checks nothing, but a folder is many objects, so the
sink checks absence itself then; elsewhere the core checks absence under ``publish_lock()`` and the
sink does not check again. A failed create takes back the files already uploaded.

Replace never deletes before it has uploaded: every new file is uploaded over its key (each object
replaced in one step, checked by its own upload), and only after all of them are in place are the
old files the new folder does not contain deleted. A failure mid-upload deletes nothing old: the
files not yet replaced are still the old ones, the ones replaced already hold the new bytes, and
files only the new folder has are taken back. Such a mix (and a crash anywhere before the new
record is written) leaves the folder under its old record, which no longer matches it: ``verify``
reports it and reads refuse it, nothing passes for whole; committing the folder again completes it.
Old files are never lost by name, but the old version's bytes of the files already replaced are.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from commitstore.backends.base import Backend, CommitInfo, DirSink, PutMode
from commitstore.backends.localtree import hash_and_sync_tree
from commitstore.errors import AlreadyExistsError
from commitstore.layout import Parts

CHUNK = 8 * 1024 * 1024


class ObjectDirSink(DirSink):
    """A local temporary folder, uploaded file by file on publish."""

    def __init__(
        self,
        backend: Backend,
        parts: Parts,
        *,
        mode: PutMode,
        mark_empty: Callable[[], None] | None = None,
    ) -> None:
        self._b = backend
        self._parts = parts
        self._mode = mode
        self._mark_empty = mark_empty
        self.local_path = Path(tempfile.mkdtemp(prefix=".commitstore.tmp."))

    def publish(self) -> CommitInfo:
        b = self._b
        replace = self._mode is PutMode.REPLACE
        try:
            files = hash_and_sync_tree(self.local_path)
            old: set[Parts] = set()
            old_object = False
            if replace:
                old = {rel for rel, _ in b.walk(self._parts)}
                found = b.stat(self._parts)
                old_object = found is not None and not found.is_dir  # a file artifact before
            elif b.capabilities.exclusive_create and b.stat(self._parts) is not None:
                raise AlreadyExistsError(f"{'/'.join(self._parts)} already exists")
            if not files and self._mark_empty is not None:
                self._mark_empty()
            uploaded: list[Parts] = []
            try:
                for rel, size, digest in files:
                    fparts = (*self._parts, *rel.split("/"))
                    sink = b.open_sink(fparts, mode=PutMode.REPLACE)
                    try:
                        with open(self.local_path / rel, "rb") as src:
                            while chunk := src.read(CHUNK):
                                sink.write(memoryview(chunk))
                    except BaseException:
                        sink.abort()
                        raise
                    sink.publish(size=size, digest=digest)
                    uploaded.append(fparts)
            except BaseException:
                # No record will claim what was uploaded: take back what no old file had.
                # A replaced old file is kept (new bytes under the old record: verify sees it).
                for fparts in uploaded:
                    if tuple(fparts[len(self._parts) :]) not in old:
                        with contextlib.suppress(Exception):
                            b.remove(fparts)
                raise
            # Every new file is in place and checked: now the old ones it does not contain go.
            new = {tuple(rel.split("/")) for rel, _, _ in files}
            for stale in sorted(old - new):
                b.remove((*self._parts, *stale))
            if old_object:  # the name held a file artifact: that object goes too
                b.remove(self._parts)
            return CommitInfo(
                sum(s for _, s, _ in files),
                files=files,
                notes=["object store: files appear one by one; the record commits"],
            )
        finally:
            shutil.rmtree(self.local_path, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.local_path, ignore_errors=True)
