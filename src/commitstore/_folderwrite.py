"""Folder artifacts written by many processes (or hosts): one staging area, one commit point.

The coordinator calls :meth:`CommitStore.begin_folder`, which returns a :class:`FolderWrite` whose
:attr:`~FolderWrite.token` (a short JSON string) it hands to every other writer; each writer opens
the same store and calls :meth:`CommitStore.join_folder` with it. Every writer writes its files
with :meth:`FolderWrite.open_file` (hashed on the way: each returns its :class:`FileRecord`); the
coordinator gathers the records and calls :meth:`FolderWrite.commit`, the single commit point,
through the one commit path (``_commit.Committer``: pending record, data, record).

Where the files are staged:

- Storage with staging names (local disks, SMB, FUSE bridges): a staging folder beside the name,
  ``<parent>/.commitstore.tmp.<id>.<last>`` (``layout.staging_part``), made by ``begin_folder``
  (again by ``join_folder`` if missing) and held by each writer from there to its commit or abort.
  Each file goes through the backend's own file sink into it (staged under a staging name there,
  flushed, checked per the strategy's policy, renamed in). A killed writer leaves only names
  under the staging folder; gc removes it once everything in it is older than ``min_age``.
  ``commit`` renames the folder into place in one step (``overwrite=True``: old or new for
  readers, as ``stage_dir``).
- Object stores: each file is uploaded to its final key (no second copy, no server-side copy);
  the record is the commit, so nothing is listed, verified whole or replicated before it. New
  names only: ``overwrite=True`` raises ConfigurationError (the old version's files would be
  replaced one by one before the record). ``begin`` writes a marker
  ``.commitstore/folders/<id>.json`` naming the folder, and each writer (each
  :class:`FolderWrite`) keeps its own marker ``.commitstore/folders/<id>/<writer>.json`` that
  lists every file it uploads, written when the writer begins or joins, rewritten before each
  upload starts, and every ``heartbeat`` seconds from then until its :meth:`~FolderWrite.commit`
  or :meth:`~FolderWrite.abort` (or until the :class:`FolderWrite` is garbage collected), between
  its files too (the writer's proof of life). gc removes, of a write whose
  markers and listed files are all older than ``min_age`` and whose folder has no record,
  exactly the files its markers list (never anything else under the name: another artifact
  committed under the same folder path stays), then the markers; ``abort`` does the same at
  once.

A write that is no longer open takes no file: ``join`` refuses it (AlreadyExistsError once
committed; on object stores CommitError once aborted or removed by gc, read from its marker),
and on object stores so does every ``open_file`` before its upload; an upload that raced the
commit and that the record does not name is removed again (``FolderWrite._not_late``). A writer
never has a file and a folder at one path (``sub`` and ``sub/x``: NameConflictError, no I/O).

What ``commit`` checks before anything is published: every expected file is present in the
staging area with its recorded size (one listing), nothing else is there, and no expected path
is the folder of another (two writers' ``sub`` and ``sub/x``: CommitError); on object stores,
nothing was committed below the name meanwhile (``Committer.commit``: NameConflictError).
Digests are the writers' own, computed over the bytes as they went to the sink; ``check="full"``
re-reads and hashes every file first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commitstore import _slots
from commitstore._commit import Committer, check_new, make_record, mode_of
from commitstore._foldermembers import FolderFile
from commitstore._movein import check_adoptable, check_outside
from commitstore._small import put_small
from commitstore.backends import (
    Backend,
    CommitInfo,
    Pinned,
    PutMode,
    StagingTaken,
    check_folder,
    hash_and_sync_tree,
    pin,
)
from commitstore.digest import hash_stream, manifest_digest
from commitstore.errors import (
    AlreadyExistsError,
    CommitError,
    CommitStoreError,
    ConfigurationError,
    InvalidNameError,
    NameConflictError,
    NotFoundError,
)
from commitstore.layout import (
    STAGING_PREFIX,
    Parts,
    folder_marker_parts,
    record_parts,
    validate_name,
    writer_marker_parts,
    writer_markers_parts,
)
from commitstore.maintenance import _owned
from commitstore.records import FileRecord, Record, RecordFormatError, decode_record

TOKEN_VERSION = 1
_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True, slots=True)
class _Token:
    id: str
    name: str
    overwrite: bool
    step: int | None
    metadata: dict[str, Any]
    store: str

    def dumps(self) -> str:
        return json.dumps(
            {
                "v": TOKEN_VERSION,
                "id": self.id,
                "name": self.name,
                "overwrite": self.overwrite,
                "step": self.step,
                "metadata": self.metadata,
                "store": self.store,
            },
            sort_keys=True,
        )


def _parse_token(text: object) -> _Token:
    """The token a coordinator handed out; ConfigurationError for anything malformed."""
    if not isinstance(text, str):
        raise ConfigurationError(f"a folder token is a str, not {type(text).__name__}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError("not a folder token (not JSON)") from exc
    if not isinstance(doc, dict) or doc.get("v") != TOKEN_VERSION:
        raise ConfigurationError("not a folder token of this version")
    wid, name, over, store = doc.get("id"), doc.get("name"), doc.get("overwrite"), doc.get("store")
    if not (isinstance(wid, str) and _ID.fullmatch(wid)):
        raise ConfigurationError("folder token: bad id")
    if not isinstance(over, bool) or not isinstance(store, str):
        raise ConfigurationError("folder token: bad fields")
    try:
        validate_name(name)
    except InvalidNameError as exc:
        raise ConfigurationError(f"folder token: {exc}") from exc
    assert isinstance(name, str)
    _, step, meta = check_new(name, doc.get("step"), doc.get("metadata"))
    return _Token(wid, name, over, step, meta, store)


def staging_of(parts: Parts, write_id: str) -> Parts:
    """The staging folder of write ``write_id`` of ``parts`` (beside it, a staging name)."""
    hint = parts[-1].encode("utf-8")[:64].decode("utf-8", "ignore")
    return (*parts[:-1], f"{STAGING_PREFIX}{write_id}.{hint}")


_TAKEN_ATTEMPTS = 8
"""Times a writer makes the staging folder again while gc takes it between the make and the
writer's lock, before it gives up with CommitError."""


