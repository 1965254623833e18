"""Folder artifacts on object stores, shared by every object store.

There is no atomic folder publish on an object store: each file is its own checked upload (the
small ones several at a time), and the record, written after the last one, is what commits the
folder. Create-only: where the store has conditional writes the core relies on them and checks
nothing, but a folder is many objects, so the sink checks absence itself then; elsewhere the core
checks absence under ``publish_lock()`` and the sink does not check again. A failed create takes
back the files already uploaded (those still in flight when another failed too, once done).

A replace (``overwrite=True`` over a name that holds something) uploads the whole new version
before anything old is touched, as a **staged copy** under ``.commitstore/staged/`` (its place is
derived from the new folder digest, which the pending record carries: ``layout.staged_parts``),
each file its own checked upload. Only then are the staged files copied over the final keys
(``ObjectBackend.copy_checked``: the store's server-side copy, checked), the old files the new
folder lacks deleted, and the staged copy deleted; the core then writes the record. The name
verifies as the old or the new version at every point:

* until the first change (the first copy; over a file artifact, the delete of its object,
  which comes before the copies) the final keys hold the old version (the old record matches);
* from the first change until the staged copy is deleted, the staged copy is whole: every check
  that finds the folder matching neither record tries it, and the name verifies (and
  ``get_file`` reads) as the new version from the staged copy; gc completes the copies (roll
  forward), as does committing the folder again;
* after that the final keys hold the new version (the pending record matches).

A failure while uploading the staged copy deletes it and touches nothing old; a failure once the
copies have started keeps it (old bytes of copied files are gone, so roll-back is impossible) and
raises CommitError saying that the new version stands and gc completes it; the core then checks
the staged copy in full and, if it is whole, returns the record (not durable) and keeps the
writer's pending record naming it (``_commit.Committer.commit``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from commitstore.backends.base import Capabilities, CommitInfo, DirSink, FileInfo, FileSink, PutMode
from commitstore.backends.localtree import LocalStagingFolder, hash_and_sync_tree
from commitstore.backends.object.upload import ObjectStat
from commitstore.digest import manifest_digest
from commitstore.errors import AlreadyExistsError, CommitError, CommitStoreError
from commitstore.layout import Parts, staged_parts


class ObjectStore(Protocol):
    """What the folder sink needs of an object backend (``object/base.py`` provides it)."""

    @property
    def capabilities(self) -> Capabilities: ...

    def key(self, parts: Parts) -> str: ...

    def head(self, parts: Parts) -> ObjectStat | None: ...

    def delete_key(self, parts: Parts, key: str) -> None: ...

    @property
    def copy_max(self) -> int:
        """The largest file the store copies server-side (0: none); a larger one is streamed
        through the client by ``copy_checked``."""

    def copy_checked(self, src: Parts, dst: Parts, *, size: int, digest: str) -> ObjectStat: ...

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink: ...

    def stat(self, parts: Parts) -> FileInfo | None: ...

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]: ...

    def remove(self, parts: Parts) -> bool: ...


CHUNK = 8 * 1024 * 1024
Files = list[tuple[str, int, str]]
T = TypeVar("T")
R = TypeVar("R")

AT_ONCE = 8
"""A folder's small files uploaded at the same time (each its own checked upload): on a
server that answers one request at a time, or over a link with latency, one file after another
leaves the wire idle between requests."""
SMALL = 4 * 1024 * 1024
"""Files of at most this many bytes go :data:`AT_ONCE` at a time; larger ones one after
another, each with its own parts in flight. The small files' bytes in memory stay under
``AT_ONCE x 2 x SMALL`` (each read whole and held by its sink until its put)."""


class ObjectDirSink(DirSink):
    """A local temporary folder, uploaded on publish: each file its own checked upload, the
    small ones :data:`AT_ONCE` at a time (:meth:`_upload_all`)."""

    def __init__(
        self,
        backend: ObjectStore,
        parts: Parts,
        *,
        mode: PutMode,
        mark_empty: Callable[[], None] | None = None,
    ) -> None:
        self._b = backend
        self._parts = parts
        self._mode = mode
        self._mark_empty = mark_empty
        self._local = LocalStagingFolder()
        self.local_path = self._local.path

    def publish(self) -> CommitInfo:
        b = self._b
        try:
            self._local.check("/".join(self._parts))
            files = hash_and_sync_tree(self.local_path)
            info = CommitInfo(
                sum(s for _, s, _ in files),
                files=files,
                notes=["object store: files appear as they are uploaded; the record commits"],
            )
            if self._mode is PutMode.REPLACE and b.stat(self._parts) is not None:
                self._replace(files)
                if not files and self._mark_empty is not None:
                    self._mark_empty()
                return info
            creating = self._mode is PutMode.CREATE and b.capabilities.exclusive_create
            if creating and b.stat(self._parts) is not None:
                raise AlreadyExistsError(f"{'/'.join(self._parts)} already exists")
            if not files and self._mark_empty is not None:
                self._mark_empty()
            uploaded: list[Parts] = []
            try:
                self._upload_all(self._parts, files, uploaded)
            except BaseException:
                together(uploaded, _quietly(b.remove), [])  # no record will claim them
                raise
            return info
        finally:
            self._local.close()

    def _upload_all(self, root: Parts, files: Files, uploaded: list[Parts]) -> None:
        """Upload every file of ``files`` below ``root``, adding each one uploaded to
        ``uploaded`` (the caller takes them back on failure). Files of at most :data:`SMALL`
        bytes go :data:`AT_ONCE` at a time, larger ones after them one at a time. On a failure
        no further file starts, the uploads in flight are waited for (each one completed is in
        ``uploaded``, each one failed took its own upload back), and the error of the first
        failed file in ``files``' order is raised."""

        def upload(entry: tuple[str, int, str]) -> Parts:
            rel, size, digest = entry
            fparts = (*root, *rel.split("/"))
            self._upload(fparts, rel, size, digest)
            return fparts

        done: list[tuple[tuple[str, int, str], Parts]] = []
        try:
            together([f for f in files if f[1] <= SMALL], upload, done)
            for entry in (f for f in files if f[1] > SMALL):
                done.append((entry, upload(entry)))
        finally:
            uploaded.extend(fparts for _, fparts in done)

    def _upload(self, fparts: Parts, rel: str, size: int, digest: str) -> None:
        sink = self._b.open_sink(fparts, mode=PutMode.REPLACE)
        try:
            with open(self.local_path / rel, "rb") as src:
                while chunk := src.read(CHUNK):
                    sink.write(memoryview(chunk))
        except BaseException:
            sink.abort()
            raise
        sink.publish(size=size, digest=digest)

    def abort(self) -> None:
        self._local.close()

    def _replace(self, files: Files) -> None:
        """Stage the whole new version, then copy it over the old one (see the module doc)."""
        b = self._b
        root = staged_parts(self._parts, manifest_digest(files))
        try:
            self._upload_all(root, files, [])
        except BaseException:
            with contextlib.suppress(Exception):  # nothing old was touched
                b.remove(root)
            raise
        name = "/".join(self._parts)
        try:
            complete_replace(b, self._parts, files, root)
        except CommitStoreError as exc:
            raise CommitError(
                f"{name}: the folder replace stopped while copying its staged files ({exc}); "
                "the staged copy is whole and kept: the name verifies as the old version until "
                "a file is copied (or an old file artifact's object deleted), as the new one "
                "(from the staged copy) after that, and gc "
                "(or committing the folder again) completes the replace"
            ) from exc


