"""What the object stores (S3, GCS, Azure) share: a bucket and prefix, key naming, declared
capabilities, the create-only capability that is probed once, never assumed, and the Backend API
written once over each store's primitives (fresh stat, listing, deletes, an upload session)."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from commitstore.backends.base import Backend, Capabilities, DirSink, FileInfo, FileSink, PutMode
from commitstore.backends.object.dirsink import ObjectDirSink, complete_replace
from commitstore.backends.object.resume import upload_id_of
from commitstore.backends.object.upload import ObjectFileSink, ObjectStat, Upload
from commitstore.digest import copy_hashed
from commitstore.errors import CommitError, ConfigurationError, NotFoundError
from commitstore.layout import Parts


def with_heartbeat(backend: ObjectBackend, value: object) -> ObjectBackend:
    """``backend`` with the ``heartbeat=`` store option applied (seconds, a positive number).

    Raises:
        ConfigurationError: anything else, before any I/O.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(f"heartbeat must be a positive number of seconds, not {value!r}")
    backend.heartbeat = float(value)
    return backend


PROBED_FIELDS = frozenset(
    (
        "atomic_replace",
        "exclusive_create",
        "dir_fsync",
        "atomic_dir_publish",
        "free_space",
        "empty_folders",
        "mtime_resolution",
        "client_retries",
    )
)
"""The fields of an object store's capabilities whose first read probes create-only writes
(once per backend), as every read of them always has: the storage guarantees. The behaviour
fields (``staging_names``, ``read_concurrency``, ``whole_max``, ...) never probe, so a scan or a
read-only check sends no write."""


class ProbedCapabilities(Capabilities):
    """An object store's capabilities, whose ``exclusive_create`` is the answer of ``probe``
    (``ObjectBackend.conditional_writes``: asked of the endpoint once, on first need), asked
    when a field of :data:`PROBED_FIELDS` is read, never for the others."""

    def __init__(self, probe: Callable[[], bool], **declared: Any) -> None:
        object.__setattr__(self, "_probe", probe)
        super().__init__(exclusive_create=False, **declared)

    def __getattribute__(self, name: str) -> Any:
        if name in PROBED_FIELDS:
            object.__getattribute__(self, "_probe")()
        return super().__getattribute__(name)

    @property
    def exclusive_create(self) -> bool:
        """Create-only writes are honoured (the probe's answer)."""
        probe: Callable[[], bool] = object.__getattribute__(self, "_probe")
        return probe()

    @exclusive_create.setter
    def exclusive_create(self, value: bool) -> None:
        """Set by the dataclass's ``__init__`` only: the probe answers instead."""
        del value


