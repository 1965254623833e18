"""In-memory strategy over fsspec's ``memory://`` filesystem, with the same semantics as local.

Staged bytes live in a private buffer that no reader can see; publishing is one assignment into the
filesystem's store under a lock, so readers see the old bytes or the new, never a mix. Folder
artifacts publish all their files under the same lock. For fast tests in one process: the memory
filesystem is shared by everything in the process and lost when it exits.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from commitstore.backends.base import (
    Backend,
    Capabilities,
    CommitInfo,
    DirSink,
    FileInfo,
    FileSink,
    PutMode,
    take_options,
)
from commitstore.backends.localtree import hash_and_sync_tree
from commitstore.errors import AlreadyExistsError, NotFoundError
from commitstore.layout import Parts

_LOCK = threading.RLock()


class MemoryBackend(Backend):
    """A prefix of the process-wide fsspec memory filesystem."""

    strategy = "memory-swap"
    capabilities = Capabilities(
        atomic_replace=True,
        exclusive_create=True,
        dir_fsync=False,
        atomic_dir_publish=True,
        free_space=False,
    )

    def place(self) -> tuple[str, ...]:
        """``("memory", *root parts)``."""
        return ("memory", *(p for p in self.root.split("/") if p))

    def __init__(self, root: str, *, reason: str = "memory:// URL") -> None:
        self.fs = MemoryFileSystem(skip_instance_cache=True)
        self.root = "/" + root.strip("/")
        self.reason = reason

    def __repr__(self) -> str:
        return f"MemoryBackend({self.root!r})"

    def key(self, parts: Parts) -> str:
        """The memory filesystem path of ``parts``."""
        return "/".join((self.root.rstrip("/"), *parts))

    def _exists(self, key: str) -> bool:
        return key in self.fs.store or key in self.fs.pseudo_dirs or self._has_children(key)

    def _has_children(self, key: str) -> bool:
        prefix = key + "/"
        return any(k.startswith(prefix) for k in self.fs.store)

    def root_exists(self) -> bool:
        """True when anything is stored under the root."""
        return self._exists(self.root)

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        overwrite = mode is PutMode.REPLACE
        return MemoryFileSink(self, parts, overwrite=overwrite)

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        overwrite = mode is PutMode.REPLACE
        return MemoryDirSink(self, parts, overwrite=overwrite)

    def open_read(self, parts: Parts) -> BinaryIO:
        key = self.key(parts)
        with _LOCK:
            entry = self.fs.store.get(key)
            if entry is None:
                raise NotFoundError(f"memory://{key} does not exist")
            data = entry.getvalue()
        return io.BytesIO(data)

    def stat(self, parts: Parts) -> FileInfo | None:
        key = self.key(parts)
        with _LOCK:
            entry = self.fs.store.get(key)
            if entry is not None:
                return FileInfo(size=entry.size, mtime=_mtime(entry), regular=True)
            if key in self.fs.pseudo_dirs or self._has_children(key):
                return FileInfo(size=0, mtime=None, is_dir=True)
        return None

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        prefix = self.key(parts) + "/"
        with _LOCK:
            items = [(k, v) for k, v in self.fs.store.items() if k.startswith(prefix)]
        return [
            (tuple(k[len(prefix) :].split("/")), FileInfo(size=v.size, mtime=_mtime(v)))
            for k, v in items
        ]

    def remove(self, parts: Parts) -> bool:
        with _LOCK:
            return self._drop(self.key(parts))

    @contextlib.contextmanager
    def publish_lock(self) -> Iterator[None]:
        """The process-wide lock of the memory filesystem."""
        with _LOCK:
            yield

    def free_space(self, parts: Parts) -> int | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "reason": self.reason,
            "location": f"memory://{self.root}",
            "capabilities": {
                k: getattr(self.capabilities, k) for k in self.capabilities.__dataclass_fields__
            },
        }

    def install(
        self, entries: dict[str, bytes], final: str, *, overwrite: bool, is_dir: bool = False
    ) -> None:
        """Put every entry in the store in one step (under the lock); a folder is marked as one
        even when empty."""
        with _LOCK:
            if self._exists(final):
                if not overwrite:
                    raise AlreadyExistsError(f"memory://{final} already exists")
                self._drop(final)
            now = time.time()
            for key, data in entries.items():
                f = MemoryFile(self.fs, key, data)
                f.modified = now
                self.fs.store[key] = f
            if is_dir:
                self.fs.pseudo_dirs.append(final)

    def _drop(self, key: str) -> bool:
        doomed = [k for k in self.fs.store if k == key or k.startswith(key + "/")]
        for k in doomed:
            del self.fs.store[k]
        dirs = [d for d in self.fs.pseudo_dirs if d == key or d.startswith(key + "/")]
        for d in dirs:
            self.fs.pseudo_dirs.remove(d)
        return bool(doomed or dirs)


def _mtime(entry: Any) -> float | None:
    value = getattr(entry, "modified", None)
    if value is None:
        return None
    ts = value.timestamp() if hasattr(value, "timestamp") else float(value)
    return ts if ts > 0 else None


class MemoryFileSink(FileSink):
    """A private buffer, swapped into the store on publish."""

    def __init__(self, backend: MemoryBackend, parts: Parts, *, overwrite: bool) -> None:
        self._backend = backend
        self._key = backend.key(parts)
        self._overwrite = overwrite
        self._buf: io.BytesIO | None = io.BytesIO()
        self.bytes_written = 0

    def write(self, data: memoryview) -> None:
        assert self._buf is not None, "write after publish/abort"
        self.bytes_written += self._buf.write(data)

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert self._buf is not None, "publish after publish/abort"
        data = self._buf.getvalue()
        self._buf = None
        self._backend.install({self._key: data}, self._key, overwrite=self._overwrite)
        return CommitInfo(len(data))

    def abort(self) -> None:
        self._buf = None


class MemoryDirSink(DirSink):
    """A local temporary folder, copied into the store in one step on publish."""

    def __init__(self, backend: MemoryBackend, parts: Parts, *, overwrite: bool) -> None:
        self._backend = backend
        self._key = backend.key(parts)
        self._overwrite = overwrite
        self.local_path = Path(tempfile.mkdtemp(prefix=".commitstore.tmp."))

    def publish(self) -> CommitInfo:
        try:
            files = hash_and_sync_tree(self.local_path)
            entries = {
                f"{self._key}/{rel}": (self.local_path / rel).read_bytes() for rel, _, _ in files
            }
            self._backend.install(entries, self._key, overwrite=self._overwrite, is_dir=True)
            return CommitInfo(sum(s for _, s, _ in files), files=files)
        finally:
            self.abort()

    def abort(self) -> None:
        shutil.rmtree(self.local_path, ignore_errors=True)


def factory(url: str, options: dict[str, Any]) -> Backend:
    take_options(options, {})
    return MemoryBackend(url[len("memory://") :])
