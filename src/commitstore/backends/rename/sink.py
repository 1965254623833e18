"""The rename family's commit recipe, written once over a table of primitives (:class:`RenameOps`).

A file artifact at ``<folder>/<name>`` (:class:`StagedFileSink`):

1. Open the destination folder, creating missing folders (POSIX walks from the root with
   ``O_NOFOLLOW`` directory fds: no symlink below the root is ever followed), and create the
   staging file ``<folder>/.commitstore.tmp.<random>.<name>`` exclusively. A crash leaves at most
   an empty staging file: staging names are never read as artifacts and gc removes them.
2. ``write``: every byte the caller hashed goes to the staging file (short writes looped; the
   count is what the storage accepted). A crash leaves a partial staging file; the final name is
   untouched (the old artifact, or nothing, stays visible).
3. ``publish``: the bytes written must equal the size the caller hashed (CommitError otherwise).
4. Flush to stable storage and close (``fsync`` / SMB2 FLUSH); the size stored at close must equal
   the bytes written. From here a crash leaves a complete, durable staging file, still invisible.
5. ``policy.fresh_stat``: stat the staging name afresh; its size must match (a client cache can
   hide a short write until then). ``policy.readback``: re-read it past the caches; the digest
   must match. Any failure up to here removes the staging file and publishes nothing.
6. Rename it onto the final name in one step, per :class:`PutMode`: CREATE fails atomically when
   the name is taken (AlreadyExistsError; the existing artifact is untouched), REPLACE swaps so
   readers see the old or the new artifact, never a mix. Retried per ``policy.rename_attempts``;
   never a copy. A crash before the rename leaves the old state plus a staging file; after it the
   new artifact is visible, complete and flushed, but the rename itself may not survive a power
   loss until step 8.
7. ``policy.check_after_rename``: the final name's size must match; if not it is removed again
   (un-published) and CommitError is raised.
8. Sync the folder (directory fsync) so the rename is durable. Any error here (a tolerated one,
   EIO, the server gone), or storage with no directory sync, leaves the artifact committed with
   ``CommitInfo.durable`` False and a note: the publish has happened and is never reported as a
   failure (a record written after it would otherwise be missing while its data stands).

On any failure before step 6 :meth:`abort` removes the staging file; a staging file orphaned by
a crash is removed later by gc.

A folder artifact (:class:`StagedDirSink`) follows the same steps with a staging folder. Where
the storage allows (POSIX) the caller fills the staging folder in place on the target; otherwise
(SMB) the caller fills a local temporary folder, which is uploaded file by file into a staging
folder on the target at publish, each file checked as in step 5. Every file is fsynced and hashed
and every folder fsynced (bottom-up) before the one rename of step 6. REPLACE of an existing
folder: POSIX exchanges the two atomically (RENAME_EXCHANGE) and then removes the old one; where
there is no exchange (SMB, fsspec, FUSE/9p bridges) the move-aside protocol of ``aside.py``
moves the old folder to its deterministic aside name, the new one in, then removes the aside (a
crash in between leaves the name missing and the old folder aside: readers serve it, gc moves it
back).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from commitstore.backends.base import (
    Backend,
    CommitInfo,
    DirSink,
    FileSink,
    PutMode,
    StagingTaken,
)
from commitstore.backends.localtree import LocalStagingFolder, hash_and_sync_tree
from commitstore.backends.rename.ops import D, H, RenameOps, write_all
from commitstore.errors import AlreadyExistsError, CommitError, CommitStoreError
from commitstore.layout import Parts, aside_parts, staging_part

T = TypeVar("T")

_TAKEN_ATTEMPTS = 8
"""Staging entries a writer makes, each under a new name, while gc takes each one between its
create and the writer's lock (``StagingTaken``), before it gives up with CommitError."""


