"""A PyTorch Lightning ``CheckpointIO`` that commits every checkpoint (the ``lightning`` extra).

``Trainer(plugins=[CommitStoreCheckpointIO(store)], callbacks=[ModelCheckpoint(dirpath=...)])``
with ``dirpath`` under the store's root. Lightning hands the plugin absolute paths; a path under
the store's root (for a local store its folder, for any store its URL) maps to the artifact name
relative to it; any other path is refused with InvalidNameError before any I/O.

- ``save_checkpoint`` commits the checkpoint (``commitstore.torch.save``), with
  ``overwrite=True`` (Lightning overwrites), the checkpoint's ``global_step`` as the explicit
  step and ``{"epoch", "global_step"}`` as metadata. Names such as ``last.ckpt`` and
  ``last-v1.ckpt`` (``ModelCheckpoint(save_last=True)``) are committed as aliases: never pruned,
  not counted by ``keep_last``. A crash mid-save leaves the previous version whole.
- ``load_checkpoint`` reads the checkpoint's bytes once and hands ``torch.load`` only verified
  bytes (``IntegrityError`` otherwise).
- ``remove_checkpoint`` deletes the artifact, record first (``save_top_k`` keeps working).

``asynchronous=True``: ``save_checkpoint`` returns once the checkpoint is snapshotted
(every tensor cloned, accelerator tensors copied to host memory, as Lightning's
``AsyncCheckpointIO`` does; the rest deep-copied); the commit runs on the store's worker
thread, in submission order, at most
``open_store(..., async_inflight=N)`` snapshots at once. ``remove_checkpoint`` of an old
checkpoint is deferred until every save submitted before it landed, and is skipped (the old
checkpoint kept, a warning logged) if one of them failed: ``save_top_k`` and ``save_last`` never
leave fewer whole checkpoints than before a save. ``load_checkpoint`` first waits for pending
saves. ``teardown`` (the end of ``fit``) waits for every pending save and deferred removal and
raises the first save failure not yet raised; a save failure is also raised by the next
``save_checkpoint``. A process killed during a background write leaves the previous version of
the name whole.

Lightning's ``ModelCheckpoint`` lists and tests the folder with fsspec (``ckpt_path="last"``
finds ``last*.ckpt``); on a local store committed artifacts are plain files at their names, and
staging files (``.commitstore.tmp.*``) never match its patterns.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import re
import threading
from typing import Any

from commitstore.errors import missing_extra

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.pytorch.callbacks import Callback
except ModuleNotFoundError as _exc:
    raise missing_extra("lightning", "lightning", _exc) from _exc

from commitstore import torch as cs_torch
from commitstore.errors import ConfigurationError, InvalidNameError, NotFoundError
from commitstore.layout import validate_name
from commitstore.records import Record
from commitstore.store import CommitStore

__all__ = ["LAST_PATTERN", "CommitStoreCheckpointIO"]

log = logging.getLogger("commitstore")

LAST_PATTERN = re.compile(r"^last(-v\d+)?\.ckpt$")
"""The file names ``ModelCheckpoint(save_last=True)`` writes (``last.ckpt``, ``last-v1.ckpt``):
committed as aliases."""


class CommitStoreCheckpointIO(CheckpointIO):  # type: ignore[misc]  # lightning: untyped for mypy
    """Lightning ``CheckpointIO`` over a :class:`~commitstore.CommitStore` (module docstring).

    ``asynchronous``: commit in the background (module docstring). ``alias``: the file-name
    pattern of moving names committed as aliases (default :data:`LAST_PATTERN`).

    Raises:
        ConfigurationError: ``store`` is not a CommitStore, ``asynchronous`` not a bool.
    """

    def __init__(
        self,
        store: CommitStore,
        *,
        asynchronous: bool = False,
        alias: re.Pattern[str] | None = None,
    ) -> None:
        if not isinstance(store, CommitStore):
            raise ConfigurationError(
                f"store must be a CommitStore (open_store(...)), not {store!r}"
            )
        self.store = store
        if not isinstance(asynchronous, bool):
            raise ConfigurationError(f"asynchronous must be True or False, not {asynchronous!r}")
        self.asynchronous = asynchronous
        self._lock = threading.Lock()
        self._saves: list[concurrent.futures.Future[Record]] = []
        """Background saves not yet waited for by :meth:`teardown`, in submission order."""
        self._removals: list[concurrent.futures.Future[None]] = []
        """Deferred removals, done once they ran (or were skipped)."""
        self.alias = LAST_PATTERN if alias is None else alias
        self._prefixes = [store.url.rstrip("/") + "/"]
        local_root = store.local_path()
        if local_root is not None:
            root = str(local_root).rstrip(os.sep) + os.sep
            self._prefixes += [root, os.path.realpath(root).rstrip(os.sep) + os.sep]

    def __repr__(self) -> str:
        mode = ", asynchronous=True" if self.asynchronous else ""
        return f"CommitStoreCheckpointIO({self.store.url!r}{mode})"

    def name_of(self, path: Any) -> str:
        """The artifact name of ``path`` (absolute, under the store's root).

        Raises:
            InvalidNameError: ``path`` is not under the root, or maps to an invalid name.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidNameError(f"checkpoint path must be a str or path, not {path!r}")
        text = os.fspath(path)
        if not isinstance(text, str):
            raise InvalidNameError(f"checkpoint path must be text, not {text!r}")
        cand = os.path.normpath(text) if "://" not in text and os.path.isabs(text) else text
        for prefix in self._prefixes:
            if cand.startswith(prefix):
                name = cand[len(prefix) :]
                validate_name(name)
                return name
        raise InvalidNameError(
            f"{text!r} is not under the store's root ({self.store.url}); give ModelCheckpoint "
            "a dirpath inside it"
        )

    def check_dirpath(self, dirpath: Any) -> None:
        """Raise InvalidNameError now if checkpoints under ``dirpath`` would not map to names
        in the store (a ``ModelCheckpoint`` whose folder is outside the root), before any I/O."""
        text = os.fspath(dirpath)
        sep = "/" if "://" in text else os.sep
        self.name_of(text.rstrip(sep) + sep + "epoch=0-step=0.ckpt")

    def setup_check(self) -> Callback:
        """A Lightning callback (``Trainer(callbacks=[io.setup_check(), ...])``) that checks
        every ``ModelCheckpoint``'s folder with :meth:`check_dirpath` when fitting starts, after
        the callbacks resolved their folders and before the first step: a folder outside the
        store fails there, not at the first save after training ran."""
        return _DirpathCheck(self)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Commit ``checkpoint`` as the artifact at ``path`` (replacing a previous version);
        with ``asynchronous=True``, return once it is snapshotted (module docstring)."""
        name = self.name_of(path)
        if storage_options is not None:
            raise ConfigurationError(
                "CommitStoreCheckpointIO takes no storage_options (configure open_store instead)"
            )
        step = checkpoint.get("global_step")
        step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
        epoch = checkpoint.get("epoch")
        meta = {"global_step": step, "epoch": epoch if isinstance(epoch, int) else None}
        alias = bool(self.alias.match(name.rsplit("/", 1)[-1]))
        if not self.asynchronous:
            cs_torch.save(
                checkpoint, self.store, name, step=step, metadata=meta, overwrite=True, alias=alias
            )
            return

        future = cs_torch.save_async(
            checkpoint, self.store, name, step=step, metadata=meta, overwrite=True, alias=alias
        )
        with self._lock:
            self._saves = [f for f in self._saves if not f.done() or _peek(f) is not None]
            self._saves.append(future)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint at ``path``, from bytes that matched its record (read once); with
        ``asynchronous=True``, after pending saves landed."""
        name = self.name_of(path)
        if self.asynchronous:
            self.wait()
        loaded = cs_torch.load(
            self.store,
            name,
            map_location=map_location,
            weights_only=True if weights_only is None else weights_only,
        )
        if not isinstance(loaded, dict):
            raise ConfigurationError(f"{name} is not a Lightning checkpoint (not a dict)")
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the artifact at ``path`` (record first); nothing there is not an error.

        With ``asynchronous=True`` the deletion waits (off the caller's thread) until every save
        submitted before it landed, and is skipped, keeping the old checkpoint, if one failed."""
        name = self.name_of(path)
        if self.asynchronous:
            with self._lock:
                pending = [f for f in self._saves if not f.done()]
                before = list(self._saves)
            if pending:
                done: concurrent.futures.Future[None] = concurrent.futures.Future()
                with self._lock:
                    self._removals.append(done)
                # commits land in order: once the newest one ended, every earlier one had
                pending[-1].add_done_callback(lambda _f: self._remove_after(name, before, done))
                return
            if any(_peek(f) is not None for f in before):
                self._skip(name)
                return
        with contextlib.suppress(NotFoundError):
            self.store.delete(name)

    def _remove_after(
        self,
        name: str,
        before: list[concurrent.futures.Future[Record]],
        done: concurrent.futures.Future[None],
    ) -> None:
        """On the worker thread, once the saves ``before`` ended: delete ``name`` if all of them
        landed, else keep it. Never raises (a failure is logged)."""
        try:
            if any(_peek(f) is not None for f in before):
                self._skip(name)
            else:
                with contextlib.suppress(NotFoundError):
                    self.store.delete(name)
        except Exception as exc:  # the checkpoint stays: more kept, nothing lost
            log.warning("removing %s after the new checkpoint landed failed: %s", name, exc)
        finally:
            done.set_result(None)

    def _skip(self, name: str) -> None:
        log.warning(
            "%s kept: a checkpoint saved before its removal did not land (the error is raised "
            "by the next save or by teardown)",
            name,
        )

    def wait(self) -> None:
        """Wait for every background save and deferred removal of this plugin; raise the first
        save failure not raised yet (the next ``save_checkpoint`` would have raised it)."""
        with self._lock:
            saves, self._saves = self._saves, []
        first: BaseException | None = None
        for fut in saves:
            exc = _unobserved_failure(fut)
            if exc is not None and first is None:
                first = exc
        with self._lock:
            removals, self._removals = self._removals, []
        for removal in removals:
            removal.result()
        if first is not None:
            raise first

    def teardown(self) -> None:
        """The end of ``fit``/``validate``: :meth:`wait` (with ``asynchronous=True``)."""
        if self.asynchronous:
            self.wait()


def _peek(future: concurrent.futures.Future[Record]) -> BaseException | None:
    """The exception of the ended ``future``, without counting as the caller observing it (an
    unobserved failure is still raised by the next save)."""
    return concurrent.futures.Future.exception(future, 0)


def _unobserved_failure(future: concurrent.futures.Future[Record]) -> BaseException | None:
    """Wait for ``future``; its exception if the caller has not seen it yet (then it has)."""
    seen = bool(getattr(future, "observed", False))
    exc = future.exception()
    return None if seen else exc


class _DirpathCheck(Callback):  # type: ignore[misc]  # lightning: untyped for mypy
    """:meth:`CommitStoreCheckpointIO.setup_check`: every checkpoint callback's folder is
    checked at ``on_fit_start``."""

    def __init__(self, io: CommitStoreCheckpointIO) -> None:
        self.io = io

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        for callback in trainer.checkpoint_callbacks:
            dirpath = getattr(callback, "dirpath", None)
            if dirpath is not None:
                self.io.check_dirpath(dirpath)
