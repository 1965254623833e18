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

Lightning's ``ModelCheckpoint`` lists and tests the folder with fsspec (``ckpt_path="last"``
finds ``last*.ckpt``); on a local store committed artifacts are plain files at their names, and
staging files (``.commitstore.tmp.*``) never match its patterns.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

from commitstore._extras import missing_extra

try:
    import torch  # noqa: F401
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.pytorch.callbacks import Callback
except ModuleNotFoundError as _exc:
    raise missing_extra("lightning", "lightning", _exc) from _exc

from commitstore import torch as cs_torch
from commitstore.backends.rename.posix import LocalBackend
from commitstore.errors import ConfigurationError, InvalidNameError, NotFoundError
from commitstore.layout import validate_name
from commitstore.store import CommitStore

__all__ = ["LAST_PATTERN", "CommitStoreCheckpointIO"]

LAST_PATTERN = re.compile(r"^last(-v\d+)?\.ckpt$")
"""The file names ``ModelCheckpoint(save_last=True)`` writes (``last.ckpt``, ``last-v1.ckpt``):
committed as aliases."""


class CommitStoreCheckpointIO(CheckpointIO):  # type: ignore[misc]  # lightning: untyped for mypy
    """Lightning ``CheckpointIO`` over a :class:`~commitstore.CommitStore` (module docstring).

    ``alias``: the file-name pattern of moving names committed as aliases (default
    :data:`LAST_PATTERN`).
    """

    def __init__(self, store: CommitStore, *, alias: re.Pattern[str] | None = None) -> None:
        if not isinstance(store, CommitStore):
            raise ConfigurationError(
                f"store must be a CommitStore (open_store(...)), not {store!r}"
            )
        self.store = store
        self.alias = LAST_PATTERN if alias is None else alias
        self._prefixes = [store.url.rstrip("/") + "/"]
        if isinstance(store.backend, LocalBackend):
            root = store.backend.root.rstrip(os.sep) + os.sep
            self._prefixes += [root, os.path.realpath(root).rstrip(os.sep) + os.sep]

    def __repr__(self) -> str:
        return f"CommitStoreCheckpointIO({self.store.url!r})"

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
        """Commit ``checkpoint`` as the artifact at ``path`` (replacing a previous version)."""
        name = self.name_of(path)
        if storage_options is not None:
            raise ConfigurationError(
                "CommitStoreCheckpointIO takes no storage_options (configure open_store instead)"
            )
        step = checkpoint.get("global_step")
        step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
        epoch = checkpoint.get("epoch")
        meta = {"global_step": step, "epoch": epoch if isinstance(epoch, int) else None}
        cs_torch.save(
            checkpoint,
            self.store,
            name,
            step=step,
            metadata=meta,
            overwrite=True,
            alias=bool(self.alias.match(name.rsplit("/", 1)[-1])),
        )

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint at ``path``, from bytes that matched its record (read once)."""
        name = self.name_of(path)
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
        """Delete the artifact at ``path`` (record first); nothing there is not an error."""
        name = self.name_of(path)
        with contextlib.suppress(NotFoundError):
            self.store.delete(name)


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
