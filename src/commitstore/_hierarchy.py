"""Names are paths: what sits below a name, and removals that never reach another name.

``runs/step_1.pt`` and ``runs/step_2.pt`` may be committed while ``runs`` is not an artifact,
only the folder path holding them. Every artifact's record lives at the same path below
``.commitstore/records/`` as its data below the root (``layout.record_parts``), so the records
folder of ``runs`` (``.commitstore/records/runs/``) holds exactly the records, and the pending
records of commits in flight, of the artifacts below ``runs``: one listing answers "does this
path hold other committed artifacts?" without reading any data.

Guarantees (used by ``_commit``): a folder path holding committed artifacts is never deleted or
replaced as a whole (the caller raises ``NameConflictError`` first); a delete removes the files
its record names and nothing else (:func:`remove_data`).
"""

from __future__ import annotations

import json
from typing import Protocol

from commitstore.backends import Backend, FileInfo
from commitstore.errors import CommitStoreError, InvalidNameError
from commitstore.layout import (
    FOLDERS_DIR,
    META_DIR,
    RECORDS_DIR,
    Parts,
    is_intent_leaf,
    is_record_leaf,
    name_from_record_parts,
    record_of_intent,
    validate_name,
)
from commitstore.records import Record


class Lists(Protocol):
    """What :func:`committed_below` needs of a backend (any ``Backend``, or the object
    stores' folder sink view of one)."""

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]: ...


SHOWN = 3
"""How many of the names below a refused path an error message lists."""


def committed_below(backend: Lists, parts: Parts) -> list[str]:
    """The names of the artifacts committed below the folder path ``parts`` (``parts/...``,
    never ``parts`` itself), and of those with a commit in flight (a pending record), sorted.
    One listing of the records folder of ``parts``; a record whose leaf is hashed (a long final
    part) is shown as ``<folder>/...``. Files there that are neither records nor pending records
    are not artifacts and are ignored.

    Raises:
        StorageError, BackendUnavailableError: the listing failed (callers refuse then).
    """
    found: set[str] = set()
    for found_rel, _info in backend.walk((META_DIR, RECORDS_DIR, *parts)):
        leaf = found_rel[-1]
        if is_intent_leaf(leaf):
            rel = record_of_intent(found_rel)
        elif is_record_leaf(leaf):
            rel = found_rel
        else:
            continue
        full = (*parts, *rel)
        found.add(name_from_record_parts(full) or "/".join((*full[:-1], "...")))
    return sorted(found)


def folder_writes_over(backend: Backend, parts: Parts) -> list[str]:
    """The names of the multi-writer folder writes in progress (object stores: their markers
    under ``.commitstore/folders/``, ``_folderwrite``) that a removal of everything at ``parts``
    would reach: a write of ``parts`` itself, of a name below it, or of a folder it lies in.
    A write whose writers died counts until gc (or its ``abort``) removes its markers. One
    listing of the markers folder, one small read per marker; a marker that cannot be read or
    names nothing valid is skipped. Storage with staging names has no markers: ``[]``.

    Raises:
        StorageError, BackendUnavailableError: the listing failed (callers refuse then).
    """
    if backend.capabilities.staging_names:
        return []
    found: set[str] = set()
    for rel, _info in backend.walk((META_DIR, FOLDERS_DIR)):
        try:
            doc = json.loads(backend.read_small((META_DIR, FOLDERS_DIR, *rel)))
            name = validate_name(doc["name"]) if isinstance(doc, dict) else None
        except (CommitStoreError, InvalidNameError, ValueError, KeyError, TypeError):
            continue
        n = min(len(name or ()), len(parts))
        if name is not None and name[:n] == parts[:n]:
            found.add("/".join(name))
    return sorted(found)


def shown(names: list[str]) -> str:
    """The first few of ``names`` for a message."""
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def remove_data(backend: Backend, parts: Parts, owns: list[Record]) -> bool:
    """Remove the data of the artifact at ``parts`` whose records are ``owns`` (its record and
    the pending record of a commit that stopped after its data step; empty: none can be read),
    after those records. True if anything was there.

    * a folder record: exactly the files the folder records name (all of them: a replace that
      stopped may have left either version's files), then the folders below ``parts`` (and
      ``parts``) that this leaves empty; a file no record names stays, and so its folder;
    * a file record: the entry at ``parts`` only if it is a file (a folder there is not its data);
    * no record: whatever is at ``parts`` (data nothing claims; the caller has checked that no
      committed artifact is below it).

    The records are already gone, so nothing removed here can come back claiming to be whole:
    the removals need no folder sync of their own (``Backend.remove_leftover``).
    """
    if not owns:
        info = backend.stat(parts)
        return info is not None and backend.remove(parts)
    removed = False
    if any(r.kind == "file" for r in owns):
        info = backend.stat(parts)
        if info is not None and not info.is_dir:
            removed = backend.remove_leftover(parts)
    folders = [r for r in owns if r.kind == "dir"]
    if folders:
        files = sorted({tuple(f.path.split("/")) for r in folders for f in r.files})
        removed = backend.remove_files(parts, files) or removed
    return removed