def complete_replace(b: ObjectStore, parts: Parts, files: Files, root: Parts) -> None:
    """Delete an object at ``parts`` itself (a file artifact before), copy every staged file
    under ``root`` over its final key below ``parts``, delete the files the new version lacks,
    then the staged copy. Idempotent: run again after a crash or failure (gc's roll-forward),
    it finishes the same replace. Raises what the store raises; the staged copy stays then.

    **Another writer of the same name** may be copying its own version over the same keys at
    the same time (no lock holds on an object store), so the copies of two replaces can
    interleave and leave a mix that is neither version. Before the staged copy is deleted, one
    listing checks that every final key still holds this replace's copy (the tag the store
    gave right after it) and that no key of another version was added; what is not is copied
    (or deleted) again, up to :data:`OWN_ROUNDS` times. The writer whose copy came last
    therefore leaves its whole version, and until its check passes its staged copy (and the
    pending record naming it) stays, so the name verifies at every point. A replace that still
    finds foreign keys after the last round raises CommitError and keeps its staged copy.

    Names are paths: a key below ``parts`` that is (or lies below) another committed
    artifact's name is never deleted, even if a commit of that artifact raced the core's check
    (the lock holds nothing on an object store); only a single-object delete per stale key."""
    new = {tuple(rel.split("/")): (size, digest) for rel, size, digest in files}
    if b.head(parts) is not None:
        # the name held a file artifact: that object goes first, before any copy, since a
        # store that keeps a real folder tree (``rclone serve s3``) cannot hold an object
        # ``x`` and keys below ``x/`` at once; the staged copy is whole, so the name verifies
        # as the new version from here on (as after a first copy)
        b.delete_key(parts, b.key(parts))
    mine: dict[Parts, ObjectStat] = {}
    todo = list(new)
    others = _others_below(b, parts)

    def copy(rel: Parts) -> ObjectStat:
        size, digest = new[rel]
        return b.copy_checked((*root, *rel), (*parts, *rel), size=size, digest=digest)

    def delete(rel: Parts) -> None:
        b.delete_key((*parts, *rel), b.key((*parts, *rel)))

    for _round in range(OWN_ROUNDS + 1):
        copied: list[tuple[Parts, ObjectStat]] = []
        try:
            # the first copy alone: the first change to the final keys is the same file, made
            # before any other, whatever the order the others then land in; then the
            # server-side copies together, and files streamed through the client one at a time
            for rel in todo[:1]:
                copied.append((rel, copy(rel)))
            together([rel for rel in todo[1:] if new[rel][0] <= b.copy_max], copy, copied)
            for rel in (rel for rel in todo[1:] if new[rel][0] > b.copy_max):
                copied.append((rel, copy(rel)))
        finally:
            mine.update(copied)
        listed = b.walk(parts)
        stale = [
            rel
            for rel, _info in listed
            if rel not in new and not any(rel[: len(o)] == o for o in others)
        ]
        together(sorted(stale), delete, [])
        seen = {rel: info for rel, info in listed if rel in new}
        todo = [rel for rel in new if not _still_mine(seen.get(rel), mine[rel])]
        if not todo and not stale:
            b.remove(root)
            return
    name = "/".join(parts)
    raise CommitError(
        f"{name}: another writer kept replacing this folder while its staged copy was copied "
        f"({len(todo)} file(s) not this version's after {OWN_ROUNDS} rounds); the staged copy "
        "is kept, so the name verifies as one whole version, and gc completes the replace"
    )


