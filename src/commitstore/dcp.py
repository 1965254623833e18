"""``torch.distributed.checkpoint`` into a store: one committed folder artifact per save.

:class:`StorageWriter` is given to ``dcp.save`` / ``dcp.async_save`` on every rank. The coordinator
begins a multi-writer folder commit (:meth:`CommitStore.begin_folder`) when it sees the global plan
and puts its token into every rank's plan; each rank writes its shard file
(``__<rank>_0.distcp``, the layout of ``dcp.FileSystemWriter``) into the store's staging area,
hashed on the way, and returns write results that carry the shard's size and digest. In
``finish`` the coordinator checks every shard is present with its size, writes ``.metadata`` and
commits one folder record over all files: the single commit point. Until then nothing of the step
is listed, returned by ``latest()``, pruned or replicated; a rank killed mid-save leaves staging
that gc removes. On object stores the ranks upload their shards to the final keys and the record
is the commit (new names only).

:class:`StorageReader` reads a committed DCP folder (``name=None``: the newest DCP folder that
verifies fully). Each shard file is read once per ``read_data`` call and checked against its
record (size and full digest) before any tensor is taken from it; a shard that fails raises
:class:`~commitstore.IntegrityError` (``dcp.load`` reports it inside torch's
``CheckpointException``; :func:`load` raises it as is). The committed folder is also a plain DCP
checkpoint: ``dcp.FileSystemReader`` reads it on a local store (without the checks).

Importing this module imports torch; importing ``commitstore`` does not.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import pickle
import uuid
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from commitstore import FolderWrite
from commitstore.errors import (
    CommitError,
    CommitStoreError,
    ConfigurationError,
    IntegrityError,
    NotFoundError,
)
from commitstore.layout import validate_name
from commitstore.options import check_commit_args
from commitstore.records import FileRecord, Record
from commitstore.store import CommitStore

__all__ = ["StorageReader", "StorageWriter", "load", "save"]

METADATA_FILE = ".metadata"
"""The DCP metadata file of a committed folder (as ``dcp.FileSystemWriter`` names it)."""

log = logging.getLogger("commitstore")


@dataclasses.dataclass(frozen=True)
class _PlanData:
    """What the coordinator puts into each rank's plan: the folder token and the file prefix."""

    token: str
    prefix: str


@dataclasses.dataclass
class ShardResult:
    """``WriteResult.storage_data`` on its way to ``finish``: where the item is (torch's own
    storage info, which goes into ``.metadata``) and the record of the shard file it is in."""

    info: Any
    file: FileRecord | None = None


def _check_store(store: object) -> CommitStore:
    if not isinstance(store, CommitStore):
        raise ConfigurationError(f"store must be a CommitStore, not {type(store).__name__}")
    return store


