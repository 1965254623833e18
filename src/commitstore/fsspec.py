"""``commit://``: commitstore as an fsspec filesystem, for every tool that opens paths with fsspec.

Registered under the protocol ``commit`` (entry point ``fsspec.specs``), alone or chained::

    fsspec.open("commit:///data/run1/x.pt", "wb")                  # a local store
    fsspec.open("commit::s3://bucket/run1/x.pt", "wb", s3={...})   # over any commitstore URL
    fs = fsspec.filesystem("commit", fo="s3://bucket/run1", target_options={...})

Where the store is: the ``root`` option when given (``commit={"root": "s3://bucket/run1"}`` with
``fsspec.open``, or ``fo=``/``root=`` when creating the filesystem); otherwise the folder of the
path opened, unless that folder is (or lies inside) a committed folder artifact of a store above
it: then that store (a store root is never placed inside a folder artifact; writes into one are
refused with ``AlreadyExistsError``). Paths are the inner filesystem's paths
(``bucket/run1/x.pt``, ``/data/run1/x.pt``) and name artifacts by their place under the root
(``x.pt``).

Guarantees (each tested in ``tests/test_fsspec_fs.py``):

- **Writes are commits.** A file opened ``"wb"`` is a :class:`~commitstore.Stage`: its bytes are
  hashed on the way and published with a record when it is closed cleanly. ``"xb"`` is create-only
  (``FileExistsError`` if the name is committed). **Only an explicit ``close()`` or a clean
  ``with`` exit commits**: an exception inside ``with fsspec.open(..., "wb")`` publishes nothing
  (the exception given to fsspec's ``OpenFile.__exit__`` is read there, a bare ``raise`` of the
  exception handled at open included), any other ``close()`` aborts while an exception other
  than the one handled at open (with its traceback then) propagates, and a file never closed is
  discarded by its finalizer (see :class:`~commitstore._fsview.CommitFile`). Inside
  ``fs.transaction`` files commit when the transaction ends without an exception and are all
  discarded otherwise (:class:`CommitTransaction`): every file is checked first (bytes, name,
  create-only names still free), and a failing check discards all of them, publishing nothing.
  There is no atomic commit of several names: a commit that still fails after those checks
  (the storage failing mid-way, a name taken between check and commit) leaves the files before
  it committed (new versions), that file and the ones after it discarded (old versions), and
  raises :class:`~commitstore.errors.TransactionError` naming each group.
- **Reads are verified.** ``open(..., "rb")``, ``cat`` and ``get`` hand out bytes only after they
  matched the record (an :class:`~commitstore.IntegrityError` otherwise), files inside a folder
  artifact included (checked against their own entry of the folder's record).
- **Listings show committed artifacts only.** ``ls``/``info``/``find`` come from the records:
  sizes are the recorded sizes, and ``info`` carries the ``digest`` (and ``step``, ``created``,
  ``metadata``); staging files and files without a record are not shown. A folder artifact is a
  directory whose files are its recorded files.
- ``rm`` deletes whole artifacts through the store (record first); a file inside a folder
  artifact cannot be removed alone (``PermissionError``). Directories are implicit: ``mkdir`` does
  nothing and ``rmdir`` removes nothing.
- No fsspec instance cache (``cachable = False``) and no shared autocommit state: every
  filesystem object opens its own stores.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import Any, BinaryIO

from fsspec import AbstractFileSystem
from fsspec.transaction import Transaction

try:  # fsspec >= 2025: chained URLs hand the inner path to a ChainedFileSystem
    from fsspec.implementations.chained import ChainedFileSystem as _Base
except ImportError:  # pragma: no cover - older fsspec: the empty path is mapped to ``fo`` below
    _Base = AbstractFileSystem

from commitstore._fsview import (
    CommitFile,
    children,
    commit_options,
    dir_info,
    folder_owner,
    member_info,
    record_info,
)
from commitstore.errors import (
    ConfigurationError,
    IntegrityError,
    NameConflictError,
    NotFoundError,
    TransactionError,
)
from commitstore.layout import META_DIR, RECORDS_DIR
from commitstore.store import CommitStore


def _below(base: str, inner: str) -> str:
    """``inner``'s path below ``base`` (one of its ancestors)."""
    return inner[len(base.rstrip("/")) + 1 :]


