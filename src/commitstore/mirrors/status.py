"""What each mirror is owed, asked without ever raising for a mirror's state: the probe lists
the mirror's records once; a mirror that cannot be listed is reported unreachable, with why."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from commitstore._commit import Committer
from commitstore._scan import list_records
from commitstore.records import Record


@dataclass(frozen=True, slots=True)
class Probe:
    """One look at a mirror."""

    reachable: bool
    """The mirror's records could be listed during this call."""
    error: str | None
    """Why they could not (the error's type and message), else None."""
    held: frozenset[str]
    """Names the mirror holds a record of (empty when unreachable)."""


def probe(mirror: Committer) -> Probe:
    """List ``mirror``'s records; any failure (down, refused, timed out, denied, a bug in a
    backend) makes the mirror unreachable, never an exception of the caller's."""
    try:
        held = frozenset(r.name for r in list_records(mirror.backend))
    except Exception as exc:  # the mirror's state is reported, not raised
        return Probe(False, f"{type(exc).__name__}: {exc}", frozenset())
    return Probe(True, None, held)


@dataclass(frozen=True, slots=True)
class Owed:
    """The copies one mirror is owed."""

    count: int
    size: int
    """Bytes of the owed artifacts, by their primary records (0 for one the primary lost)."""
    oldest_age: float | None
    """Seconds since the oldest owed artifact was committed on the primary (None: none owed,
    or none the primary still records)."""


def owed(primary: Mapping[str, Record], names: Iterable[str], now: datetime | None = None) -> Owed:
    """Count, bytes and oldest age of ``names`` (owed to one mirror), by ``primary``'s records."""
    when = now or datetime.now(timezone.utc)
    unique = set(names)
    records = [primary[n] for n in unique if n in primary]
    oldest = min((r.created for r in records), default=None)
    return Owed(
        count=len(unique),
        size=sum(r.size for r in records),
        oldest_age=None if oldest is None else max(0.0, (when - oldest).total_seconds()),
    )
