"""What ``commit://`` (:mod:`commitstore.fsspec`) is made of: the committing file object, the
listing built from records, and verified reads of files inside folder artifacts."""

from __future__ import annotations

import io
import sys
from types import TracebackType
from typing import Any, BinaryIO

from commitstore import _read
from commitstore._check import compare
from commitstore._stage import Stage
from commitstore.digest import hash_stream
from commitstore.errors import NotFoundError
from commitstore.layout import validate_name
from commitstore.records import Record
from commitstore.store import CommitStore

_OPTIONS = ("step", "metadata")
"""Keywords of ``open(..., "wb", ...)`` that reach the commit."""


class CommitFile(io.RawIOBase):
    """A writable file that commits on a clean close (see the module docstring)."""

    def __init__(self, stage: Stage, *, autocommit: bool) -> None:
        super().__init__()
        self._stage = stage
        self.autocommit = autocommit
        self._handling = sys.exc_info()[1]
        """The exception being handled when the file was opened: not a reason to abort."""
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

    def close(self) -> None:
        """Commit (outside a transaction) unless an exception is propagating; idempotent."""
        if self.closed:
            return
        propagating = sys.exc_info()[1]
        if propagating is not None and propagating is not self._handling:
            self.discard()
            return
        if self.autocommit:
            self.commit()
        super().close()

    def commit(self) -> None:
        """Publish the bytes with their record (what a transaction calls at its end)."""
        self.record = self._stage.commit()
        super().close()

    def discard(self) -> None:
        """Publish nothing."""
        self._stage.abort()
        super().close()


def commit_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in _OPTIONS if k in kwargs}


def folder_owner(store: CommitStore, name: str) -> tuple[Record, str] | None:
    """The folder artifact that holds ``name`` as one of its recorded files, and its path."""
    parts = name.split("/")
    for i in range(len(parts) - 1, 0, -1):
        try:
            rec = store.record("/".join(parts[:i]))
        except (NotFoundError, ValueError):
            continue
        member = "/".join(parts[i:])
        if rec.kind == "dir" and any(f.path == member for f in rec.files):
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


def open_member(store: CommitStore, rec: Record, member: str) -> BinaryIO:
    """A file of a folder artifact, hashed whole and checked against its entry before any byte
    is handed out (then rewound)."""
    entry = next(f for f in rec.files if f.path == member)
    validate_name(f"{rec.name}/{member}", inside_folder=True)
    f = _read._open_data(store.backend, rec, member)
    try:
        size, digest = hash_stream(f)
        found = compare(
            entry.size, entry.digest, found_size=size, found_digest=digest, level="full"
        )
        if found is not None:
            raise found.error(rec.name, member)
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return f