class CommitTransaction(Transaction):  # type: ignore[misc]
    """``fs.transaction`` of ``commit://``: the files closed inside it commit at its end, in the
    order they were closed, or are all discarded (an exception ends the transaction).

    Guarantees: before the first commit, every file is checked (:meth:`CommitFile.check`); one
    that fails discards all and raises that file's error: nothing is published. Then each file
    commits in order; several names cannot be published in one step, so a commit that fails
    after the checks (a storage failure, a name taken meanwhile) stops there: the files before
    it are committed (their new versions stand), it and the files after it are discarded (their
    names keep the old version), and :class:`~commitstore.errors.TransactionError` says which
    names are in each group (its ``__cause__``: that commit's error). Each file is its old or
    its new version; none is half of one.
    """

    def complete(self, commit: bool = True) -> None:
        files: list[Any] = list(self.files)
        self.files.clear()
        try:
            if commit:
                _commit_all(files)
        finally:
            for f in files:  # a committed file's discard does nothing
                with contextlib.suppress(Exception):
                    f.discard()
            fs: Any = getattr(self, "fs", None)
            if fs is not None:
                fs._intrans = False
                fs._transaction = None
                self.fs = None


def _shown(f: Any) -> str:
    name = getattr(f, "name", None)
    url = getattr(f, "store_url", "")
    return f"{url.rstrip('/')}/{name}" if url and name else str(name or f)


def _commit_all(files: list[Any]) -> None:
    """Check every file, then commit each in order (see :class:`CommitTransaction`)."""
    for f in files:
        check = getattr(f, "check", None)
        if check is not None:
            check()  # raises: nothing published (the caller discards every file)
    done: list[str] = []
    for i, f in enumerate(files):
        try:
            f.commit()
        except Exception as exc:
            rest = [_shown(g) for g in files[i + 1 :]]
            failed = _shown(f)
            raise TransactionError(
                f"transaction stopped at {failed} ({type(exc).__name__}: {exc}): committed, "
                f"new versions stand: {', '.join(done) or 'none'}; not committed, old versions "
                f"stand: {', '.join([failed, *rest])}",
                committed=done,
                failed=failed,
                discarded=rest,
            ) from exc
        done.append(_shown(f))


