"""What ``commit://`` (:mod:`commitstore.fsspec`) is made of: the committing file object, the
listing built from records, and verified reads of files inside folder artifacts."""

from __future__ import annotations

import contextlib
import io
import sys
from types import FrameType, TracebackType
from typing import Any

from commitstore import Stage
from commitstore.errors import CommitStoreError, NotFoundError
from commitstore.records import Record
from commitstore.store import CommitStore

_OPTIONS = ("step", "metadata")
"""Keywords of ``open(..., "wb", ...)`` that reach the commit."""


class CommitFile(io.RawIOBase):
    """A writable file that commits on an explicit ``close()`` or a clean ``with`` exit, and
    only then (see the module docstring of :mod:`commitstore.fsspec`).

    - ``with fs.open(...)``: the exit's own exception decides.
    - ``with fsspec.open(...)``: fsspec's ``OpenFile.__exit__`` only calls ``close()``; the
      exception it was given is read from that call, so it decides exactly as well (a bare
      ``raise`` of the exception handled at open included).
    - Any other ``close()``: an exception in flight aborts, unless it is the one that was being
      handled when the file was opened and has not been raised again since (its traceback is
      the same object).
    - A file dropped without ``close()`` (garbage collection, interpreter exit) is aborted by
      its finalizer: a finalizer never commits.
    """

    def __init__(self, stage: Stage, *, autocommit: bool, url: str = "") -> None:
        super().__init__()
        self._stage = stage
        self._url = url
        self.autocommit = autocommit
        handling = sys.exc_info()[1]
        self._handling = (handling, None if handling is None else handling.__traceback__)
        """The exception being handled when the file was opened, with its traceback then: not a
        reason to abort while it is not raised again."""
        self.record: Record | None = None

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return self._stage.write(b)

    def tell(self) -> int:
        return self._stage.tell()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.discard()
        else:
            self.close()

    def __del__(self) -> None:
        # A finalizer never commits: a file that was not closed is discarded.
        with contextlib.suppress(Exception):
            if not self.closed:
                self.discard()

    def close(self) -> None:
        """Commit (outside a transaction) unless an exception is propagating; idempotent."""
        if self.closed:
            return
        if self._propagating():
            self.discard()
            return
        if self.autocommit:
            self.commit()
        super().close()

    def _propagating(self) -> bool:
        exiting = _openfile_exit_exception()
        if exiting is not _NOT_UNDER_EXIT:
            return exiting is not None
        current = sys.exc_info()[1]
        if current is None:
            return False
        handled, tb = self._handling
        return current is not handled or current.__traceback__ is not tb

    @property
    def name(self) -> str:
        """The artifact name this file commits to (in its store)."""
        return self._stage.name

    @property
    def store_url(self) -> str:
        """The URL of the store this file commits to."""
        return self._url

    def check(self) -> None:
        """:meth:`Stage.check <commitstore.Stage.check>`: what the commit checks before it
        publishes anything, run now (a transaction runs it on every file first)."""
        self._stage.check()

    def commit(self) -> None:
        """Publish the bytes with their record (what a transaction calls at its end)."""
        self.record = self._stage.commit()
        super().close()

    def discard(self) -> None:
        """Publish nothing."""
        self._stage.abort()
        super().close()


_NOT_UNDER_EXIT = object()
_EXIT_DEPTH = 6
"""Frames above ``close()`` searched for fsspec's ``OpenFile.__exit__``."""


def _openfile_exit_exception() -> object:
    """The exception given to an enclosing ``fsspec.core.OpenFile.__exit__`` (None on a clean
    exit), or ``_NOT_UNDER_EXIT`` when ``close()`` was not called from one."""
    from fsspec.core import OpenFile

    code = OpenFile.__exit__.__code__
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_EXIT_DEPTH):
        if frame is None:
            break
        if frame.f_code is code:
            args = frame.f_locals.get("args", ())
            return args[1] if isinstance(args, tuple) and len(args) > 1 else None
        frame = frame.f_back
    return _NOT_UNDER_EXIT


def commit_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in _OPTIONS if k in kwargs}


def folder_owner(store: CommitStore, name: str) -> tuple[Record, str] | None:
    """The folder artifact that holds ``name`` as one of its files, and its path: the folder as
    the version it verifies as (``store.record(..., level="size")``: its record, or the pending
    version of a commit in flight or stopped after its data step; an object-store replace
    stopped among its copies leaves files of both versions under the name), decided for the
    folder as a whole before any file of it is opened, so no two files of one folder are ever
    served from two versions of it; its stored record where it verifies as none (the read of
    the file then fails loud). One size-level check of the folder per call (a walk). None
    where the version holds no such file."""
    parts = name.split("/")
    for i in range(len(parts) - 1, 0, -1):
        try:
            rec = store.record("/".join(parts[:i]))
        except (NotFoundError, ValueError):
            continue
        member = "/".join(parts[i:])
        if rec.kind != "dir":
            return None
        # verifies as no version: the stored record, and the member read fails against it
        with contextlib.suppress(CommitStoreError):
            rec = store.record(rec.name, level="size")
        if any(f.path == member for f in rec.files):
            return rec, member
        return None
    return None


def children(records: list[Record], prefix: str, base: str) -> dict[str, dict[str, Any]]:
    """Entries directly under ``prefix`` (``base`` is its inner path): artifacts, implicit
    folders, and inside a folder artifact its recorded files."""
    out: dict[str, dict[str, Any]] = {}
    lead = f"{prefix}/" if prefix else ""

    def join(rest: str) -> str:
        return f"{base.rstrip('/')}/{rest}"

    for rec in records:
        if (
            rec.kind == "dir"
            and prefix
            and (rec.name == prefix or prefix.startswith(rec.name + "/"))
        ):
            inside = prefix[len(rec.name) + 1 :]
            for f in rec.files:
                if inside and not f.path.startswith(inside + "/"):
                    continue
                head, _, tail = f.path[len(inside) + 1 if inside else 0 :].partition("/")
                full = join(head)
                out[full] = dir_info(full) if tail else member_info(full, f.size, f.digest, rec)
            continue
        if not rec.name.startswith(lead):
            continue
        head, _, tail = rec.name[len(lead) :].partition("/")
        full = join(head)
        if tail:
            out.setdefault(full, dir_info(full))
        elif rec.kind == "dir":
            out[full] = dir_info(full, rec)
        else:
            out[full] = record_info(full, rec)
    return out


def dir_info(full: str, rec: Record | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"name": full, "size": 0, "type": "directory"}
    if rec is not None:
        info.update(artifact=rec.name, digest=rec.digest, step=rec.step, created=rec.created)
        info["size"] = rec.size
    return info


def record_info(full: str, rec: Record) -> dict[str, Any]:
    return {
        "name": full,
        "size": rec.size,
        "type": "file",
        "digest": rec.digest,
        "step": rec.step,
        "created": rec.created,
        "metadata": dict(rec.metadata),
        "artifact": rec.name,
    }


def member_info(full: str, size: int, digest: str, rec: Record) -> dict[str, Any]:
    return {
        "name": full,
        "size": size,
        "type": "file",
        "digest": digest,
        "step": rec.step,
        "created": rec.created,
        "artifact": rec.name,
    }
