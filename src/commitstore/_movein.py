"""Where a folder handed to :meth:`FolderWrite.move_in` or :meth:`FolderWrite.adopt` may lie.

A folder moved into a write leaves its own name: the rename takes it (and everything under it)
into the write's staging area, and an ``abort`` deletes it. So a committed artifact's folder, the
store's records and staging area, or a folder holding them must never be moved in.

- :func:`check_outside`, for ``move_in``: the folder lies outside the store's own folder and
  does not hold it (symlinks resolved).
- :func:`check_adoptable`, for ``adopt``: the folder lies inside the store's own folder (a
  Trainer whose ``output_dir`` is the store's root wrote it there), is not the root, is not and
  does not lie in the store's metadata folder or its entries beside artifacts
  (``.commitstore.*``: staging folders, pending records), and is neither a committed artifact
  (other than the write's own name, which the commit replaces), nor inside one, nor a folder
  holding one.

Both only resolve paths and read records: nothing is moved or changed.
"""

from __future__ import annotations

import os
from pathlib import Path

from commitstore._scan import list_records
from commitstore.backends import Backend
from commitstore.errors import NameConflictError
from commitstore.layout import META_DIR

__all__ = ["check_adoptable", "check_outside"]

_INTERNAL = META_DIR + "."
"""The prefix of the store's own entries beside artifacts (staging folders, pending records)."""


def _resolved(src: Path) -> tuple[str, str]:
    """The entry a rename of ``src`` moves (its parent's symlinks resolved) and what ``src``
    itself resolves to."""
    path = os.path.abspath(os.fspath(src))
    entry = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    return entry, os.path.realpath(path)


def check_outside(backend: Backend, src: Path, name: str) -> None:
    """Raise NameConflictError when ``src`` is the store's own folder, lies inside it or holds
    it (each of the entry moved and what it points to). No-op for a store that is no local
    folder."""
    root = backend.local_root()
    if root is None:
        return
    for where in _resolved(src):
        common = os.path.commonpath((root, where))
        if common in (root, where):
            raise NameConflictError(
                f"{src} is {'inside' if common == root else 'a folder holding'} the "
                f"store's own folder ({root}): moving it into {name}'s staging area "
                "would take committed artifacts or the store's records with it, so it is "
                "refused and nothing was moved; pass a folder outside the store (or "
                "FolderWrite.adopt for a folder written inside it that is no artifact)",
                name=name,
            )


def check_adoptable(backend: Backend, src: Path, name: str) -> None:
    """Raise NameConflictError unless ``src`` may be adopted by the write of ``name`` (module
    docstring): inside the store's own folder (entry and target alike), below its root, not
    in its metadata or staging entries, and no committed artifact other than ``name`` at,
    above or below it (one scan of the records)."""

    def refuse(why: str) -> NameConflictError:
        return NameConflictError(
            f"{src} {why}: adopting it into {name}'s staging area could take committed "
            "artifacts or the store's records with it, so it is refused and nothing was moved",
            name=name,
        )

    root = backend.local_root()
    if root is None:
        raise refuse("cannot be adopted: the store is no local folder")
    rels: list[tuple[str, ...]] = []
    for where in _resolved(src):
        if os.path.commonpath((root, where)) != root or where == root:
            raise refuse(f"is not a folder inside the store's own folder ({root})")
        rel = tuple(Path(os.path.relpath(where, root)).parts)
        if any(part == META_DIR or part.startswith(_INTERNAL) for part in rel):
            raise refuse("is or lies in the store's own metadata or staging entries")
        rels.append(rel)
    for record in list_records(backend):
        if record.name == name:
            continue  # the write's own name: its commit replaces it
        committed = tuple(record.name.split("/"))
        for rel in rels:
            n = min(len(rel), len(committed))
            if rel[:n] == committed[:n]:
                where = "holds" if len(rel) < len(committed) else "is or lies in"
                raise refuse(f"{where} the committed artifact {record.name!r}")
