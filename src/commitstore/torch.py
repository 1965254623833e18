"""``torch.save`` into one commit and verified ``torch.load`` (the ``torch`` extra).

``import commitstore`` never imports this module (nor torch); ``import commitstore.torch`` does.

- :func:`save` streams ``torch.save`` into a staged write: the artifact appears whole under its
  name (with its record) or not at all.
- :func:`load` reads the artifact's bytes once, hashed on the way, and hands ``torch.load`` only
  bytes that matched the record. ``name=None`` walks the committed artifacts newest first
  (``store.newest(level="size")``: by the version each name holds, so a name whose commit stopped
  after its data step ranks by its new step; each is then read once, hashed) and loads the first
  that verifies, skipping bad ones with a warning. ``mmap=True`` maps a verified local copy made by
  ``store.fetch`` (cached by digest: a second resume of the same version reads none of the
  artifact's bytes).
"""

from __future__ import annotations

import concurrent.futures
import io
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from commitstore.errors import missing_extra

try:
    import torch
except ModuleNotFoundError as _exc:
    raise missing_extra("torch", "torch", _exc) from _exc

from commitstore._snapshot import BufferPool, Buffers, snapshot
from commitstore.errors import (
    CommitStoreError,
    ConfigurationError,
    IntegrityError,
    NotFoundError,
    TorchLoadError,
)
from commitstore.layout import validate_name
from commitstore.options import check_cache_dir, check_flag
from commitstore.records import Record
from commitstore.store import CommitStore

__all__ = ["TorchLoadError", "load", "load_with_record", "save", "save_async"]

log = logging.getLogger("commitstore")


def save(
    obj: object,
    store: CommitStore,
    name: str,
    *,
    step: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    alias: bool = False,
) -> Record:
    """``torch.save(obj, ...)`` into one commit of ``name``; returns its record.

    Same protocol and checks as ``store.stage`` (names, ``step``, ``metadata``, ``overwrite``,
    ``alias`` checked before any I/O). An exception while pickling publishes nothing.

    Raises:
        CommitStoreError: the store's errors; a failure of ``torch.save`` itself (an object that
            cannot be pickled) as a ConfigurationError chained to torch's exception.
    """
    _check_store(store)
    with store.stage(name, step=step, metadata=metadata, overwrite=overwrite, alias=alias) as st:
        _torch_save(name, obj, st)
    assert st.record is not None
    return st.record


def save_async(
    obj: object,
    store: CommitStore,
    name: str,
    *,
    step: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    alias: bool = False,
) -> concurrent.futures.Future[Record]:
    """:func:`save` in the background: returns once ``obj`` is snapshotted, with a future of
    the record.

    The snapshot is a copy that shares no tensor memory with ``obj`` (accelerator tensors are
    copied to host memory), so changing ``obj``'s tensors after the call returns does not change
    what is committed. Its tensors go into buffers reused from the previous snapshot of the
    same shapes (kept per store, at most ``async_inflight`` sets, freed with the store), so a
    save after the first costs one memory copy of the state. Then ``torch.save`` of the
    snapshot streams into one commit of ``name`` on the store's worker thread, through the
    same versioned commit as :func:`save`.
    Guarantees (``CommitStore.commit_async``): commits land in submission order; at most
    ``open_store(..., async_inflight=N)`` snapshots exist at once (default 1: a call made while
    the previous commit still runs waits for it before taking its snapshot); ``list``/``latest``
    never show an in-flight commit; mirrors and automatic retention act only after it landed; a
    failure is raised by the future and, until observed, by the next ``save_async``,
    ``store.flush()`` or ``store.close()``; at interpreter exit pending commits finish within
    ``COMMITSTORE_EXIT_FLUSH_SECONDS``, and a warning names any that did not.

    Raises:
        InvalidNameError, ConfigurationError: bad arguments (before the snapshot and any I/O);
            an object that cannot be copied.
        CommitStoreError: an earlier asynchronous commit's unobserved failure.
    """
    _check_store(store)
    with _pools_lock:
        pool = _pools.setdefault(store, BufferPool())

    def take() -> tuple[object, Buffers]:
        buffers = pool.take()
        try:
            return snapshot(obj, buffers), buffers
        except Exception as exc:
            pool.give(buffers)
            raise ConfigurationError(f"{name}: the object cannot be snapshotted: {exc}") from exc

    def write(snap: tuple[object, Buffers], f: Any) -> None:
        try:
            _torch_save(name, snap[0], f)
        finally:
            pool.give(snap[1])  # written (or failed): its buffers serve a later snapshot

    return store.commit_async(
        name,
        take,
        write,
        step=step,
        metadata=metadata,
        overwrite=overwrite,
        alias=alias,
    )


