"""Retention: which committed artifacts to delete, as a pure function of records (no I/O).

The keep-set is computed once, over the whole artifacts of every target (the union of names across
primary and mirrors, ordered by their records' sort key), and applied to every target, so a fresh or
damaged primary never shrinks a mirror below the policy. Guards then protect, on each target:
anything modified less than ``min_age`` seconds ago (a copy may be in flight), anything whose
modification time is unknown or zero ("unknown" is not "old"), the newest artifact that verifies
there, everything newer than it (damaged copies, left for inspection or ``sync``/``restore``; a
target where nothing verifies loses nothing), and anything whose replication there is pending.
An alias (``Record.alias``: ``last.ckpt``) is never deleted and never counted by ``keep_last``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field

from commitstore._order import OrderKey, arrange
from commitstore.errors import ConfigurationError

__all__ = [
    "Candidate",
    "Retention",
    "TargetPlan",
    "check_age",
    "check_keep",
    "guard_window",
    "keep_set",
    "plan_target",
    "selection",
]


@dataclass(frozen=True, slots=True)
class Retention:
    """A retention policy; ``open_store(..., retention=Retention(...))`` applies it after every
    successful commit, on every target."""

    keep_last: int | None = None
    """Keep the newest N artifacts (in the order of ``list()``; aliases are not counted)."""
    keep_every: int | None = None
    """Keep every artifact whose step is a multiple of K (milestones)."""
    keep: tuple[str, ...] = ()
    """Names always kept."""
    min_age: float = 300
    """Never delete anything modified less than this many seconds ago."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep", check_keep(self.keep))
        if self.keep_last is not None and (not _is_int(self.keep_last) or self.keep_last < 0):
            raise ConfigurationError(f"keep_last must be an integer >= 0, not {self.keep_last!r}")
        if self.keep_every is not None and (not _is_int(self.keep_every) or self.keep_every < 1):
            raise ConfigurationError(f"keep_every must be an integer >= 1, not {self.keep_every!r}")
        if not _is_number(self.min_age) or not math.isfinite(self.min_age):
            raise ConfigurationError(f"min_age must be a finite number, not {self.min_age!r}")
        if self.min_age < 0:
            raise ConfigurationError(f"min_age must be >= 0, not {self.min_age!r}")


def check_keep(keep: object) -> tuple[str, ...]:
    """``keep`` as a tuple of names; ConfigurationError for one name given as a string (it
    would be taken as one name per character, and the name itself not kept) or anything that
    is not a collection of strings. The names themselves are checked where they are used."""
    if isinstance(keep, str | bytes):
        raise ConfigurationError(
            f"keep must be a collection of names, not one string ({keep!r}): write keep=[{keep!r}]"
        )
    if not isinstance(keep, Iterable):
        raise ConfigurationError(f"keep must be a collection of names, not {keep!r}")
    try:
        names: tuple[object, ...] = tuple(keep)
    except TypeError:
        raise ConfigurationError(f"keep must be a collection of names, not {keep!r}") from None
    for name in names:
        if not isinstance(name, str):
            raise ConfigurationError(f"keep must hold names (strings), not {name!r}")
    return tuple(str(name) for name in names)


def check_age(min_age: float) -> float:
    """``min_age`` as a float; ConfigurationError unless it is a finite number >= 0 (not a
    bool)."""
    if not _is_number(min_age) or not math.isfinite(min_age) or min_age < 0:
        raise ConfigurationError(f"min_age must be a finite number >= 0, not {min_age!r}")
    return float(min_age)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """An int or float, never a bool (``min_age=True`` is not one second)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Candidate:
    """What the plan knows of one committed artifact on one target."""

    name: str
    step: int | None
    order: OrderKey
    """What the order of artifacts is computed from (``_order.arrange``, as ``list()``)."""
    mtime: float | None
    """Newest modification time among its data files and record; None if any is unknown or 0."""
    whole: bool
    """Whether it verifies on this target at the strongest level checked there (prune hashes the
    newest ones fully, newest first, until one verifies; older ones are checked by size)."""
    pending: bool = False
    """Replication to this target is queued or in progress."""
    alias: bool = False
    """A moving name (``Record.alias``): always kept, not counted by ``keep_last``, and not the
    newest-verifying artifact the guard protects (that is the newest non-alias one)."""


@dataclass(frozen=True, slots=True)
class TargetPlan:
    """The plan for one target."""

    delete: tuple[str, ...]
    keep: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    """Outside the keep-set but protected, with the reason."""


_order_of = operator.attrgetter("order")
"""A candidate's :attr:`Candidate.order` (what ``arrange`` sorts by), without a Python call."""