class CommitFileSystem(_Base):  # type: ignore[misc]
    """fsspec's view of commitstores: writes commit, reads verify, listings show records."""

    protocol = ("commit",)
    cachable = False
    transaction_type = CommitTransaction
    root_marker = ""

    def __init__(
        self,
        fo: str = "",
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        root: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.target_protocol = target_protocol or "file"
        self.target_options = dict(target_options or {})
        self.target_options.update(kwargs)
        self._fo = fo
        self._root = self._inner(root) if root else None
        self._stores: dict[str, CommitStore] = {}

    # -- paths ----------------------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        for p in ("commit::", "commit://"):
            if text.startswith(p):
                text = text[len(p) :]
        return text.rstrip("/") or text[:1]

    def _inner(self, path: str) -> str:
        """``path`` as the inner filesystem's path (any protocol prefix removed)."""
        path = self._strip_protocol(path) or self._fo
        if "://" in path:
            proto, _, path = path.partition("://")
            if self.target_protocol == "file" and proto not in ("file", "local"):
                self.target_protocol = proto
        return path.rstrip("/") or "/"

    def _url(self, inner: str) -> str:
        if self.target_protocol in ("file", "local"):
            return inner
        return f"{self.target_protocol}://{inner}"

    def _store(self, root: str) -> CommitStore:
        store = self._stores.get(root)
        if store is None:
            from commitstore import open_store

            store = open_store(self._url(root), **self.target_options)
            store.warn_missing = False  # a path that is no store is FileNotFoundError here
            self._stores[root] = store
        return store

    def _file(self, path: str) -> tuple[CommitStore, str]:
        """The store and artifact name of a file path: under ``root``; without it, in the path's
        folder, unless that folder is (or is inside) a committed folder artifact: then in the
        store that holds the artifact (a write there is refused by that store)."""
        inner = self._inner(path)
        if self._root is None:
            folder, _, name = inner.rpartition("/")
            owner = self._folder_artifact(folder or "/")
            if owner is not None:
                return self._store(owner), _below(owner, inner)
            return self._store(folder or "/"), name
        return self._store(self._root), self._under_root(inner, path)

    def _folder(self, path: str) -> tuple[CommitStore, str, str]:
        """The store, name prefix and inner path of a folder path (without ``root``, the folder
        is itself a store's root, unless it is or lies inside a committed folder artifact: then
        the store holding that artifact)."""
        inner = self._inner(path)
        if self._root is None:
            owner = self._folder_artifact(inner)
            if owner is not None:
                return self._store(owner), _below(owner, inner), inner
            return self._store(inner), "", inner
        return self._store(self._root), self._under_root(inner, path), inner

    def _folder_artifact(self, inner: str) -> str | None:
        """The root of the nearest store in which ``inner`` is a committed folder artifact or a
        path inside one; None if there is none. Root-less paths never place a store root inside
        a committed folder artifact (its record would no longer match the folder).

        Each ancestor is tried nearest first; on a local disk only those holding a records
        folder are opened. A record that is unreadable or a name that is not valid is not an
        owner."""
        local = self.target_protocol in ("file", "local")
        lead = "/" if inner.startswith("/") else ""
        parts = [p for p in inner.split("/") if p]
        for k in range(len(parts) - 1, -1 if local else 0, -1):
            base = lead + "/".join(parts[:k]) or "/"
            if local and not os.path.isdir(os.path.join(base, META_DIR, RECORDS_DIR)):
                continue
            store = self._store(base)
            rel = parts[k:]
            for j in range(len(rel), 0, -1):
                try:
                    rec = store.record("/".join(rel[:j]))
                except (NotFoundError, IntegrityError, ValueError):
                    continue
                if rec.kind == "dir":
                    return base
                break
        return None

    def _under_root(self, inner: str, shown: str) -> str:
        assert self._root is not None
        if inner == self._root:
            return ""
        prefix = self._root.rstrip("/") + "/"
        if not inner.startswith(prefix):
            raise ConfigurationError(f"{shown}: not under the store root {self._url(self._root)}")
        return inner[len(prefix) :]

    # -- reads ----------------------------------------------------------------------------
    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Any = None,
        autocommit: bool = True,
        cache_options: Any = None,
        **kwargs: Any,
    ) -> BinaryIO | CommitFile:
        store, name = self._file(path)
        if mode == "rb":
            return self._open_read(store, name)
        if mode not in ("wb", "xb"):
            raise ConfigurationError(f"{path}: mode {mode!r}: commit:// files are rb, wb or xb")
        stage = store.stage(name, overwrite=mode == "wb", **commit_options(kwargs))
        return CommitFile(stage, autocommit=autocommit, url=store.url)

    def _open_read(self, store: CommitStore, name: str) -> BinaryIO:
        try:
            return store.open(name)
        except NotFoundError:
            owner = folder_owner(store, name)
            if owner is None:
                raise
        rec, member = owner
        try:
            return store.open_member(rec, member)
        except IntegrityError:
            # the folder may verify as a newer version (a commit that stopped after its data
            # step): decided for the folder as a whole, then the member read against that one
            version = store.record(rec.name, level="size")
            if version == rec or not any(f.path == member for f in version.files):
                raise
            return store.open_member(version, member)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        store, name = self._file(path)
        if folder_owner(store, name) is None:
            data = store.read_bytes(name)
        else:
            with self._open_read(store, name) as f:
                data = f.read()
        return data[start:end]

    def get_file(self, rpath: str, lpath: str, callback: Any = None, **kwargs: Any) -> None:
        """A verified copy to ``lpath`` (a folder in the listing becomes a local folder)."""
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        store, name = self._file(rpath)
        if folder_owner(store, name) is None:
            store.get_file(name, lpath)
            return
        with self._open_read(store, name) as src, open(lpath, "wb") as dst:
            dst.write(src.read())

    # -- writes ---------------------------------------------------------------------------
    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        store, name = self._file(path)
        store.put_bytes(name, value, overwrite=mode == "overwrite", **commit_options(kwargs))

    def put_file(
        self, lpath: str, rpath: str, callback: Any = None, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        """Commit the local file ``lpath`` (a local folder: nothing, folders are implicit)."""
        if os.path.isdir(lpath):
            return
        store, name = self._file(rpath)
        store.put_file(name, lpath, overwrite=mode == "overwrite", **commit_options(kwargs))

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """A verified copy: the source's bytes are checked before the copy commits."""
        src_store, src_name = self._file(path1)
        dst_store, dst_name = self._file(path2)
        with (
            self._open_read(src_store, src_name) as src,
            dst_store.stage(dst_name, overwrite=True, **commit_options(kwargs)) as dst,
        ):
            shutil.copyfileobj(src, dst, 8 << 20)

    def rm_file(self, path: str) -> None:
        store, name = self._file(path)
        if folder_owner(store, name) is not None:
            raise PermissionError(f"{path}: a file of a folder artifact; delete the whole folder")
        store.delete(name)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Delete artifacts; ``recursive=True`` on a folder deletes every artifact under it, each
        by its own record. Without it, a folder path that holds committed artifacts (and is not
        one itself) is refused with ``IsADirectoryError``, nothing deleted."""
        for p in path if isinstance(path, list) else [path]:
            if recursive and self.isdir(p):
                store, prefix, _ = self._folder(p)
                for rec in store.list():
                    if not prefix or rec.name == prefix or rec.name.startswith(prefix + "/"):
                        store.delete(rec.name)
                continue
            try:
                self.rm_file(p)
            except NameConflictError as exc:
                raise IsADirectoryError(
                    errno.EISDIR, f"{exc} (rm(..., recursive=True) deletes each of them)", p
                ) from exc

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Directories are implicit in artifact names: nothing to create."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Directories are implicit in artifact names: nothing to create."""

    def rmdir(self, path: str) -> None:
        """Directories are implicit: nothing to remove (``rm(recursive=True)`` deletes)."""

    # -- listings -------------------------------------------------------------------------
    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        store, prefix, inner = self._folder(path)
        entries = children(store.list(), prefix, inner)
        if not entries:
            one = self._file_info(path)
            if one is None or one["type"] != "file":
                if one is None:
                    raise FileNotFoundError(path)
            else:
                entries = {one["name"]: one}
        items = sorted(entries.values(), key=lambda e: e["name"])
        return items if detail else [e["name"] for e in items]

    def _file_info(self, path: str) -> dict[str, Any] | None:
        inner = self._inner(path)
        try:
            store, name = self._file(path)
        except ConfigurationError:
            return None
        if not name:
            return None
        try:
            rec = store.record(name)
        except (NotFoundError, ValueError):
            owner = folder_owner(store, name)
            if owner is None:
                return None
            rec, member = owner
            entry = next(f for f in rec.files if f.path == member)
            return member_info(inner, entry.size, entry.digest, rec)
        return record_info(inner, rec) if rec.kind == "file" else dir_info(inner, rec)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        found = self._file_info(path)
        if found is not None:
            return found
        store, prefix, inner = self._folder(path)
        if children(store.list(), prefix, inner):
            return dir_info(inner)
        raise FileNotFoundError(path)

    def created(self, path: str) -> Any:
        return self.info(path)["created"]

    def modified(self, path: str) -> Any:
        return self.info(path)["created"]

    def close(self) -> None:
        """Close every store this filesystem opened (waits for their mirrors)."""
        for store in self._stores.values():
            store.close()
        self._stores.clear()