def _in_place(backend: Backend) -> bool:
    """True where files are uploaded to their final names (no staging names: object stores)."""
    return not backend.capabilities.staging_names


class FolderWrite:
    """A folder artifact that several processes fill; committed once, by one of them.

    Guarantees: nothing of the folder is listed, verified whole, pruned or replicated before
    :meth:`commit` returns; a writer that dies leaves only what gc recognises (a staging folder,
    or on object stores files named by a marker) and the previous artifacts untouched.
    """

    def __init__(
        self,
        committer: Committer,
        token: _Token,
        *,
        after: Callable[[Record], None] | None = None,
    ) -> None:
        self._c = committer
        self._t = token
        self._parts = validate_name(token.name)
        self._after = after
        self._writer = secrets.token_hex(8)
        self._mine: list[str] = []
        """Files this writer opened (object stores: listed in its marker before each upload)."""
        self.record: Record | None = None
        """After :meth:`commit`."""
        self._closed = False
        """After :meth:`abort` (or a :meth:`commit`): no file is opened any more."""
        self._files: set[str] = set()
        self._folders: dict[str, str] = {}
        """The paths this writer opened, and the folders they are in (each with one of its
        files): a path is never both."""
        self._held: object | None = None
        """Local stores: this writer's liveness lock on the staging folder (:meth:`_hold`)."""
        self._unhold: weakref.finalize[Any, Any] | None = None
        """Releases :attr:`_held` once: at :meth:`commit` or :meth:`abort`, or when this writer
        is dropped without either (garbage-collected), so a forgotten write's folder is left
        to gc's age rule instead of being kept until the process ends."""
        self._marker_lock = threading.Lock()
        self._beat: _slots.Beat | None = None
        if _in_place(committer.backend):
            self._start_beat()
        else:
            self._hold(committer.backend)  # from begin/join on: gc never takes it meanwhile

    def __repr__(self) -> str:
        return f"<FolderWrite {self._t.name!r} {'committed' if self.record else 'open'}>"

    @property
    def token(self) -> str:
        """What the other writers pass to :meth:`CommitStore.join_folder` (JSON, no secrets)."""
        return self._t.dumps()

    @property
    def name(self) -> str:
        return self._t.name

    def _area(self) -> Parts:
        backend = self._c.backend
        return self._parts if _in_place(backend) else staging_of(self._parts, self._t.id)

    def local_area(self) -> Path | None:
        """The staging folder's local path where the store is a local folder, else None."""
        return self._c.backend.local_path(self._area())

    def open_file(self, path: str) -> FolderFile:
        """Start writing the file ``path`` (relative to the folder, ``/``-separated).

        Raises:
            InvalidNameError: a bad path, before any I/O.
        """
        rel = validate_name(path, inside_folder=True)
        if self._closed or self.record is not None:
            raise CommitError(
                f"{self.name}: this folder write is {'committed' if self.record else 'aborted'}; "
                f"{path} was not written"
            )
        self._claim(path, rel)
        backend = self._c.backend
        mode = PutMode.CREATE if backend.capabilities.exclusive_create else PutMode.REPLACE
        if not _in_place(backend):
            self._hold(backend)  # before the file's sink: gc never takes the folder under it
            sink = backend.open_sink((*self._area(), *rel), mode=mode)
            return FolderFile(path, sink)
        # the marker lists the file before its upload starts (its heartbeat keeps the writer
        # alive from begin/join to commit or abort: gc never takes a live writer's files)
        check_open(backend, self._t)
        with self._marker_lock:
            if path not in self._mine:
                self._mine.append(path)
            put_small(backend, self._marker_parts(), self._marker(), PutMode.REPLACE)
        return FolderFile(
            path,
            backend.open_sink((*self._area(), *rel), mode=mode),
            after_publish=self._not_late,
        )

    def _claim(self, path: str, rel: Parts) -> None:
        """Refuse ``path`` if this writer opened a file at one of its folders, or files below
        it (a folder holds ``sub`` or ``sub/x``, never both: a local file system refuses it, an
        object store would take both keys and no record could name them). No I/O. Files of
        other writers are compared at :meth:`commit`."""
        dirs = ["/".join(rel[:i]) for i in range(1, len(rel))]
        clash = self._folders.get(path) or next((d for d in dirs if d in self._files), None)
        if clash is not None:
            raise NameConflictError(
                f"{self.name}: {path} cannot be written, this writer wrote {clash} (a file, and "
                "a folder holding a file, cannot both be at one path); nothing was written",
                name=self.name,
            )
        self._files.add(path)
        for d in dirs:
            self._folders.setdefault(d, path)

    def _not_late(self, record: FileRecord) -> None:
        """Object stores, right after a file's upload: if the folder got its record meanwhile
        (another writer committed it while this upload ran), the upload landed inside a
        committed folder. A file that record does not name is removed again (it was this
        upload's: the record's own files were there before), and CommitError is raised."""
        backend = self._c.backend
        parts = (*self._parts, *record.path.split("/"))
        try:
            committed = decode_record(backend.read_small(record_parts(self._parts)))
        except NotFoundError:
            return
        except RecordFormatError as exc:
            raise CommitError(
                f"{self.name}: the folder got a record while {record.path} was uploaded, and "
                f"it is unreadable ({exc}); the upload is left for gc"
            ) from exc
        named = next((f for f in committed.files if f.path == record.path), None)
        if named == record:
            return
        if named is None:
            backend.remove(parts)
        raise CommitError(
            f"{self.name}: the folder was committed while {record.path} was uploaded; "
            + (
                "that upload was removed again, the committed folder is as committed"
                if named is None
                else "the committed folder names that file with other bytes"
            )
        )

    def _marker_parts(self) -> Parts:
        return writer_marker_parts(self._t.id, self._writer)

    def _start_beat(self) -> None:
        """Object stores: write this writer's marker, then rewrite it every ``heartbeat``
        seconds until :meth:`commit`, :meth:`abort` or this object's garbage collection (the
        beat holds no reference to it), so gc sees the writer alive between its files too."""
        backend = self._c.backend
        name, wid, mine = self.name, self._t.id, self._mine

        def body() -> bytes:  # what self._marker() gives, without a reference to self
            return _marker_body(name, wid, mine)

        with self._marker_lock:
            put_small(backend, self._marker_parts(), body(), PutMode.REPLACE)
        beat = _slots.Beat(
            backend, self._marker_parts(), body, _slots.interval(backend), lock=self._marker_lock
        )
        self._beat = beat
        weakref.finalize(self, beat.stop).atexit = False

    def _stop_beat(self) -> None:
        beat, self._beat = self._beat, None
        if beat is not None:
            beat.stop()

    def _hold(self, backend: Backend) -> None:
        """Local stores, from :func:`begin` or :func:`join` on (again before each file's sink
        if that failed): the staging folder made (if missing) and a shared ``flock`` on the
        folder itself for this writer's life, the make and the lock under the parent folder's
        creation lock (``_liveness.hold_shared_folder``), so gc never finds it made and not
        yet locked, and keeps it, whatever its age, while any writer of it lives, between its
        files too; the kernel drops it when the process dies. A folder gc held (removing it:
        no writer held it, so the write's files, if any, are gone with it) or removed before
        the lock (``StagingTaken``) is made again under its name; after
        :data:`_TAKEN_ATTEMPTS` such takes, CommitError naming gc. Released by :meth:`commit`
        and :meth:`abort`."""
        area = self._area()
        if self._held is not None or backend.local_path(area) is None:
            return
        for _attempt in range(_TAKEN_ATTEMPTS):
            try:
                self._keep(backend.hold_folder(area))  # never via a symlink
                return
            except StagingTaken:
                continue  # gc removed it (no writer held it) before this lock: made again
            except OSError:
                return  # the file's sink meets the same error and reports it, typed
        raise CommitError(
            f"{self.name}: gc took its staging folder {_TAKEN_ATTEMPTS} times before this "
            "writer could lock it; nothing was written"
        )

    def _keep(self, held: object | None) -> None:
        """Hold ``held`` (from ``Backend.hold_folder``) until :meth:`_release`, or until this
        writer is garbage-collected."""
        self._held = held
        if held is not None:
            self._unhold = weakref.finalize(self, self._c.backend.release_folder, held)

    def _release(self) -> None:
        unhold, self._unhold, self._held = self._unhold, None, None
        if unhold is not None:
            unhold()  # at most once, whoever asks first

    def write_bytes(self, path: str, data: bytes | bytearray | memoryview) -> FileRecord:
        """Write the whole file ``path`` at once; its record."""
        with self.open_file(path) as f:
            f.write(data)
        return f.finish()

    def move_in(self, src: Path) -> list[FileRecord] | None:
        """Move the local folder ``src`` (written by another tool) into the staging area with
        one rename, when the store is a local folder on the same filesystem, nothing was
        written yet and no other writer of this write holds the staging folder (a joiner's
        lock would stay on the replaced folder); then hash and sync its files and return their
        records. None (``src`` untouched) where that is not possible: copy the files instead.

        Raises:
            ConfigurationError: ``src`` is no existing folder, is a symbolic link, or holds a
                symbolic link, a special file or a folder that cannot be listed; nothing is
                moved.
            NameConflictError: ``src`` (symlinks resolved) is the store's own folder, lies
                inside it or inside any store, holds it, holds entries named like the store's
                own, or is or holds a mount point of the store's file system, before any I/O
                but looking at it (``_movein``): a committed artifact's folder or the store's
                records moved in would leave their names (and ``abort`` would delete them);
                nothing is moved.
        """
        return self._take(src, check_outside)

    def adopt(self, src: Path) -> list[FileRecord] | None:
        """:meth:`move_in` for a folder another tool wrote inside the store's own folder (a
        Hugging Face Trainer whose ``output_dir`` is the store's root): the write's own name
        (committed in place: the commit replaces it) or a folder that is no artifact.

        Raises:
            NameConflictError: before any I/O but one scan of the records, when ``src`` is not
                inside the store's own folder (use :meth:`move_in`), is its root, is or lies in
                its metadata or staging entries, or is, lies inside or holds a committed
                artifact other than this write's name, or holds a mount point of the store's
                file system (``_movein.check_adoptable``); nothing is moved.
            ConfigurationError: as for :meth:`move_in`.
        """
        return self._take(src, check_adoptable)

    def _take(
        self, src: Path, check: Callable[[Backend, Path, str, Pinned], None]
    ) -> list[FileRecord] | None:
        """``src`` pinned (its parent opened before anything is judged), ``check`` run on it,
        then :meth:`_move_in`."""
        src = check_folder(src)
        pinned = pin(src)
        try:
            check(self._c.backend, src, self.name, pinned)
            return self._move_in(pinned)
        finally:
            pinned.close()

    def _move_in(self, pinned: Pinned) -> list[FileRecord] | None:
        """:meth:`move_in` and :meth:`adopt` after their check of where ``pinned.src`` is:
        the pinned folder (still the one its path names) is the one renamed, through its
        open parent; a staging folder that is not it afterwards is renamed back and refused."""
        area, backend = self.local_area(), self._c.backend
        if area is None:
            return None
        pinned.check_unchanged()
        try:
            backend.make_folders(self._area()[:-1])  # never via a symlink
            if pinned.ident[0] != os.stat(area.parent).st_dev:
                return None
            # renamed onto the (empty) staging folder only while no other writer holds it,
            # and held, as _hold makes and holds it
            held = backend.hold_folder(self._area(), move_from=pinned.via, own=self._held)
        except (OSError, StagingTaken):
            # a file is there already, another writer holds the folder, or gc claims an
            # entry beside it now: src untouched
            return None
        self._release()  # the lock on the empty folder the move replaced
        self._keep(held)
        try:
            moved = os.stat(area)
            if (moved.st_dev, moved.st_ino) != pinned.ident:
                raise pinned.changed("named another folder")
            files = hash_and_sync_tree(area)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(area, pinned.via)
            raise
        return [FileRecord(p, s, d) for p, s, d in files]

    def commit(self, expected: Iterable[FileRecord], *, check: str = "size") -> Record:
        """Check the staging area holds exactly ``expected``, then publish the folder and its
        record through the one commit path. Call it once, on one writer, after every writer
        finished its files.

        Raises:
            CommitError: a file is missing, has another size (or, ``check="full"``, another
                digest), or an unexpected file is there; nothing is published.
            AlreadyExistsError: the name was committed meanwhile (``overwrite=False``).
        """
        started = time.monotonic()
        if check not in ("size", "full"):
            raise ConfigurationError(f"check must be 'size' or 'full', not {check!r}")
        files = _unique(self.name, expected)
        if not files:
            raise ConfigurationError(f"{self.name}: a folder commit needs at least one file")
        backend, area = self._c.backend, self._area()
        self._check_area(backend, area, files, check)
        record = make_record(
            self.name,
            self._t.step,
            self._t.metadata,
            size=sum(f.size for f in files),
            digest=manifest_digest((f.path, f.size, f.digest) for f in files),
            files=tuple(files),
            kind="dir",
        )
        mode = mode_of(self._t.overwrite)

        def publish_data() -> tuple[Record, CommitInfo | None]:
            if _in_place(backend):  # already under the name: the record is the commit
                return record, None
            return record, backend.publish_folder(area, self._parts, mode=mode)

        self.record = self._c.commit(
            self._parts,
            mode,
            publish_data,
            intent=record,
            data_in_place=_in_place(backend),
            started=started,
        )
        self._release()
        self._stop_beat()
        if _in_place(backend):
            with contextlib.suppress(CommitStoreError):  # a leftover marker: gc drops it
                backend.remove(writer_markers_parts(self._t.id))
                backend.remove(folder_marker_parts(self._t.id))
        if self._after is not None:
            self._after(self.record)
        return self.record

    def _check_area(
        self, backend: Backend, area: Parts, files: list[FileRecord], check: str
    ) -> None:
        found = {"/".join(rel): info for rel, info in backend.walk(area)}
        problems = []
        for f in files:
            info = found.pop(f.path, None)
            if info is None:
                problems.append(f"{f.path}: missing")
            elif not info.regular:
                problems.append(f"{f.path}: not a regular file")
            elif info.size != f.size:
                problems.append(f"{f.path}: {info.size} bytes stored, {f.size} recorded")
            elif check == "full":
                with backend.open_read((*area, *f.path.split("/"))) as src:
                    size, digest = hash_stream(src)
                if (size, digest) != (f.size, f.digest):
                    problems.append(f"{f.path}: digest {digest}, {f.digest} recorded")
        problems += [f"{p}: not expected" for p in sorted(found)]
        if problems:
            shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
            raise CommitError(f"{self.name}: folder not committed: {shown}")

    def abort(self) -> None:
        """Remove what was written (all writers' files). Nothing is published. Idempotent; a
        no-op after :meth:`commit`. On a writer whose folder another writer committed, it only
        stops this writer's heartbeat and removes its marker."""
        if self.record is not None:
            return
        self._closed = True
        self._release()
        self._stop_beat()
        backend = self._c.backend
        with contextlib.suppress(CommitStoreError):
            if not _in_place(backend):
                backend.remove(self._area())
            elif backend.stat(record_parts(self._parts)) is None:
                listed = self._listed(backend)
                _owned.remove_listed(backend, listed, _owned.Committed.scan(backend))
                backend.remove(writer_markers_parts(self._t.id))
                backend.remove(folder_marker_parts(self._t.id))
            else:  # committed meanwhile (by another writer): only this writer's marker goes
                backend.remove(self._marker_parts())

    def _marker(self) -> bytes:
        """This writer's marker as it is now: the folder, the write, every file it opened."""
        return _marker_body(self.name, self._t.id, self._mine)

    def _listed(self, backend: Backend) -> list[Parts]:
        """Every file the writers of this folder write listed in their markers (and this
        writer's own): exactly what an abort removes."""
        paths: list[object] = list(self._mine)
        for rel, _info in backend.walk(writer_markers_parts(self._t.id)):
            try:
                doc = json.loads(backend.read_small((*writer_markers_parts(self._t.id), *rel)))
            except (CommitStoreError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("name") == self.name:
                files = doc.get("files")
                paths += files if isinstance(files, list) else []
        return _owned.listed_paths(self._parts, paths)


def _marker_body(name: str, write_id: str, files: list[str]) -> bytes:
    """A writer's marker: the folder, the write, every file the writer opened."""
    return json.dumps({"name": name, "id": write_id, "files": list(files)}).encode()


def _unique(name: str, expected: Iterable[FileRecord]) -> list[FileRecord]:
    """The expected files, sorted, each once. Raises ConfigurationError for what is no file
    record or two records of one path, CommitError for a path that is a file and a folder of
    another (``sub`` and ``sub/x``, written by two writers: no record can name both)."""
    out: dict[str, FileRecord] = {}
    for f in expected:
        if not isinstance(f, FileRecord):
            raise ConfigurationError(f"expected FileRecords, got {type(f).__name__}")
        validate_name(f.path, inside_folder=True)
        if out.setdefault(f.path, f) != f:
            raise ConfigurationError(f"{f.path}: two different records for one file")
    folders: dict[str, str] = {}
    for path in out:
        rel = path.split("/")
        folders.update(("/".join(rel[:i]), path) for i in range(1, len(rel)))
    clash = next((p for p in sorted(out) if p in folders), None)
    if clash is not None:
        raise CommitError(
            f"{name}: folder not committed: {clash} is a file and also the folder of "
            f"{folders[clash]}; nothing was published"
        )
    return sorted(out.values(), key=lambda f: f.path)


def begin(
    committer: Committer,
    name: str,
    step: object,
    metadata: Mapping[str, Any] | None,
    overwrite: bool,
    *,
    after: Callable[[Record], None] | None = None,
) -> FolderWrite:
    """Start a multi-writer folder commit of ``name`` (see the module docstring)."""
    parts, checked, meta = check_new(name, step, metadata)
    backend = committer.backend
    if not isinstance(overwrite, bool):
        raise ConfigurationError(f"overwrite must be a bool, not {type(overwrite).__name__}")
    if _in_place(backend) and overwrite:
        raise ConfigurationError(
            f"{committer.url}: a folder written by several processes cannot replace a committed "
            "one on an object store (its files would change before the record); commit it "
            "under a new name"
        )
    if not _in_place(backend) and type(backend).publish_folder is Backend.publish_folder:
        raise ConfigurationError(
            f"{committer.url}: the {backend.strategy} strategy has no multi-writer folder commit"
        )
    committer.check_place(parts)
    if not overwrite:
        committer.check_name_free(parts)
    token = _Token(secrets.token_hex(8), name, overwrite, checked, meta, committer.url)
    if _in_place(backend):
        body = json.dumps({"name": name, "id": token.id, "files": []}).encode()
        put_small(backend, folder_marker_parts(token.id), body, PutMode.REPLACE)
    return FolderWrite(committer, token, after=after)


def join(
    committer: Committer, token: str, *, after: Callable[[Record], None] | None = None
) -> FolderWrite:
    """The same folder write, in another process (or on another host) with its own store."""
    parsed = _parse_token(token)
    if parsed.store != committer.url:
        raise ConfigurationError(
            f"folder token is for {parsed.store}, not for this store ({committer.url})"
        )
    check_open(committer.backend, parsed)
    return FolderWrite(committer, parsed, after=after)


def check_open(backend: Backend, token: _Token) -> None:
    """Raise if the folder write of ``token`` is no longer open, before anything is written.

    Object stores (files go to their final keys, so a late file would land inside the
    committed folder): the write's marker is gone once it is committed, aborted or removed by
    gc; then AlreadyExistsError if the folder has its record, CommitError otherwise. Elsewhere
    (files go to a staging folder): AlreadyExistsError if a create-only write's name has a
    record (it can never be committed). One stat (two when refusing)."""
    parts = validate_name(token.name)
    if _in_place(backend):
        if backend.stat(folder_marker_parts(token.id)) is not None:
            return
    elif token.overwrite:
        return
    if backend.stat(record_parts(parts)) is not None:
        raise AlreadyExistsError(
            f"{token.name} is committed: its folder write is closed and takes no more files "
            "(nothing was written)",
            name=token.name,
        )
    if _in_place(backend):
        raise CommitError(
            f"{token.name}: this folder write is no longer open (aborted, or removed by gc as "
            "dead); nothing was written"
        )


__all__ = ["FolderFile", "FolderWrite", "begin", "join"]