OWN_ROUNDS = 4
"""Checks (each after copying again what another writer replaced) before a replace gives up."""


def together(items: Sequence[T], run: Callable[[T], R], done: list[tuple[T, R]]) -> None:
    """``run`` each of ``items``, :data:`AT_ONCE` at a time (one item, or a process already
    shutting down, where no new thread may start: one after another in this thread); each item
    finished is appended to ``done`` with its result, also when this raises or the caller is
    interrupted. After a failure no further item starts (an item not started yet is skipped,
    whichever thread would take it), the ones in flight are waited for, and the failure of the
    first failed item in ``items``' order is raised. Nothing runs after this returns or raises
    (but for a second interrupt while the ones in flight are waited for: they finish on their
    own, and what they upload is left to gc)."""
    if len(items) <= 1:
        for item in items:
            done.append((item, run(item)))
        return
    stop = threading.Event()

    def guarded(item: T) -> R:
        if stop.is_set():
            raise _NotStarted
        try:
            return run(item)
        except BaseException:
            stop.set()
            raise

    pool = _Pool(min(AT_ONCE, len(items)), thread_name_prefix="commitstore-folder")
    started: list[tuple[T, concurrent.futures.Future[R]]] = []
    rest: Sequence[T] = ()
    try:
        for i, item in enumerate(items):
            try:
                started.append((item, pool.submit(guarded, item)))
            except RuntimeError:  # the interpreter is shutting down: no new thread may start
                rest = items[i:]
                break
        concurrent.futures.wait(
            [fut for _, fut in started], return_when=concurrent.futures.FIRST_EXCEPTION
        )
    finally:
        stop.set()  # nothing not yet started starts now, also when this thread was interrupted
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        finally:
            done.extend((item, fut.result()) for item, fut in started if _finished(fut))
    for _, fut in started:
        failure = _failure(fut)
        if failure is not None:
            raise failure
    for item in rest:
        done.append((item, run(item)))


_Pool = concurrent.futures.ThreadPoolExecutor
"""The threads of :func:`together` (a name of this module, so a test can interrupt it)."""


class _NotStarted(Exception):
    """An item :func:`together` skipped: a failure came first."""


def _finished(fut: concurrent.futures.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _failure(fut: concurrent.futures.Future[Any]) -> BaseException | None:
    if not fut.done() or fut.cancelled():
        return None
    exc = fut.exception()
    return None if isinstance(exc, _NotStarted) else exc


def _quietly(remove: Callable[[Parts], object]) -> Callable[[Parts], None]:
    """``remove`` with its errors dropped (a take-back that cannot reach the store leaves the
    file to gc, as before)."""

    def run(parts: Parts) -> None:
        with contextlib.suppress(Exception):
            remove(parts)

    return run


def _still_mine(found: FileInfo | None, copied: ObjectStat) -> bool:
    """Whether a listed final key is the copy this replace made: same size and tag (an S3 ETag
    or an Azure ETag or a GCS generation: a later write changes it). A store that gives no tag
    on one side cannot tell, and the size decides. Quotes do not count: ``rclone serve s3``
    lists ETags bare and answers HEAD with them quoted."""
    if found is None or found.size != copied.size:
        return False
    if found.tag is None or copied.tag is None:
        return True
    return found.tag.strip('"') == copied.tag.strip('"')


def _others_below(b: ObjectStore, parts: Parts) -> list[Parts]:
    """Names (relative to ``parts``) of the artifacts committed below ``parts``: their keys are
    theirs. A record stored under a hashed leaf protects its whole folder."""
    from commitstore._hierarchy import committed_below

    out: list[Parts] = []
    for name in committed_below(b, parts):
        rel = tuple(name.split("/"))[len(parts) :]
        out.append(rel[:-1] if rel[-1] == "..." else rel)
    return out
