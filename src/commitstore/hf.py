"""Hugging Face ``Trainer`` checkpoints as committed folder artifacts.

:class:`CommitStoreCallback` commits each ``checkpoint-N`` folder after the Trainer wrote it (in
``on_save``, on the main process only). Where the store is a local folder on the same filesystem
as ``output_dir``, the folder is moved into the store's staging area with one rename and
committed there (its files are hashed once, never copied); elsewhere its files are copied through
``stage_dir`` and the local folder is removed after the commit (``keep_local=True`` keeps it).

``save_total_limit`` is taken over: read at ``on_init_end`` (the caller's arguments are left as
they are, so a second ``Trainer`` built from them rotates as asked). The Trainer's own rotation
only ever sees ``output_dir``, which keeps no committed folder, unless ``output_dir`` is the
store's root or inside it: then it is switched off while the Trainer trains
(``args.save_total_limit`` is None from ``on_train_begin`` to ``on_train_end``, then the
caller's value is back), so it never deletes a committed folder behind the store's back. After
each commit the store is pruned with
``keep_last=save_total_limit`` over this callback's checkpoint folders only (other artifacts in
the store, and the best checkpoint, are kept; prune's own rules still apply: the newest folder
that verifies is never deleted).

:func:`latest_checkpoint` returns the newest ``checkpoint-N`` folder that verifies fully, for
``trainer.train(resume_from_checkpoint=latest_checkpoint(store))`` (None on a first run: training
starts from scratch). ``resume_from_checkpoint=True`` looks in ``output_dir``, which keeps no
checkpoint folder once they are committed: pass ``latest_checkpoint(store)`` instead.

**Nothing waits on the training thread** (``asynchronous=True``, the default): ``on_save`` only
takes the folder out of the Trainer's hands with one rename, to a hidden sibling in
``output_dir`` (``.commitstore-pending.checkpoint-N.<hex>``: the Trainer's rotation and
``get_last_checkpoint`` match ``checkpoint-*`` only, so neither sees, nor deletes, nor writes into
it); where ``output_dir`` is inside a local store the folder stays at its own path (the Trainer's
rotation is off there). The folder is then immutable, and the commit (hashing every file),
mirror replication, the store's automatic retention and the ``save_total_limit`` prune run on
the store's worker thread (``CommitStore.commit_async``'s engine: submission order, at most
``open_store(..., async_inflight=N)`` checkpoints in flight; a save made while N are in flight
waits for a slot). A failed commit leaves the folder back at ``output_dir/checkpoint-N`` (when
that name is free) and is raised by the next ``on_save`` or by ``on_train_end``, which waits for
every pending commit. A process killed in between leaves the hidden folder in ``output_dir``
(never deleted by commitstore) and the previous committed checkpoints whole.
``asynchronous=False`` commits and prunes in ``on_save``, as before.

Importing this module imports transformers; importing ``commitstore`` does not.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from commitstore.errors import missing_extra

try:
    import accelerate  # noqa: F401  # the Trainer needs it; fail here with the pip hint
    import torch  # noqa: F401
    from transformers import TrainerCallback
except ModuleNotFoundError as _exc:
    raise missing_extra("hf", "hf", _exc) from _exc

from commitstore.backends import Pinned, below, check_folder, opened_below, pin, scan
from commitstore.errors import CommitStoreError, ConfigurationError, NotFoundError
from commitstore.layout import validate_name
from commitstore.records import Record
from commitstore.store import CommitStore

__all__ = ["CommitStoreCallback", "commit_folder", "latest_checkpoint"]

log = logging.getLogger("commitstore")

_HIDDEN = re.compile(r"\.commitstore-pending\.(checkpoint-(\d+))\.[0-9a-f]+")
"""A folder ``on_save`` set aside (``_set_aside``)."""
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def _check_store(store: object) -> CommitStore:
    if not isinstance(store, CommitStore):
        raise ConfigurationError(f"store must be a CommitStore, not {type(store).__name__}")
    return store


def _store_path(store: CommitStore, name: str) -> Path | None:
    return store.local_path(name)


def _inside(store: CommitStore, src: Path) -> bool:
    """Whether the entry ``src`` names (its folder's symlinks resolved, not its own) lies
    inside the store's own (local) folder, judged by the identity of the folders above it
    (a bind mount of the store, or of a folder in it, is inside)."""
    return _place(store, src.absolute().parent.resolve() / src.name) not in (None, ())


def _place(store: CommitStore, where: Path) -> tuple[str, ...] | None:
    """The parts of ``where`` below the store's own (local) folder, by the identity of the
    folders (``()``: the root itself, through any path); None when it is not inside it."""
    root = store.local_path()
    if root is None:
        return None
    try:
        return below(os.stat(root), os.fspath(where))
    except OSError:
        return None


def commit_folder(
    store: CommitStore,
    src: str | Path,
    name: str,
    *,
    step: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    keep_local: bool = False,
) -> Record:
    """Commit the local folder ``src`` as the folder artifact ``name``.

    Same filesystem as a local store: ``src`` is renamed into the staging area and committed
    (no copy; ``src`` is gone afterwards). A ``src`` that already is the artifact's own path
    (the Trainer writing straight into the store's root) is committed in place: renamed into
    the staging area and back when nothing is committed under the name, copied (the folder
    left where it is) when the Trainer wrote into a committed one again. Another folder inside
    the store is adopted only when it is no artifact and holds none (``FolderWrite.adopt``:
    NameConflictError otherwise, nothing moved). Elsewhere the files are copied through
    ``stage_dir`` (``src`` listed first without following links: a symbolic link, a special
    file, an entry named like the store's own or a mount point of the store's file system in
    it is refused before anything is copied, ``_movein.scan``), and after the commit the files
    copied are removed from ``src``, each only while it is still the file copied, then the
    folders left empty, unless ``keep_local`` (never when committed in place): a file another
    writer put in ``src`` meanwhile stays. A failure publishes nothing and leaves ``src``
    where it was.

    Raises:
        ConfigurationError: ``src`` is no folder, or holds a symbolic link or a special file.
        NameConflictError: ``src`` is, holds or lies in a committed artifact or the store's own
            entries, or holds a mount point of the store's file system; nothing is moved.
    """
    src = check_folder(src)
    pinned = pin(src)  # the folder judged is the folder taken, wherever src's links point later
    try:
        return _commit_pinned(
            store,
            pinned,
            name,
            step=step,
            metadata=metadata,
            overwrite=overwrite,
            keep_local=keep_local,
        )
    finally:
        pinned.close()


def _commit_pinned(
    store: CommitStore,
    pinned: Pinned,
    name: str,
    *,
    step: int | None,
    metadata: Mapping[str, Any] | None,
    overwrite: bool,
    keep_local: bool,
) -> Record:
    """:func:`commit_folder` of the folder ``pinned``: moved in or adopted (their checks judge
    ``src``'s path, which must still name the pinned folder), else copied through the pinned
    parent and its copied files removed without following a link on the way."""
    src = pinned.src
    own = _store_path(store, name)
    in_place = own is not None and own.exists() and _identity(own) == pinned.ident
    if own is not None and not (in_place and _committed(store, name)):
        # a local store: one rename into its staging area (a committed folder under the
        # name that the Trainer wrote into again is copied instead: moving it would leave its
        # record without data until the commit)
        files = _moved_in(
            store,
            src,
            _inside(store, Path(os.path.realpath(pinned.via))),
            name,
            step=step,
            metadata=metadata,
            overwrite=overwrite or in_place,
        )
        if isinstance(files, Record):
            return files
    root = store.local_path()
    device = os.stat(root).st_dev if root is not None and root.exists() else None
    listed = scan(src, name, device)  # no link followed, no store entry or mount taken
    pinned.check_unchanged()
    base = Path(pinned.via)
    copied: dict[str, os.stat_result] = {}
    got: list[Record] = []
    with store.stage_dir(
        name, step=step, metadata=metadata, overwrite=overwrite or in_place, records=got
    ) as out:
        for rel in listed:
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            copied[rel] = _copy_file(base / rel, target)
    record = got[0]
    if not keep_local and not in_place:  # in place, src is the committed folder now
        _remove_copied(pinned, copied)
    return record


def _copy_file(src: Path, dst: Path) -> os.stat_result:
    """Copy the regular file ``src`` to ``dst`` (never following a link); the ``lstat`` of
    ``src`` taken before the copy, by which :func:`_remove_copied` knows it again."""
    before = os.lstat(src)
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not os.path.samestat(os.fstat(fd), before):
            raise ConfigurationError(f"{src} changed while it was copied")
        with open(fd, "rb", closefd=False) as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g, 8 * 1024 * 1024)
    finally:
        os.close(fd)
    return before


def _remove_copied(pinned: Pinned, copied: Mapping[str, os.stat_result]) -> None:
    """Remove from the pinned folder the files that were copied, each only while it is still
    the file copied (same identity, size and modification time), then the folders left empty:
    a file another writer put there meanwhile (an artifact committed below ``src``) stays, and
    so do the folders holding it. Every step down from the pinned folder is opened without
    following a link, so a folder of ``src`` replaced by a link meanwhile leads nowhere.
    Failures are ignored (the commit is done; what is left stays)."""
    with contextlib.suppress(OSError), pinned.opened() as top:
        folders: set[tuple[str, ...]] = set()
        for rel, was in copied.items():
            *up, last = rel.split("/")
            for n in range(1, len(up) + 1):
                folders.add(tuple(up[:n]))
            with contextlib.suppress(OSError), opened_below(top, up) as folder:
                now = os.stat(last, dir_fd=folder, follow_symlinks=False)
                if (
                    os.path.samestat(now, was)
                    and now.st_size == was.st_size
                    and now.st_mtime_ns == was.st_mtime_ns
                ):
                    os.unlink(last, dir_fd=folder)
        for parts in sorted(folders, key=len, reverse=True):
            with contextlib.suppress(OSError), opened_below(top, parts[:-1]) as folder:
                os.rmdir(parts[-1], dir_fd=folder)  # only when empty
        os.rmdir(pinned.last, dir_fd=pinned.fd)  # only when empty


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _committed(store: CommitStore, name: str) -> bool:
    """Whether ``name`` has a record (an unreadable one counts: nothing is moved over it)."""
    try:
        store.record(name)
    except NotFoundError:
        return False
    except CommitStoreError:
        return True
    return True


def _moved_in(
    store: CommitStore,
    src: Path,
    inside: bool,
    name: str,
    *,
    step: int | None,
    metadata: Mapping[str, Any] | None,
    overwrite: bool,
) -> Record | None:
    """:func:`commit_folder` by one rename of ``src`` into the staging area: the record, or
    None (nothing changed) where the rename is not possible; ``FolderWrite.adopt`` for a
    ``src`` inside the store (``inside``, judged from the pinned folder: its refusals
    raised), ``move_in`` otherwise."""
    for attempt in range(3 if inside else 1):  # gc claiming an entry beside it is brief
        if attempt:
            time.sleep(0.05 * attempt)
        folder = store.begin_folder(name, step=step, metadata=metadata, overwrite=overwrite)
        try:
            files = folder.adopt(src) if inside else folder.move_in(src)
        except BaseException:
            folder.abort()
            raise
        if files is not None:
            break
        folder.abort()
    else:
        return None
    try:
        return folder.commit(files)
    except BaseException:
        area = folder.local_area()
        if area is not None and area.exists() and not src.exists():
            area.rename(src)  # back where the Trainer put it
        raise


class CommitStoreCallback(TrainerCallback):  # type: ignore[misc]
    """A ``TrainerCallback``: each ``checkpoint-N`` folder becomes one committed folder artifact
    named ``prefix + "checkpoint-N"`` (step N), and ``save_total_limit`` is applied through
    prune (``min_age`` seconds, default 0: the callback prunes only folders it committed).

    ``overwrite`` (default True): a run resumed from an earlier step saves the later steps again
    and replaces them (atomically: readers see the old or the new folder). ``asynchronous``
    (default True): commit and prune on the store's worker thread (module docstring).

    Raises:
        ConfigurationError: ``store`` is not a CommitStore, a flag is not a bool.
    """

    def __init__(
        self,
        store: CommitStore,
        *,
        prefix: str = "",
        overwrite: bool = True,
        min_age: float = 0.0,
        keep_local: bool = False,
        asynchronous: bool = True,
    ) -> None:
        self.store = _check_store(store)
        if not isinstance(asynchronous, bool):
            raise ConfigurationError(f"asynchronous must be True or False, not {asynchronous!r}")
        self.asynchronous = asynchronous
        if prefix:
            validate_name(prefix.rstrip("/") + "/checkpoint-0")
        self.prefix = prefix
        self.overwrite = overwrite
        self.min_age = min_age
        self.keep_local = keep_local
        self.keep_last: int | None = None
        """The Trainer's ``save_total_limit``, taken over at ``on_init_end``."""
        self.committed: list[Record] = []
        """Every record this callback committed, oldest first."""
        self._switched_off: tuple[Any, int] | None = None
        """The arguments whose ``save_total_limit`` is off while the Trainer trains, and it."""
        self._pending: list[concurrent.futures.Future[Record]] = []
        """Background commits not yet waited for, in submission order."""

    def _take_limit(self, args: Any) -> None:
        limit = getattr(args, "save_total_limit", None)
        if limit is not None:
            self.keep_last = int(limit)

    def on_init_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._take_limit(args)  # read only: the caller's arguments stay as they were

    def _writes_into_store(self, args: Any) -> bool:
        """Whether the Trainer's ``output_dir`` is the store's root or inside it, through any
        path (judged by the identity of its folders: a bind mount of the store counts), as its
        rotation would then delete committed folders."""
        output_dir = getattr(args, "output_dir", None)
        if output_dir is None:
            return False
        return _place(self.store, Path(output_dir).resolve()) is not None

    def _check_output_dir(self, args: Any) -> None:
        """``output_dir`` inside the store must be the folder of this callback's names (the
        store's root without a prefix, ``<root>/run1`` with ``prefix="run1/"``): the Trainer
        then writes each ``checkpoint-N`` at the path of ``<prefix>checkpoint-N`` itself,
        committed in place. Anywhere else inside the store its folders could be, hold or lie in
        other artifacts. ConfigurationError before the Trainer trains."""
        if not self._writes_into_store(args):
            return
        own = self.store.local_path(f"{self.prefix}checkpoint-0")
        out = _place(self.store, Path(args.output_dir).resolve())
        names = tuple(p for p in self.prefix.split("/") if p)
        if own is None or out != names:
            raise ConfigurationError(
                f"output_dir {args.output_dir} is inside the store "
                f"({self.store.local_path()}) but is not the folder of the names "
                f"{self.prefix}checkpoint-N ({None if own is None else own.parent}): its "
                "checkpoint folders could be or hold other committed artifacts. Use that "
                "folder, or an output_dir outside the store"
            )
        for n in range(1, len(names) + 1):
            if _committed(self.store, "/".join(names[:n])):
                raise ConfigurationError(
                    f"output_dir {args.output_dir} is or lies in the committed artifact "
                    f"{'/'.join(names[:n])!r}: checkpoint folders written there would change "
                    "it. Use another prefix, or an output_dir outside the store"
                )

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._take_limit(args)
        self._check_output_dir(args)
        if getattr(state, "is_world_process_zero", True):
            self._recover(Path(args.output_dir))
        if getattr(args, "save_total_limit", None) is not None and self._writes_into_store(args):
            # The Trainer's rotation would delete committed folders: it is off while it
            # trains, and the caller's value comes back at on_train_end. Elsewhere it rotates
            # only what output_dir still holds (nothing, or the keep_local copies).
            self._switched_off = (args, args.save_total_limit)
            args.save_total_limit = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        try:
            self.wait()
        finally:
            if self._switched_off is not None:
                owner, limit = self._switched_off
                self._switched_off = None
                if owner.save_total_limit is None:
                    owner.save_total_limit = limit

    def wait(self) -> None:
        """Wait for every background commit (and its prune); raise the first failure not
        raised yet (the next ``on_save`` would have raised it)."""
        pending, self._pending = self._pending, []
        first: BaseException | None = None
        for fut in pending:
            seen = bool(getattr(fut, "observed", False))
            exc = fut.exception()
            if exc is not None and not seen and first is None:
                first = exc
        if first is not None:
            raise first

    def _ours(self, name: str) -> bool:
        return name.startswith(self.prefix) and bool(
            _CHECKPOINT.fullmatch(name[len(self.prefix) :])
        )

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not state.is_world_process_zero:
            return
        step = int(state.global_step)
        folder = Path(args.output_dir) / f"checkpoint-{step}"
        name = f"{self.prefix}checkpoint-{step}"
        best = getattr(state, "best_model_checkpoint", None)
        if not self.asynchronous:
            self._commit(folder, folder, name, step, best)
            return
        self._pending = [f for f in self._pending if not f.done() or _peek(f) is not None]
        self._queue(folder, name, step, best)

    def _queue(self, folder: Path, name: str, step: int, best: Any) -> None:
        """Set ``folder`` aside now, commit it on the store's worker thread (raises an earlier
        failure; waits while ``async_inflight`` commits are in flight)."""
        future = self.store.run_async(
            name,
            lambda: self._set_aside(folder, name),
            lambda src: self._commit(src, folder, name, step, best),
        )
        self._pending.append(future)

    def _recover(self, out: Path) -> None:
        """Folders an earlier run set aside and did not commit (killed in between): each goes
        back under its ``checkpoint-N`` name where that name is free, so the Trainer sees it
        again, and is committed (in the background with ``asynchronous=True``) unless the store
        already has a record of that step. Never deletes a folder."""
        if not out.is_dir():
            return
        for hidden in sorted(out.iterdir()):
            m = _HIDDEN.fullmatch(hidden.name)
            if m is None or not hidden.is_dir():
                continue
            folder = out / m.group(1)
            if folder.exists():
                log.warning("%s: left as it is (%s exists)", hidden, folder.name)
                continue
            os.rename(hidden, folder)
            name, step = f"{self.prefix}{folder.name}", int(m.group(2))
            if name in {r.name for r in self.store.list()}:
                log.warning("%s: set aside by an earlier run; the store has that step", folder)
                continue
            log.warning("%s: set aside by an earlier run and not committed: committing it", folder)
            if not self.asynchronous:
                self._commit(folder, folder, name, step, None)
                continue
            self._queue(folder, name, step, None)

    def _set_aside(self, folder: Path, name: str) -> Path:
        """On the training thread: the folder, out of the Trainer's reach, with one rename (or
        where it is, when it already is the artifact's own path in a local store)."""
        if not folder.is_dir():
            raise ConfigurationError(f"{folder} is not a folder")
        own = _store_path(self.store, name)
        if own is not None and own.exists() and own.samefile(folder):
            return folder
        hidden = folder.with_name(f".commitstore-pending.{folder.name}.{secrets.token_hex(4)}")
        os.rename(folder, hidden)
        return hidden

    def _commit(self, src: Path, folder: Path, name: str, step: int, best: Any) -> Record:
        """Commit ``src`` as ``name``, then prune; a failure puts ``src`` back at ``folder``."""
        try:
            record = commit_folder(
                self.store,
                src,
                name,
                step=step,
                metadata={"global_step": step},
                overwrite=self.overwrite,
                keep_local=self.keep_local,
            )
        except BaseException:
            if src != folder and src.exists() and not folder.exists():
                os.rename(src, folder)  # back where the Trainer wrote it: nothing hidden
            raise
        if src != folder and src.exists() and not folder.exists():
            os.rename(src, folder)  # keep_local: the local copy back under its name
        self.committed.append(record)
        if self.keep_last is not None:
            self._prune(step, best)
        return record

    def _prune(self, step: int, best: Any) -> None:
        keep = [r.name for r in self.store.list() if not self._ours(r.name)]
        if best:
            keep.append(self.prefix + Path(best).name)
        try:
            self.store.prune(keep_last=self.keep_last, keep=keep, min_age=self.min_age)
        except CommitStoreError as exc:  # the checkpoint is committed; prune retries next time
            log.warning("pruning after %s failed: %s", step, exc)


def _peek(future: concurrent.futures.Future[Record]) -> BaseException | None:
    """The exception of the ended ``future``, without counting as observing it."""
    return concurrent.futures.Future.exception(future, 0)


def latest_checkpoint(
    store: CommitStore, *, prefix: str = "", local_dir: str | Path | None = None
) -> Path | None:
    """The newest ``prefix + checkpoint-N`` folder that verifies fully, as a local folder for
    ``resume_from_checkpoint``: its path in a local store, else a verified copy fetched into
    ``local_dir`` (required then; a copy already there is never replaced: NameConflictError).
    None if there is none; damaged ones are skipped (logged)."""
    store = _check_store(store)
    cands = [
        r
        for r in store.list()
        if r.kind == "dir"
        and r.name.startswith(prefix)
        and _CHECKPOINT.fullmatch(r.name[len(prefix) :])
    ]
    for rec in sorted(cands, key=lambda r: int(r.name.rsplit("-", 1)[1]), reverse=True):
        report = store.verify(rec.name, level="full")
        if not report.ok:
            log.warning("%s fails verification, skipped: %s", rec.name, report.results)
            continue
        own = _store_path(store, rec.name)
        if own is not None:
            return own
        if local_dir is None:
            raise ConfigurationError("local_dir is needed to fetch a checkpoint from this store")
        # into the folder, as cp: an existing local copy there is never replaced
        # (NameConflictError), so a stale or edited one is never handed back as verified
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        store.get_file(rec.name, local_dir)
        return Path(local_dir) / Path(rec.name).name
    return None
