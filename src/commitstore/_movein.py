"""Where a folder handed to :meth:`FolderWrite.move_in` or :meth:`FolderWrite.adopt` may lie.

A folder moved into a write leaves its own name: the rename takes it (and everything under it)
into the write's staging area, and an ``abort`` deletes it. So a committed artifact's folder, a
commit in progress, the store's records and staging entries, or a folder holding any of them
must never be moved in.

- :func:`check_outside`, for ``move_in``: the folder lies outside the store's own folder and
  does not hold it.
- :func:`check_adoptable`, for ``adopt``: the folder is the write's own path, not committed
  (a Trainer whose ``output_dir`` is the store's root wrote it there), or another folder inside
  the store that is no artifact; never a symlink, never the root; no part of its path nor any
  entry below it is the store's metadata folder or one of its ``.commitstore*`` entries (case
  folded, for file systems that fold case); no record or pending record (a commit in progress)
  names it, a folder above it or anything below it; not a folder holding the write's own path
  nor inside it.

Whether a path lies inside the store is decided by the identity (device, inode) of its folders
against the root's, not by spelling, so symlinks, ``..`` after a symlink, and case folding file
systems cannot hide it. ``..`` is never collapsed before symlinks are resolved.

Both also list ``src`` (:func:`scan`, which ``hf.commit_folder`` runs before it copies a
folder) and refuse: a symbolic link, FIFO, socket or device anywhere in it (symlinks are not
stored, and a copy would follow them); an entry named like the store's own (another writer's
staging, a store's metadata); a folder that cannot be listed; a mount point on the store's
file system (a bind mount can show a committed folder under another path, where neither
spelling nor the identity of the folders above it gives it away). ``move_in`` also refuses a
folder inside any store (one with a ``.commitstore`` folder above it): a store whose root was
renamed while open is still a store. ``adopt`` lists ``src`` before it reads the records, so a
commit below ``src`` that ended, or was under way, when the check began is seen by one or the
other.

Both only look (``stat``, ``lstat``, listing ``src`` and the records below its path): nothing
is moved or changed. The folder checked is the folder moved: :func:`pin` opens ``src``'s parent
once, before the checks, and the rename goes through that open folder (not through ``src``'s
path again, whose symlinks another user may point elsewhere meanwhile); after the checks the path
must still name the pinned folder, and after the rename the staging folder must be it, or it is
renamed back and the call refused. Left: a commit below ``src`` that starts after the check
and before the rename (``adopt`` is for folders no other writer uses).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from commitstore.backends import (
    OURS,
    Backend,
    Pinned,
    below,
    entry_of,
    scan,
    store_holding,
)
from commitstore.errors import ConfigurationError, NameConflictError
from commitstore.layout import intent_parts, record_parts

__all__ = ["check_adoptable", "check_outside"]


def _holds(where: str, root: str) -> bool:
    """Whether ``where`` is ``root`` or a folder above it (by identity)."""
    try:
        return below(os.stat(where), root) is not None
    except OSError:
        return False


def _not_a_link(src: Path) -> None:
    if os.path.islink(src):
        raise ConfigurationError(f"{src} is a symbolic link: pass the folder itself")


def check_outside(backend: Backend, src: Path, name: str, pinned: Pinned) -> None:
    """Raise NameConflictError when ``src`` is the store's own folder, lies inside it or holds
    it (each of the entry moved and what it points to, and the folder ``pinned``, judged
    through its open parent: the folder that will be moved). No-op for a store that is no
    local folder."""
    root = backend.local_root()
    if root is None:
        return
    top = os.stat(root)
    for where in (*entry_of(src), None):
        if where is None:  # the pinned folder: what a link in src's path points to no longer counts
            inside, holds = pinned.lies_in(top), pinned.holds(root)
        else:
            inside, holds = below(top, where) is not None, _holds(where, root)
        if inside or holds:
            raise NameConflictError(
                f"{src} is {'inside' if inside else 'a folder holding'} the "
                f"store's own folder ({root}): moving it into {name}'s staging area "
                "would take committed artifacts or the store's records with it, so it is "
                "refused and nothing was moved; pass a folder outside the store (or "
                "FolderWrite.adopt for a folder written inside it that is no artifact)",
                name=name,
            )
    _not_a_link(src)
    store = store_holding(os.path.realpath(src))
    if store is None and pinned.in_a_store():
        store = "above the folder"
    if store is not None:
        raise NameConflictError(
            f"{src} lies in a store ({store}: its records are there): moving it into {name} "
            "would leave that store's records without their data, so it is refused and "
            "nothing was moved",
            name=name,
        )
    scan(src, name, top.st_dev)


def check_adoptable(backend: Backend, src: Path, name: str, pinned: Pinned) -> None:
    """Raise NameConflictError unless ``src`` may be adopted by the write of ``name`` (module
    docstring); the folder judged must be ``pinned``, the one that will be moved (the store's
    own path to it, ``root/rel``, names it before and after the checks)."""

    def refuse(why: str) -> NameConflictError:
        return NameConflictError(
            f"{src} {why}: adopting it into {name}'s staging area could take committed "
            "artifacts, a commit in progress or the store's own entries with it, so it is "
            "refused and nothing was moved",
            name=name,
        )

    root = backend.local_root()
    if root is None:
        raise refuse("cannot be adopted: the store is no local folder")
    entry, target = entry_of(src)
    if os.path.islink(entry):
        raise refuse("is a symbolic link")
    top = os.stat(root)
    rel = below(top, entry)
    if not rel or below(top, target) != rel:
        raise refuse(f"is not a folder inside the store's own folder ({root})")
    judged = os.path.join(root, *rel)
    _same(judged, pinned, refuse)
    folded = tuple(p.casefold() for p in rel)
    if any(p.startswith(OURS) for p in folded):
        raise refuse("is or lies in the store's own metadata or staging entries")
    own = tuple(p.casefold() for p in name.split("/"))
    if folded != own and (folded == own[: len(folded)] or own == folded[: len(own)]):
        raise refuse(f"holds or lies in {name}'s own path")
    # src is listed before the records are read: a commit below it that ended before this
    # point left a record, one under way its staging entry or its pending record
    scan(src, name, top.st_dev)
    for n in range(1, len(rel) + 1):  # a record or a commit in progress at or above src
        for meta in (record_parts(rel[:n]), intent_parts(rel[:n])):
            if os.path.lexists(os.path.join(root, *meta)):
                what = "is the committed" if n == len(rel) else "lies in the committed"
                raise refuse(f"{what} (or being committed) artifact {'/'.join(rel[:n])!r}")
    records = os.path.join(root, *record_parts((*rel, "x"))[:-1])
    for _dirpath, _dirs, files in os.walk(records):
        if files:
            raise refuse("holds committed artifacts (or commits in progress) below it")
    _same(judged, pinned, refuse)


def _same(judged: str, pinned: Pinned, refuse: Callable[[str], NameConflictError]) -> None:
    """Refuse unless the store's own path ``judged`` names the pinned folder."""
    try:
        st = os.stat(judged, follow_symlinks=False)
    except OSError as exc:
        raise refuse("is gone") from exc
    if (st.st_dev, st.st_ino) != pinned.ident:
        raise refuse(
            "is not the folder it named when the call began (a link was pointed elsewhere?)"
        )
