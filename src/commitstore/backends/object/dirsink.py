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
from collections.abc import Callable
from typing import Protocol

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

    def copy_checked(self, src: Parts, dst: Parts, *, size: int, digest: str) -> ObjectStat: ...

    def open_sink(self, parts: Parts, *, mode: PutMode) -> FileSink: ...

    def stat(self, parts: Parts) -> FileInfo | None: ...

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]: ...

    def remove(self, parts: Parts) -> bool: ...


CHUNK = 8 * 1024 * 1024
Files = list[tuple[str, int, str]]

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
                notes=["object store: files appear one by one; the record commits"],
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
                for fparts in uploaded:  # no record will claim them: take them back
                    with contextlib.suppress(Exception):
                        b.remove(fparts)
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
        small = [f for f in files if f[1] <= SMALL]
        large = [f for f in files if f[1] > SMALL]
        if len(small) > 1:
            self._upload_together(root, small, uploaded)
        else:
            large = small + large
        for rel, size, digest in large:
            fparts = (*root, *rel.split("/"))
            self._upload(fparts, rel, size, digest)
            uploaded.append(fparts)

    def _upload_together(self, root: Parts, files: Files, uploaded: list[Parts]) -> None:
        pool = concurrent.futures.ThreadPoolExecutor(
            min(AT_ONCE, len(files)), thread_name_prefix="commitstore-folder-upload"
        )
        started: list[tuple[Parts, concurrent.futures.Future[None]]] = []
        try:
            for rel, size, digest in files:
                fparts = (*root, *rel.split("/"))
                started.append((fparts, pool.submit(self._upload, fparts, rel, size, digest)))
            concurrent.futures.wait(
                [fut for _, fut in started], return_when=concurrent.futures.FIRST_EXCEPTION
            )
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            # every future is settled now: completed, failed or never started
            uploaded.extend(p for p, fut in started if not fut.cancelled() and not fut.exception())
        for _, fut in started:
            if not fut.cancelled() and (exc := fut.exception()) is not None:
                raise exc

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
    for _round in range(OWN_ROUNDS + 1):
        for rel in todo:
            size, digest = new[rel]
            mine[rel] = b.copy_checked((*root, *rel), (*parts, *rel), size=size, digest=digest)
        listed = b.walk(parts)
        stale = [
            rel
            for rel, _info in listed
            if rel not in new and not any(rel[: len(o)] == o for o in others)
        ]
        for rel in sorted(stale):
            b.delete_key((*parts, *rel), b.key((*parts, *rel)))
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
