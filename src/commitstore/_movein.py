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

Both only look (``stat``, ``lstat``, listing ``src`` and the records below its path): nothing
is moved or changed. Left: a commit below ``src`` that starts after the check and before the
rename (``adopt`` is for folders no other writer uses).
"""

from __future__ import annotations

import os
from pathlib import Path

from commitstore.backends import Backend
from commitstore.errors import NameConflictError
from commitstore.layout import META_DIR, intent_parts, record_parts

__all__ = ["check_adoptable", "check_outside"]

_OURS = META_DIR.casefold()
"""Every entry of the store's own (``.commitstore``, ``.commitstore.tmp.*``, ...) starts so."""


def _resolved(src: Path) -> tuple[str, str]:
    """The entry a rename of ``src`` moves (its parent resolved by the kernel's rules: symlinks
    first, then ``..``) and what ``src`` itself resolves to."""
    path = os.path.join(os.getcwd(), os.fspath(src))  # absolute; ``..`` left for realpath
    head, last = os.path.split(path.rstrip("/") or "/")
    if last in ("", ".", ".."):
        last = os.path.basename(os.path.realpath(path))
        head = os.path.dirname(os.path.realpath(path))
    return os.path.join(os.path.realpath(head), last), os.path.realpath(path)


def _below(root: os.stat_result, where: str) -> tuple[str, ...] | None:
    """The parts of ``where`` below the folder ``root`` (by identity), ``()`` when ``where``
    is it, None when it is not inside it."""
    parts: list[str] = []
    at = where
    while True:
        try:
            if os.path.samestat(os.stat(at), root):
                return tuple(reversed(parts))
        except OSError:
            pass
        up, last = os.path.split(at)
        if up == at:
            return None
        parts.append(last)
        at = up


def _holds(where: str, root: str) -> bool:
    """Whether ``where`` is ``root`` or a folder above it (by identity)."""
    try:
        return _below(os.stat(where), root) is not None
    except OSError:
        return False


def check_outside(backend: Backend, src: Path, name: str) -> None:
    """Raise NameConflictError when ``src`` is the store's own folder, lies inside it or holds
    it (each of the entry moved and what it points to). No-op for a store that is no local
    folder."""
    root = backend.local_root()
    if root is None:
        return
    top = os.stat(root)
    for where in _resolved(src):
        inside = _below(top, where) is not None
        if inside or _holds(where, root):
            raise NameConflictError(
                f"{src} is {'inside' if inside else 'a folder holding'} the "
                f"store's own folder ({root}): moving it into {name}'s staging area "
                "would take committed artifacts or the store's records with it, so it is "
                "refused and nothing was moved; pass a folder outside the store (or "
                "FolderWrite.adopt for a folder written inside it that is no artifact)",
                name=name,
            )


def check_adoptable(backend: Backend, src: Path, name: str) -> None:
    """Raise NameConflictError unless ``src`` may be adopted by the write of ``name`` (module
    docstring)."""

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
    entry, target = _resolved(src)
    if os.path.islink(entry):
        raise refuse("is a symbolic link")
    top = os.stat(root)
    rel = _below(top, entry)
    if not rel or _below(top, target) != rel:
        raise refuse(f"is not a folder inside the store's own folder ({root})")
    folded = tuple(p.casefold() for p in rel)
    if any(p.startswith(_OURS) for p in folded):
        raise refuse("is or lies in the store's own metadata or staging entries")
    own = tuple(p.casefold() for p in name.split("/"))
    if folded != own and (folded == own[: len(folded)] or own == folded[: len(own)]):
        raise refuse(f"holds or lies in {name}'s own path")
    for n in range(1, len(rel) + 1):  # a record or a commit in progress at or above src
        for meta in (record_parts(rel[:n]), intent_parts(rel[:n])):
            if os.path.lexists(os.path.join(root, *meta)):
                what = "is the committed" if n == len(rel) else "lies in the committed"
                raise refuse(f"{what} (or being committed) artifact {'/'.join(rel[:n])!r}")
    records = os.path.join(root, *record_parts((*rel, "x"))[:-1])
    for _dirpath, _dirs, files in os.walk(records):
        if files:
            raise refuse("holds committed artifacts (or commits in progress) below it")
    for _dirpath, dirs, files in os.walk(entry):
        if any(e.casefold().startswith(_OURS) for e in (*dirs, *files)):
            raise refuse("holds the store's own entries (another writer's staging or pending)")
