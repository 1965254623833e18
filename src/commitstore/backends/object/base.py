"""What the object stores (S3, GCS, Azure) share: a bucket and prefix, key naming, declared
capabilities, the create-only capability that is probed once, never assumed, and the Backend API
written once over each store's primitives (fresh stat, listing, deletes, an upload session)."""

from __future__ import annotations

import abc
from typing import Any

from commitstore.backends.base import Backend, Capabilities, DirSink, FileInfo, FileSink, PutMode
from commitstore.backends.object.dirsink import ObjectDirSink
from commitstore.backends.object.upload import ObjectFileSink, ObjectStat, Upload
from commitstore.layout import Parts


class ObjectBackend(Backend):
    """A prefix in a bucket. Subclasses give ``scheme``, ``whole_max`` and the primitives."""

    scheme: str
    read_concurrency = 16
    staging_names = False

    def __init__(self, bucket: str, prefix: str, *, conditional_writes: bool | None, reason: str):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._conditional = conditional_writes
        self.reason = reason

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        return Capabilities(
            atomic_replace=True,
            exclusive_create=self.conditional_writes(),
            dir_fsync=False,
            atomic_dir_publish=False,
            free_space=False,
            empty_folders=False,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shown(())!r})"

    def conditional_writes(self) -> bool:
        """Whether create-only writes are honoured (probed once, on first need)."""
        if self._conditional is None:
            self._conditional = self._probe_conditional()
        return self._conditional

    def key(self, parts: Parts) -> str:
        """The object key of ``parts``."""
        return "/".join((self.prefix, *parts)) if self.prefix else "/".join(parts)

    def dir_prefix(self, parts: Parts) -> str:
        """The key prefix of everything below ``parts`` (``""`` for the whole bucket)."""
        key = self.key(parts)
        return f"{key}/" if key else ""

    def shown(self, parts: Parts) -> str:
        """A credential-free URL for messages."""
        return f"{self.scheme}://{self.bucket}/{self.key(parts)}".rstrip("/")

    # -- primitives, per store ------------------------------------------------------------
    @property
    @abc.abstractmethod
    def whole_max(self) -> int:
        """At most this many bytes go as one whole-object put (held in memory); more, in parts."""

    @abc.abstractmethod
    def _probe_conditional(self) -> bool:
        """Ask the endpoint whether a create-only write refuses to replace an object."""

    @abc.abstractmethod
    def head(self, parts: Parts) -> ObjectStat | None:
        """A fresh stat of one object (never a listing cache); None if absent."""

    @abc.abstractmethod
    def list_objects(self, parts: Parts, *, limit: int | None = None) -> list[ObjectStat]:
        """Every object below ``parts`` (or the first ``limit``), folder markers included."""

    @abc.abstractmethod
    def delete_key(self, parts: Parts, key: str) -> None:
        """Delete one object by its key (``parts`` is for messages)."""

    def delete_keys(self, parts: Parts, keys: list[str]) -> None:
        """Delete many objects (stores with a batch delete override this)."""
        for key in keys:
            self.delete_key(parts, key)

    @abc.abstractmethod
    def delete_version(self, parts: Parts, tag: str) -> None:
        """Delete the object at ``parts`` only if it is still the version tagged ``tag``."""

    @abc.abstractmethod
    def new_upload(self, parts: Parts, *, create_only: bool) -> Upload:
        """An upload session for ``parts`` (no I/O yet); ``create_only``: the conditional write."""

    def mark_empty_folder(self, parts: Parts) -> None:
        """Make an empty folder artifact visible where the store can (default: it cannot)."""

    def describe_store(self) -> dict[str, Any]:
        """The store's own part of ``describe()`` (endpoint, sizes)."""
        return {}

    # -- Backend API, once for every store --------------------------------------------------
    def free_space(self, parts: Parts) -> int | None:
        return None

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return ObjectFileSink(self, parts, mode=mode)

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        return ObjectDirSink(
            self, parts, mode=mode, mark_empty=lambda: self.mark_empty_folder(parts)
        )

    def read_small(self, parts: Parts) -> bytes:
        """One GET (no stat first)."""
        return self.read_small_tagged(parts)[0]

    def stat(self, parts: Parts) -> FileInfo | None:
        found = self.head(parts) if parts else None
        if found is not None:
            return FileInfo(found.size, found.mtime)
        if self.list_objects(parts, limit=1):
            return FileInfo(0, None, is_dir=True)
        return None

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        prefix = self.dir_prefix(parts)
        return [
            (tuple(o.key[len(prefix) :].split("/")), FileInfo(o.size, o.mtime, tag=o.tag))
            for o in self.list_objects(parts)
            if not o.key.endswith("/")  # a folder marker (empty folder artifact), not a file
        ]

    def remove(self, parts: Parts) -> bool:
        if parts and self.head(parts) is not None:
            self.delete_key(parts, self.key(parts))
            return True
        keys = [o.key for o in self.list_objects(parts)]
        self.delete_keys(parts, keys)
        return bool(keys)

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "reason": self.reason,
            "location": self.shown(()),
            "capabilities": {
                k: getattr(self.capabilities, k) for k in Capabilities.__dataclass_fields__
            },
            "conditional_writes": self._conditional,
            **self.describe_store(),
        }
