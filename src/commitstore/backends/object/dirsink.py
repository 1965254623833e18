"""Folder artifacts on object stores, shared by every object store.

There is no atomic folder publish on an object store: each file is its own checked upload, and the
record, written after the last one, is what commits the folder. A failure takes back the files
already uploaded. Create-only: where the store has conditional writes the core relies on them and
checks nothing, but a folder is many objects, so the sink checks absence itself then; elsewhere
the core checks absence under ``publish_lock()`` and the sink does not check again.
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
        try:
            files = hash_and_sync_tree(self.local_path)
            if self._mode is PutMode.REPLACE:
                b.remove(self._parts)
            elif b.capabilities.exclusive_create and b.stat(self._parts) is not None:
                raise AlreadyExistsError(f"{'/'.join(self._parts)} already exists")
            if not files and self._mark_empty is not None:
                self._mark_empty()
            uploaded: list[Parts] = []
            try:
                for rel, size, digest in files:
                    fparts = (*self._parts, *rel.split("/"))
                    sink = b.open_sink(fparts, mode=PutMode.REPLACE)
                    with open(self.local_path / rel, "rb") as src:
                        while chunk := src.read(CHUNK):
                            sink.write(memoryview(chunk))
                    sink.publish(size=size, digest=digest)
                    uploaded.append(fparts)
            except BaseException:
                for fparts in uploaded:  # no record will claim them: take them back
                    with contextlib.suppress(Exception):
                        b.remove(fparts)
                raise
            return CommitInfo(
                sum(s for _, s, _ in files),
                files=files,
                notes=["object store: files appear one by one; the record commits"],
            )
        finally:
            shutil.rmtree(self.local_path, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.local_path, ignore_errors=True)