class _Staged(Generic[D, H]):
    """What both sinks share: the open folder, the staging name, translated steps, checks."""

    def __init__(self, ops: RenameOps[D, H], parts: Parts, mode: PutMode) -> None:
        self._ops = ops
        self._mode = mode
        self._final = parts[-1]
        self._tmp = staging_part(parts[-1])
        self._shown = ops.shown(parts)
        self._done = False
        self._closed = False
        self._hold: object | None = None
        """The writer's liveness lock on its staging entry (``ops.hold``), until closed."""
        self._parent = parts[:-1]
        self._folder: D = self._step("creating the folder of", ops.open_folder, parts[:-1])

    def _step(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except CommitStoreError:
            raise
        except Exception as exc:
            raise self._ops.error(exc, what, self._shown) from exc

    def _close_folder(self) -> None:
        if not self._closed:
            self._closed = True
            hold, self._hold = self._hold, None
            if hold is not None:
                self._ops.release(hold)
            self._ops.close_folder(self._folder)

    def _give_up_staging(self) -> None:
        """The staging entry just made was gone or held by gc before this writer could lock
        it (``StagingTaken``): it is removed (gc may be removing it too: either finishes) and
        the next one gets a new name."""
        with contextlib.suppress(Exception):
            self._ops.remove_at(self._folder, self._tmp)
        self._tmp = staging_part(self._final)

    def _taken_error(self) -> CommitError:
        return CommitError(
            f"{self._shown}: gc took each of {_TAKEN_ATTEMPTS} staging entries this writer made "
            "before it could lock them; nothing was written"
        )

    def _check_held(self) -> None:
        """Before the rename: the staging entry is still the one this writer locked (never one
        removed and made again under it: its contents would be a remainder), and the folder
        this writer opened is still the one at the name's path (never one another tool moved
        away meanwhile: the rename through it would publish where no reader looks)."""
        if self._hold is not None and not self._step(
            "checking", self._ops.still_held, self._folder, self._tmp, self._hold
        ):
            raise CommitError(
                f"{self._shown}: the staging entry was removed and made again while this "
                "writer held it; nothing is published"
            )
        if not self._step("checking", self._ops.folder_in_place, self._folder, self._parent):
            raise CommitError(
                f"{self._shown}: its folder was moved away or replaced while this commit ran "
                "(by another tool); nothing is published"
            )

    def _check_staged(self, name: str, size: int, digest: str, shown: str) -> None:
        """Step 5: fresh stat and read-back of a staged file, per policy."""
        policy = self._ops.policy
        if policy.fresh_stat:
            stored = self._step("checking", self._ops.size_of, self._folder, name)
            _check_size(shown, stored, size, "on a fresh stat")
        if policy.readback:
            stored, found = self._step("checking", self._ops.digest_of, self._folder, name)
            _check_size(shown, stored, size, "on read-back")
            if found != digest:
                raise CommitError(
                    f"{shown}: read-back digest {found} differs from written {digest}"
                )

    def _rename(self, info: CommitInfo, *, is_dir: bool) -> None:
        """Step 6; then the staging name is gone and :attr:`_done` is set."""
        try:
            self._step(
                "renaming into place",
                self._ops.rename,
                self._folder,
                self._tmp,
                self._final,
                mode=self._mode,
                is_dir=is_dir,
                info=info,
            )
        except AlreadyExistsError as exc:
            raise AlreadyExistsError(f"{self._shown} already exists") from exc
        self._done = True

    def _sync_published(self, info: CommitInfo) -> None:
        """Step 8, after the rename: the artifact is published whatever happens here, so a
        failing folder sync (EIO, the server gone) does not fail the publish. It is recorded
        as "durability unconfirmed" (``info.durable`` False, a note the commit logs as a
        warning): the rename may not survive a power loss, but nothing was lost yet."""
        try:
            self._step("syncing the folder of", self._ops.sync_folder, self._folder, info)
        except Exception as exc:
            info.durable = False
            info.notes.append(
                f"{self._shown} is published, but syncing its folder failed ({exc}): "
                "durability unconfirmed"
            )


def _check_size(shown: str, stored: int | None, expected: int, when: str) -> None:
    if stored != expected:
        found = "nothing" if stored is None else f"{stored} bytes"
        raise CommitError(
            f"{shown}: post-copy size check failed {when}: {found} stored, {expected} written"
        )


class StagedFileSink(_Staged[D, H], FileSink):
    """A file staged beside its destination and renamed into place (steps 1-8 above)."""

    def __init__(self, ops: RenameOps[D, H], parts: Parts, mode: PutMode) -> None:
        super().__init__(ops, parts, mode)
        self.bytes_written = 0
        self._handle: H | None = None
        try:
            for _attempt in range(_TAKEN_ATTEMPTS):
                try:
                    with ops.creating(self._folder):
                        self._handle = self._step(
                            "creating the staging file for",
                            ops.create_staging,
                            self._folder,
                            self._tmp,
                        )
                        self._hold = ops.hold(self._folder, self._tmp)
                    break
                except StagingTaken:
                    handle, self._handle = self._handle, None
                    if handle is not None:
                        with contextlib.suppress(Exception):
                            ops.discard(handle)
                    self._give_up_staging()
            else:
                raise self._taken_error()
        except BaseException:
            self._done = True
            self._close_folder()
            raise

    def write(self, data: memoryview) -> None:
        handle = self._handle
        assert handle is not None, "write after publish/abort"
        try:
            self.bytes_written += write_all(lambda v: self._ops.write(handle, v), data)
        except Exception as exc:
            err = (
                exc
                if isinstance(exc, CommitStoreError)
                else self._ops.error(exc, "writing", self._shown)
            )
            self.abort()
            raise err from exc

    def prepare(self) -> None:
        handle = self._handle
        assert handle is not None, "prepare after publish/abort"
        self._step("flushing", self._ops.prepare, handle)

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        handle = self._handle
        assert handle is not None, "publish after publish/abort"
        ops, written = self._ops, self.bytes_written
        info = CommitInfo(written)
        try:
            if size != written:
                raise CommitError(f"{self._shown}: {written} bytes written, {size} expected")
            self._handle = None
            stored = self._step("flushing", ops.finish, handle)
            if stored is not None:
                _check_size(self._shown, stored, written, "after fsync")
            self._check_staged(self._tmp, written, digest, self._shown)
            self._check_held()
            self._rename(info, is_dir=False)
            if ops.policy.check_after_rename:
                self._check_final()
            self._sync_published(info)
            return info
        except BaseException:
            self.abort()
            raise
        finally:
            if self._done:
                self._close_folder()

    def _check_final(self) -> None:
        """Step 7: the final name must hold what was written, else un-publish it. A stat that
        fails (EIO, unreachable) says nothing about what the name holds: the error is raised and
        nothing is removed (after a replace the old version is gone already; the data there is
        the new one, which the commit's pending record still describes)."""
        stored = self._step("checking", self._ops.size_of, self._folder, self._final)
        if stored != self.bytes_written:
            with contextlib.suppress(Exception):
                self._ops.remove_at(self._folder, self._final)
            _check_size(self._shown, stored, self.bytes_written, "after the rename")

    def abort(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(Exception):
                self._ops.discard(handle)
        if not self._done:
            self._done = True
            # If this fails the staging file stays as an orphan; gc removes it.
            with contextlib.suppress(Exception):
                self._ops.remove_at(self._folder, self._tmp)
        self._close_folder()


class StagedDirSink(_Staged[D, H], DirSink):
    """A folder staged in place (or locally, then uploaded) and renamed into place."""

    def __init__(self, ops: RenameOps[D, H], parts: Parts, mode: PutMode) -> None:
        super().__init__(ops, parts, mode)
        try:
            for _attempt in range(_TAKEN_ATTEMPTS):
                try:  # the caller gets the folder only once this writer holds it
                    with ops.creating(self._folder):
                        local = self._step(
                            "creating the staging folder for",
                            ops.staging_folder,
                            self._folder,
                            (*parts[:-1], self._tmp),
                        )
                        if local is not None:
                            self._hold = ops.hold(self._folder, self._tmp)
                    break
                except StagingTaken:
                    self._give_up_staging()
            else:
                raise self._taken_error()
        except BaseException:
            self._done = True
            self._close_folder()
            raise
        self._in_place = local is not None
        self._staged = self._in_place
        """True while a staging folder exists on the storage."""
        self._local: LocalStagingFolder | None = None
        if local is None:  # the caller fills a local folder, pinned (uploaded at publish)
            self._local = LocalStagingFolder()
            local = self._local.path
        self.local_path = local

    def publish(self) -> CommitInfo:
        policy = self._ops.policy
        info = CommitInfo(0)
        try:
            if self._in_place:
                info.files = self._step(
                    "syncing",
                    hash_and_sync_tree,
                    self.local_path,
                    uncached=policy.readback,
                    tolerated=policy.dir_fsync_tolerated,
                    info=info,
                )
            else:
                assert self._local is not None
                self._local.check(self._shown)
                info.files = self._step("syncing", hash_and_sync_tree, self.local_path)
                self._upload(info.files)
            info.bytes_written = sum(size for _, size, _ in info.files)
            self._check_held()
            self._rename(info, is_dir=True)
            self._staged = False
            self._sync_published(info)
            return info
        except BaseException:
            self.abort()
            raise
        finally:
            if self._done:
                self._close_folder()
            if self._local is not None:
                self._local.close()

    def _upload(self, files: list[tuple[str, int, str]]) -> None:
        self._step("uploading", self._ops.upload, self._folder, self._tmp, None)
        self._staged = True
        for rel, size, digest in files:
            name = f"{self._tmp}/{rel}"
            self._step("uploading", self._ops.upload, self._folder, name, self.local_path / rel)
            self._check_staged(name, size, digest, f"{self._shown}/{rel}")

    def abort(self) -> None:
        if self._local is not None:
            self._local.close()
        if not self._done:
            self._done = True
            if self._staged:
                # If this fails the staging folder stays as an orphan; gc removes it.
                with contextlib.suppress(Exception):
                    self._ops.remove_at(self._folder, self._tmp)
        self._close_folder()


class StagedFolderPublish(_Staged[D, H]):
    """Publish a staging folder that other sinks filled in place (a multi-writer folder commit,
    ``commitstore._folderwrite``): make its folders durable, then step 6 and 8 as for
    :class:`StagedDirSink`. The files are not read again: each was flushed and checked by its own
    sink. On failure the staging folder stays (its writers' files; gc removes it when old)."""

    def __init__(self, ops: RenameOps[D, H], staging: str, parts: Parts, mode: PutMode) -> None:
        super().__init__(ops, parts, mode)
        self._tmp = staging

    def publish(self) -> CommitInfo:
        info = CommitInfo(0)
        try:
            self._step("syncing", self._ops.sync_tree, self._folder, self._tmp, info)
            self._rename(info, is_dir=True)
            self._step("syncing the folder of", self._ops.sync_folder, self._folder, info)
            return info
        finally:
            self._close_folder()


class _StagedMove(_Staged[D, H]):
    """One no-replace rename of ``src`` (an entry beside ``parts``) onto ``parts``, translated
    as the sinks translate theirs (:meth:`RenameBackend.restore_aside`)."""

    def __init__(self, ops: RenameOps[D, H], src: str, parts: Parts) -> None:
        super().__init__(ops, parts, PutMode.CREATE)
        self._tmp = src

    def move(self, *, is_dir: bool) -> None:
        try:
            self._rename(CommitInfo(0), is_dir=is_dir)
        finally:
            self._close_folder()


class RenameBackend(Backend, RenameOps[D, H]):
    """A rename-family backend: the sinks and ``describe`` come from here."""

    reason: str

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink:
        return StagedFileSink(self, parts, mode)

    def open_dir_sink(self, parts: Parts, *, mode: PutMode) -> DirSink:
        return StagedDirSink(self, parts, mode)

    def publish_folder(self, staging: Parts, parts: Parts, *, mode: PutMode) -> CommitInfo:
        if staging[:-1] != parts[:-1]:
            raise CommitError(f"{self.shown(staging)}: not a staging folder beside {parts[-1]}")
        return StagedFolderPublish(self, staging[-1], parts, mode).publish()

    def restore_aside(self, parts: Parts) -> bool:
        """The aside entry of ``parts`` moved back with this backend's no-replace rename
        (:meth:`RenameOps.rename` with ``PutMode.CREATE``)."""
        aside = aside_parts(parts)
        info = self.stat(aside)
        if info is None:
            return False
        _StagedMove(self, aside[-1], parts).move(is_dir=info.is_dir)
        return True

    def describe_more(self) -> dict[str, Any]:
        """Strategy-specific entries of :meth:`describe` (mount, checks, user)."""
        return {}

    def describe(self) -> dict[str, Any]:
        caps = self.capabilities
        return {
            "strategy": self.strategy,
            "reason": self.reason,
            "location": self.shown(()),
            "capabilities": {k: getattr(caps, k) for k in caps.__dataclass_fields__},
            **self.describe_more(),
        }