class StorageWriter(dcp.StorageWriter):  # type: ignore[misc]
    """A ``torch.distributed.checkpoint`` writer for every rank; one committed folder per save.

    ``name``, ``step`` and ``metadata`` are checked before any I/O (InvalidNameError,
    ConfigurationError); ``dcp.save(checkpoint_id=...)`` names the artifact instead. After a save
    the coordinator's :attr:`record` is the committed record.
    """

    def __init__(
        self,
        store: CommitStore,
        name: str,
        *,
        step: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        super().__init__()
        self.store = _check_store(store)
        check_commit_args(name, step, metadata)
        self.name = name
        self.step = step
        self.metadata = dict(metadata or {})
        self.overwrite = overwrite
        self.record: Record | None = None
        """The committed record, on the coordinator after ``finish``."""
        self.is_coordinator = False
        self.rank = 0
        self.save_id = uuid.uuid4().hex
        self._folder: FolderWrite | None = None

    def __getstate__(self) -> dict[str, Any]:
        """For ``dcp.async_save(..., async_checkpointer_type=PROCESS)``, which pickles the writer
        into torch's checkpoint process: the store travels as a pickled
        :class:`~commitstore.CommitStore` (its backend, or the URL and options it was opened
        from; automatic retention still runs after the commit).

        Raises:
            ConfigurationError: the store has mirrors (the other process could not replicate
                through this store's mirror queues: use the THREAD checkpointer, or
                ``store.sync()`` afterwards), or its backend cannot be pickled and was not
                opened from a URL whose options can be.
        """
        store = self.store
        if store.mirrors:
            raise ConfigurationError(
                f"{store.url}: a StorageWriter whose store has mirrors cannot go to another "
                "process (AsyncCheckpointerType.PROCESS); use THREAD, or store.sync() after"
            )
        state = dict(self.__dict__)
        state["_folder"] = None  # each process joins the folder by its token
        return state

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            name = str(checkpoint_id)
            check_commit_args(name, self.step, self.metadata)
            self.name = name
        self.save_id = uuid.uuid4().hex
        self.record = None
        self._folder = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank") or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """On the coordinator: begin the folder commit; every plan carries its token."""
        self._folder = self.store.begin_folder(
            self.name, step=self.step, metadata=self.metadata, overwrite=self.overwrite
        )
        token = self._folder.token
        return [
            dataclasses.replace(p, storage_data=_PlanData(token, f"__{i}_"))
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's shard file into the staging area (hashed on the way)."""
        data = plan.storage_data
        if not isinstance(data, _PlanData):
            raise ConfigurationError("the save plan carries no folder token (not planned here)")
        folder = self._folder
        if folder is None or folder.token != data.token:
            folder = self.store.join_folder(data.token)
        results: list[WriteResult] = []
        if plan.items:
            rel = f"{data.prefix}0{DEFAULT_SUFFIX}"
            items = [i for i in plan.items if i.type == WriteItemType.BYTE_IO]
            items += [i for i in plan.items if i.type != WriteItemType.BYTE_IO]
            with folder.open_file(rel) as f:
                for item in items:
                    offset = f.tell()
                    obj = planner.resolve_data(item)
                    if item.type == WriteItemType.BYTE_IO:
                        f.write(obj.getbuffer())
                    else:
                        tensor = obj.detach().cpu()
                        if tensor.untyped_storage().size() != tensor.nbytes:
                            tensor = tensor.clone()  # a view: store only its own bytes
                        torch.save(tensor, f)
                    length = f.tell() - offset
                    results.append(
                        WriteResult(
                            index=item.index,
                            size_in_bytes=length,
                            storage_data=ShardResult(_StorageInfo(rel, offset, length)),
                        )
                    )
            for r in results:
                r.storage_data.file = f.record
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator: check every shard, write ``.metadata``, commit the folder."""
        folder = self._folder
        if folder is None:
            raise ConfigurationError("finish() on a writer that did not plan this save")
        try:
            files: dict[str, FileRecord] = {}
            storage: dict[Any, Any] = {}
            for rank_results in results:
                for wr in rank_results:
                    sd = wr.storage_data
                    if not isinstance(sd, ShardResult) or sd.file is None:
                        raise CommitError(f"{self.name}: a write result carries no shard record")
                    storage[wr.index] = sd.info
                    files[sd.file.path] = sd.file
            metadata.storage_data = storage
            metadata.storage_meta = self.storage_meta()
            meta = folder.write_bytes(METADATA_FILE, pickle.dumps(metadata))
            self.record = folder.commit([*files.values(), meta])
        except BaseException:
            folder.abort()
            raise

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.name, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # never picked for a path by dcp; pass it as storage_writer


def _is_dcp(record: Record) -> bool:
    return record.kind == "dir" and any(f.path == METADATA_FILE for f in record.files)


class StorageReader(dcp.StorageReader):  # type: ignore[misc]
    """Reads a committed DCP folder; ``name=None``: the newest DCP folder that verifies fully
    (found once per reader: pass a name in multi-rank loads so every rank reads the same step).

    Raises (from ``read_metadata`` / ``read_data``): NotFoundError (no such folder), IntegrityError
    (a file fails its record), ConfigurationError (not a DCP folder)."""

    def __init__(self, store: CommitStore, name: str | None = None) -> None:
        super().__init__()
        self.store = _check_store(store)
        if name is not None:
            validate_name(name)
        self.name = name
        self.record: Record | None = None
        """The record read, after ``read_metadata``."""
        self.load_id = uuid.uuid4().hex
        self.storage_data: dict[Any, Any] = {}
        self.failure: CommitStoreError | None = None
        """The commitstore error of the last ``read_metadata`` that failed."""

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            self.name = str(checkpoint_id)
            validate_name(self.name)
            self.record = None
        self.load_id = uuid.uuid4().hex

    def _resolve(self) -> Record:
        if self.record is not None:
            return self.record
        if self.name is not None:
            # the version the folder verifies as (a save whose record was not written yet is
            # the new version, as every reader serves it), its files' sizes checked
            rec = self.store.record(self.name, level="size")
            if not _is_dcp(rec):
                raise ConfigurationError(f"{self.name} is not a DCP folder (no {METADATA_FILE})")
        else:
            # newest first by the version each name holds; a DCP folder is then checked in full
            # and read as the version it verifies as (a save whose record was not written yet)
            for cand in self.store.newest(level="size"):
                if not _is_dcp(cand):
                    continue
                try:
                    rec = self.store.record(cand.name, level="full")
                except IntegrityError as exc:
                    log.warning("skipping %s: %s", cand.name, exc)
                    continue
                if _is_dcp(rec):
                    break
            else:
                raise NotFoundError(f"{self.store.url}: no DCP folder verifies")
        self.record = rec
        return rec

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        try:
            rec = self._resolve()
            md = pickle.loads(self.store.read_member(rec, METADATA_FILE))
        except CommitStoreError as exc:
            self.failure = exc  # dcp.load reports only its text: load() raises it as is
            raise
        if not isinstance(md, Metadata):
            raise IntegrityError(
                f"{rec.name}/{METADATA_FILE}: not DCP metadata", name=rec.name, status="bad_record"
            )
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.storage_data = dict(metadata.storage_data or {})

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Each needed shard file is read once and checked in full before any item of it."""
        rec = self._resolve()
        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for rel, reqs in per_file.items():
            data = memoryview(self.store.read_member(rec, rel))
            for req in reqs:
                info = self.storage_data[req.storage_index]
                if getattr(info, "transform_descriptors", None):
                    raise ConfigurationError(f"{rec.name}/{rel}: stream transforms unsupported")
                if info.offset < 0 or info.offset + info.length > len(data):
                    raise IntegrityError(
                        f"{rec.name}/{rel}: an item lies outside the file",
                        name=rec.name,
                        status="size_mismatch",
                    )
                chunk = io.BytesIO(data[info.offset : info.offset + info.length])
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, chunk)
                    continue
                tensor = torch.load(chunk, map_location="cpu", weights_only=True)
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise IntegrityError(
                        f"{rec.name}/{rel}: item {req.storage_index} has shape "
                        f"{tuple(tensor.size())}, {tuple(target.size())} expected",
                        name=rec.name,
                        status="hash_mismatch",
                    )
                target.copy_(tensor)
                planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