def keep_set(candidates: Iterable[Candidate], policy: Retention) -> frozenset[str]:
    """Names to keep, over the whole artifacts of every target: ``candidates`` from all targets
    together; a name counts once, if it is whole on any target."""
    return selection(candidates, policy)[0]


def selection(
    candidates: Iterable[Candidate], policy: Retention
) -> tuple[frozenset[str], frozenset[str]]:
    """:func:`keep_set`, and the part of it chosen for being whole (``keep_last``,
    ``keep_every``): the only names whose wholeness the keep-set depends on. (A name that is not
    whole is never chosen; one chosen that is not whole after all leaves its place to the next
    whole one, which is older than every name chosen by ``keep_last``.)"""
    everything: dict[str, Candidate] = {}
    whole: dict[str, Candidate] = {}
    for c in candidates:
        everything.setdefault(c.name, c)
        if c.whole:
            whole.setdefault(c.name, c)
    ordered = arrange((c for c in whole.values() if not c.alias), _order_of)
    chosen: set[str] = set()
    if policy.keep_last:
        chosen.update(c.name for c in ordered[-policy.keep_last :])
    if policy.keep_every:
        chosen.update(
            c.name for c in ordered if c.step is not None and c.step % policy.keep_every == 0
        )
    keep = set(policy.keep) | chosen
    keep.update(c.name for c in everything.values() if c.alias)
    if policy.keep_last is None and policy.keep_every is None and not policy.keep:
        keep.update(everything)  # no policy: keep everything
    return frozenset(keep), frozenset(chosen)


def plan_target(
    candidates: Iterable[Candidate], keep: frozenset[str], *, min_age: float, now: float
) -> TargetPlan:
    """Apply the keep-set and the guards to one target's committed artifacts."""
    items = arrange(candidates, _order_of)
    good = _newest_good(items)
    delete, kept, skipped = [], [], {}
    for i, c in enumerate(items):
        if c.name in keep or c.alias:
            kept.append(c.name)
        elif good is None:
            skipped[c.name] = "nothing verifies on this target"
        elif i == good:
            skipped[c.name] = "newest verifying artifact on this target"
        elif i > good:
            skipped[c.name] = "newer than the newest verifying artifact (fails its check)"
        elif c.pending:
            skipped[c.name] = "replication pending"
        elif c.mtime is None or c.mtime <= 0:
            skipped[c.name] = "unknown mtime"
        elif now - c.mtime < min_age:
            skipped[c.name] = "younger than min_age"
        else:
            delete.append(c.name)
    return TargetPlan(tuple(delete), tuple(kept), skipped)


def _newest_good(items: list[Candidate]) -> int | None:
    """Index (in ``items``, oldest first) of the newest whole artifact that is not an alias."""
    return next(
        (i for i in range(len(items) - 1, -1, -1) if items[i].whole and not items[i].alias), None
    )


def guard_window(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The candidates of one target whose wholeness its guard depends on: from the newest down
    to the newest whole one that is not an alias (everything, if none is), aliases left out.
    :func:`plan_target` protects the newest whole artifact and what is newer, so a name
    further down can change its plan only through the keep-set."""
    items = arrange(candidates, _order_of)
    good = _newest_good(items)
    return [c for c in items[good or 0 :] if not c.alias]