class ObjectBackend(Backend):
    """A prefix in a bucket. Subclasses give ``scheme``, ``whole_max`` and the primitives."""

    scheme: str
    heartbeat = 60.0
    """Seconds between a committing writer's heartbeats (rewrites of its pending record); gc's
    ``min_age`` must exceed it. The ``heartbeat=`` store option."""
    md5_bodies = False
    """The upload sink computes each body's MD5 while filling it (stores that send one)."""
    reread_bodies = False
    """The upload sink may send bodies read again from a source it is offered instead of
    buffers it owns (``ObjectFileSink.reread_from``): only where the server checks each body
    against the MD5 computed from the bytes written (``md5_bodies``). Declared as
    ``Capabilities.reread_bodies``."""

    def __init__(self, bucket: str, prefix: str, *, conditional_writes: bool | None, reason: str):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._conditional = conditional_writes
        self.reason = reason

    mtime_resolution = 0.0
    """Precision of the store's modification times (``Capabilities.mtime_resolution``)."""

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """What every object store declares, with this store's time precision, single-put
        limit and body rereads; create-only writes are probed on the first read of a storage
        guarantee (:data:`PROBED_FIELDS`), never of a behaviour field."""
        return ProbedCapabilities(
            self.conditional_writes,
            atomic_replace=True,
            dir_fsync=False,
            atomic_dir_publish=False,
            free_space=False,
            empty_folders=False,
            mtime_resolution=self.mtime_resolution,
            client_retries=True,
            staging_names=False,
            writer_slots=True,
            plans_from_records=True,
            read_concurrency=16,
            reread_bodies=self.reread_bodies,
            whole_max=self.whole_max,
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

    def place(self) -> tuple[str, ...]:
        """``(scheme, endpoint, bucket, *prefix parts)``; the endpoint is the backend's
        ``endpoint`` where it has one (S3), else empty."""
        server = str(getattr(self, "endpoint", None) or "")
        prefix = tuple(p for p in self.prefix.split("/") if p)
        return (self.scheme, server, self.bucket, *prefix)

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

    copy_max: int = 0
    """The largest object :meth:`server_copy` takes in one request; 0: the store has none here,
    and :meth:`copy_checked` streams the bytes through the client instead."""

    def server_copy(self, src: ObjectStat, parts: Parts) -> ObjectStat:
        """Copy object ``src`` inside the store to ``parts``, only if ``src`` is still the version
        its tag names; return a fresh stat of the copy. Implemented where ``copy_max`` > 0."""
        raise NotImplementedError(f"{type(self).__name__} has no server-side copy")

    def same_content(self, src: ObjectStat, dst: ObjectStat) -> bool:
        """Whether the store's own metadata shows that ``dst`` holds the bytes of ``src``: sizes,
        plus the store's checksum where it has one for both."""
        if src.size != dst.size:
            return False
        return src.checksum is None or dst.checksum is None or src.checksum == dst.checksum

    def copy_checked(self, src: Parts, dst: Parts, *, size: int, digest: str) -> ObjectStat:
        """Replace ``dst`` with a copy of ``src``, which must be ``size`` bytes of ``digest``,
        and return ``dst`` as stored right after (its tag names this copy).

        Each store's server-side copy (S3 CopyObject, GCS rewrite, Azure Copy Blob) when the
        object fits one request, conditioned on the version just seen and checked with the
        store's metadata (:meth:`same_content`); otherwise the bytes are streamed through the
        client and hashed, and published only if they are ``digest``. ``dst`` is replaced in
        one step either way (old bytes or new, never a part).

        Raises:
            CommitError: ``src`` is missing, of another size, or the copy does not match.
        """
        found = self.head(src)
        if found is None or found.size != size:
            raise CommitError(f"{self.shown(src)}: the staged file is missing or changed")
        if self.copy_max and size <= self.copy_max:
            got = self.server_copy(found, dst)
            if not self.same_content(found, got):
                raise CommitError(f"{self.shown(dst)}: the server-side copy does not match")
            return got
        sink = self.open_sink(dst, mode=PutMode.REPLACE)
        try:
            with self.open_read(src) as f:
                copied = copy_hashed(f, sink.write)
            if copied != (size, digest):
                raise CommitError(f"{self.shown(src)}: the staged file does not match its record")
        except BaseException:
            sink.abort()
            raise
        sink.publish(size=size, digest=digest)
        stored = self.head(dst)
        if stored is None or stored.size != size:
            raise CommitError(f"{self.shown(dst)}: gone or changed right after its copy")
        return stored

    def describe_store(self) -> dict[str, Any]:
        """The store's own part of ``describe()`` (endpoint, sizes)."""
        return {}

    # -- Backend API, once for every store --------------------------------------------------
    def resume_upload_of(self, state: bytes) -> tuple[str, str] | None:
        return upload_id_of(state)

    def free_space(self, parts: Parts) -> int | None:
        return None

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return ObjectFileSink(self, parts, mode=mode)

    def settle_staged(self, parts: Parts, files: list[tuple[str, int, str]], staged: Parts) -> None:
        complete_replace(self, parts, files, staged)

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        return ObjectDirSink(
            self, parts, mode=mode, mark_empty=lambda: self.mark_empty_folder(parts)
        )

    def read_small(self, parts: Parts) -> bytes:
        """One GET (no stat first)."""
        return self.read_small_tagged(parts)[0]

    def root_exists(self) -> bool:
        """True when at least one object lies under the prefix (one listing request for one
        key); a missing bucket is a store that does not exist."""
        try:
            return bool(self.list_objects((), limit=1))
        except NotFoundError:
            return False

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

    def remove_files(self, parts: Parts, files: list[Parts]) -> bool:
        """One listing of ``parts``, then one batch delete of exactly the named files found
        there (and the empty-folder marker of ``parts``, if any); never a key below ``parts``
        the list does not name (another artifact's, or a file no record claims)."""
        present = {o.key for o in self.list_objects(parts)}
        doomed = [k for k in (self.key((*parts, *rel)) for rel in files) if k in present]
        if self.dir_prefix(parts) in present:
            doomed.append(self.dir_prefix(parts))
        if doomed:
            self.delete_keys(parts, doomed)
        return bool(doomed)

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
