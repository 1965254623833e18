"""The move-aside replace: the one protocol for every rename-family replace that cannot swap in
one step (SMB folders, fsspec folders and files without posix-rename or a one-request replace,
folders on FUSE/9p bridges, which refuse ``RENAME_EXCHANGE``).

Protocol, run by the writer under the store's publish lock, in the destination's folder:

0. A stale aside entry ``.commitstore.old.<name>`` (``layout.aside_part``) left by an earlier
   replace that crashed is settled first: the name is missing -> the aside moves back under it
   (roll back: it is the old version); the name is present -> the crashed replace got its new
   version in, and the aside is garbage: removed.
1. The old entry moves to the aside name (a no-replace move).
2. The new entry (the staging name) moves to the name (a no-replace move). If that fails, the
   aside moves back (1 undone) and the error is raised.
3. The aside is removed (a failure here leaves garbage that gc removes; the name holds the new
   version).

The aside name is deterministic per name, so a later process finds it: a crash between 1 and 2
(or a failed move-back) leaves the name missing and the old version under the aside name, which
readers serve (``_read``, ``_verify``) and ``gc`` moves back (``maintenance/_asides.py``). A crash
between 2 and 3 leaves the new version under the name (its pending record matches it) and the old
one aside, which gc removes once the name verifies. Neither ever leaves neither version.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from commitstore.layout import aside_part


class AsideMoves(Protocol):
    """The primitives the protocol needs, on entries of one folder."""

    def exists(self, name: str) -> bool:
        """True if ``name`` (a file or a folder) exists, freshly (no cache)."""

    def move(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, which must not exist (never a copy). Raises on failure."""

    def remove(self, name: str) -> None:
        """Remove the file or folder tree ``name`` if it exists."""


def _reached(point: str, name: str) -> None:
    """Called at each point of the protocol's replace of ``name`` (``"aside"``: the old entry
    is aside and the name is missing; ``"in"``: the new entry is in, the aside not yet
    removed). Does nothing; crash tests replace it in a forked writer to stop it there."""


def settle_stale(moves: AsideMoves, dst: str) -> bool:
    """Step 0: settle an aside entry of ``dst`` left by a replace that stopped. True if there
    was one. Raises what the moves raise (the aside then stays, to be settled again)."""
    aside = aside_part(dst)
    if not moves.exists(aside):
        return False
    if moves.exists(dst):
        moves.remove(aside)
    else:
        moves.move(aside, dst)
    return True


def replace(moves: AsideMoves, src: str, dst: str, notes: list[str]) -> None:
    """Publish ``src`` at ``dst`` over whatever ``dst`` holds, by the protocol above (under the
    caller's publish lock). At every point ``dst`` holds the old entry or the new one, or is
    missing while the old entry is under the aside name. Notes go to ``notes``."""
    if settle_stale(moves, dst):
        notes.append(f"settled an aside entry a stopped replace of {dst} had left")
    if not moves.exists(dst):
        moves.move(src, dst)
        return
    aside = aside_part(dst)
    moves.move(dst, aside)
    _reached("aside", dst)
    try:
        moves.move(src, dst)
    except BaseException:
        with contextlib.suppress(Exception):  # if this fails too, gc or a reader finds it aside
            moves.move(aside, dst)
        raise
    _reached("in", dst)
    notes.append("replaced by moving the old version aside first (not atomic)")
    try:
        moves.remove(aside)
    except Exception as exc:  # the name holds the new version; gc removes the aside
        notes.append(f"the old version stays aside until gc ({exc})")