_pools: weakref.WeakKeyDictionary[CommitStore, BufferPool] = weakref.WeakKeyDictionary()
"""Per store: the snapshot buffers of ``save_async`` kept for reuse (at most ``async_inflight``
sets, each one state's size), freed with the store."""
_pools_lock = threading.Lock()


def _torch_save(name: str, obj: object, f: Any) -> None:
    """``torch.save(obj, f)``; a failure of torch's own a ConfigurationError."""
    try:
        torch.save(obj, f)
    except CommitStoreError:
        raise
    except Exception as exc:
        raise ConfigurationError(f"{name}: torch.save failed: {exc}") from exc


def load(
    store: CommitStore,
    name: str | None = None,
    *,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Any:
    """``torch.load`` of ``name`` (None: the newest artifact that verifies and loads), reading its
    bytes once; only bytes that matched the record reach ``torch.load``.

    ``mmap=True`` maps a verified local copy (``store.fetch(name, cache_dir)``), cached by
    digest. Arguments are checked before any I/O.

    Raises:
        InvalidNameError, ConfigurationError: bad arguments. NotFoundError: ``name`` is not
            committed, or (``name=None``) nothing verifies and loads. IntegrityError: ``name``'s
            bytes fail their record. TorchLoadError (a CommitStoreError): ``torch.load`` refused
            verified bytes (chained to torch's exception).
    """
    return load_with_record(
        store,
        name,
        map_location=map_location,
        weights_only=weights_only,
        mmap=mmap,
        cache_dir=cache_dir,
    )[0]


def load_with_record(
    store: CommitStore,
    name: str | None = None,
    *,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[Any, Record]:
    """:func:`load`, and the record of the artifact that was loaded (which one ``name=None``
    picked: its ``name`` and ``step``)."""
    _check_store(store)
    if name is not None:
        validate_name(name)
    check_flag(weights_only, "weights_only")
    check_flag(mmap, "mmap")
    folder = check_cache_dir(cache_dir) if mmap else None
    if name is not None:
        return _load_one(store, name, map_location, weights_only, folder)
    for rec in store.newest(level="size"):
        if rec.kind != "file":
            continue
        try:
            return _load_one(store, rec.name, map_location, weights_only, folder)
        except (IntegrityError, NotFoundError, TorchLoadError) as exc:
            log.warning("torch.load: skipping %s: %s", rec.name, exc)
    raise NotFoundError(f"{store.url}: no committed artifact verifies and loads with torch.load")


def _load_one(
    store: CommitStore,
    name: str,
    map_location: Any,
    weights_only: bool,
    folder: Path | None,
) -> tuple[Any, Record]:
    """One verified read of ``name`` (its record, then its bytes once), then ``torch.load``.
    A folder artifact is a ConfigurationError (from the readers)."""
    source: Any
    if folder is not None:
        path, got = store.fetch_with_record(name, folder)
        source = str(path)
    else:
        data, got = store.read_with_record(name, verify="full")
        source = io.BytesIO(data)
    try:
        obj = torch.load(
            source, map_location=map_location, weights_only=weights_only, mmap=folder is not None
        )
    except Exception as exc:
        raise TorchLoadError(f"{name}: torch.load failed: {exc}") from exc
    return obj, got


def _check_store(store: object) -> None:
    if not isinstance(store, CommitStore):
        raise ConfigurationError(f"store must be a CommitStore (open_store(...)), not {store!r}")
