"""The order of artifacts, oldest to newest: one rule for ``list()``, ``latest()``, the readers
that pick the newest artifact (``commitstore.torch.load``) and retention.

Artifacts with a step order by step (then commit time, then name). Artifacts without one order by
commit time (``created``), and take their place among the stepped ones by it: the two sequences
are merged, an unstepped artifact going before the first stepped one (not yet placed) committed
after it. So ``final.pt`` committed after step 300 is newer than step 300, and a moving alias
such as ``last.ckpt`` sits where its last commit puts it. Pure functions of records, no I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from commitstore.records import Record

__all__ = ["OrderKey", "arrange", "sort_key"]

OrderKey = tuple[bool, int, float, str]
"""``(has a step, step or 0, created as a POSIX timestamp, name)``."""

T = TypeVar("T")


def sort_key(record: Record) -> OrderKey:
    """What :func:`arrange` orders ``record`` by."""
    return (record.step is not None, record.step or 0, record.created.timestamp(), record.name)


_whole_key = operator.itemgetter(0)


def arrange(items: Iterable[T], key: Callable[[T], OrderKey]) -> list[T]:
    """``items`` oldest to newest (module docstring). Deterministic for a given set: stepped
    items by ``(step, created, name)``, unstepped by ``(created, name)``, merged by ``created``
    (on a tie, the stepped one first)."""
    keyed = [(key(item), item) for item in items]
    stepped = sorted([p for p in keyed if p[0][0]], key=_whole_key)  # all True: by the rest
    plain = sorted([p for p in keyed if not p[0][0]], key=lambda p: (p[0][2], p[0][3]))
    if not plain or not stepped:  # nothing to merge (the usual case: every artifact stepped)
        return [p[1] for p in stepped or plain]
    out: list[T] = []
    i = j = 0
    while i < len(stepped) and j < len(plain):
        if plain[j][0][2] < stepped[i][0][2]:
            out.append(plain[j][1])
            j += 1
        else:
            out.append(stepped[i][1])
            i += 1
    out.extend(p[1] for p in stepped[i:])
    out.extend(p[1] for p in plain[j:])
    return out


def arrange_records(records: Iterable[Record]) -> list[Record]:
    """Records oldest to newest."""
    return arrange(records, sort_key)
