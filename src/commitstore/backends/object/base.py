"""What the object-store strategies (S3, GCS) share: a bucket and prefix, key naming, declared
capabilities, and the create-only capability that is probed once, never assumed."""

from __future__ import annotations

import abc
from typing import Any

from commitstore.backends.base import Backend, Capabilities, DirSink, FileSink, PutMode
from commitstore.backends.object.dirsink import ObjectDirSink
from commitstore.layout import Parts


class ObjectBackend(Backend):
    """A prefix in a bucket. Subclasses give ``scheme`` and ``_probe_conditional``."""

    scheme: str
    read_concurrency = 16

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

    @abc.abstractmethod
    def _probe_conditional(self) -> bool:
        """Ask the endpoint whether a create-only write refuses to replace an object."""

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

    def free_space(self, parts: Parts) -> int | None:
        return None

    @abc.abstractmethod
    def file_sink(self, parts: Parts, *, overwrite: bool) -> FileSink:
        """This store's sink for one object."""

    def mark_empty_folder(self, parts: Parts) -> None:
        """Make an empty folder artifact visible where the store can (default: it cannot)."""

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        overwrite = mode is PutMode.REPLACE
        return self.file_sink(parts, overwrite=overwrite)

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        overwrite = mode is PutMode.REPLACE
        return ObjectDirSink(
            self,
            parts,
            overwrite=overwrite,
            file_sink=lambda p: self.file_sink(p, overwrite=True),
            mark_empty=lambda: self.mark_empty_folder(parts),
        )

    def common_description(self) -> dict[str, Any]:
        """The part of ``describe()`` every object store shares."""
        return {
            "strategy": self.strategy,
            "reason": self.reason,
            "location": self.shown(()),
            "capabilities": {
                k: getattr(self.capabilities, k) for k in Capabilities.__dataclass_fields__
            },
            "conditional_writes": self._conditional,
        }