def _unwrapped(exc: CheckpointException, seen: CommitStoreError | None = None) -> BaseException:
    """The first rank's commitstore error inside torch's CheckpointException (or ``seen``, one
    that dcp reported only as text), else ``exc``."""
    for _rank, (err, _trace) in sorted(exc.failures.items()):
        if isinstance(err, CommitStoreError):
            return err
    return seen if seen is not None else exc


def save(
    state_dict: dict[str, Any],
    store: CommitStore,
    name: str,
    *,
    step: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    **kw: Any,
) -> Record | None:
    """``dcp.save`` with a :class:`StorageWriter` (every rank calls it); the committed record on
    the coordinator, None elsewhere. A rank's commitstore error is raised as itself (chained
    from torch's CheckpointException); ``kw`` goes to ``dcp.save`` (planner, process_group)."""
    writer = StorageWriter(store, name, step=step, metadata=metadata, overwrite=overwrite)
    try:
        dcp.save(state_dict, storage_writer=writer, **kw)
    except CheckpointException as exc:
        raise _unwrapped(exc) from exc
    return writer.record


def load(
    state_dict: dict[str, Any], store: CommitStore, name: str | None = None, **kw: Any
) -> Record:
    """``dcp.load`` in place with a :class:`StorageReader`; the record that was read. A shard
    that fails its record raises IntegrityError (chained from torch's CheckpointException)."""
    reader = StorageReader(store, name)
    try:
        dcp.load(state_dict, storage_reader=reader, **kw)
    except CheckpointException as exc:
        raise _unwrapped(exc, reader.failure) from exc
    assert reader.record is not None
    return reader.record
