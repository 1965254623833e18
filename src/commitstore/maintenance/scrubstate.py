"""Scrub state: when each artifact version on one target was last verified in full, kept there.

One small JSON file per target, ``.commitstore/scrub/state.json`` (:data:`STATE_PARTS`), maps each
name to the version verified (its size and digest) and the time of that full check (seconds since
the epoch). A scrub from any machine reads it to choose the copies verified least recently, and
writes it back after the checks it made, merged with what the file holds at that moment (the
newest check of each version wins), so two scrubs of one target lose at most each other's
concurrent progress, never an entry neither of them checked.

The file is untrusted input: one that is missing, unreadable, larger than the small-file bound,
not JSON of this schema, or whose entries are malformed (or dated more than :data:`MAX_SKEW`
ahead), is (in whole or for those entries) no state: the copies concerned are simply verified
again. Reading it never raises for the storage's state; writing it is best effort (a failure is
logged: the checks stand, only their dates are forgotten). gc never removes it (it removes
staging names, pending records and folder markers only), and nothing else under
``.commitstore/scrub/`` is read.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commitstore._recordrules import MAX_RECORD_BYTES as MAX_SMALL_BYTES
from commitstore._small import put_small
from commitstore.backends import PutMode
from commitstore.errors import CommitStoreError, InvalidNameError, NotFoundError
from commitstore.layout import META_DIR, SCRUB_DIR, Parts, validate_name
from commitstore.records import RecordFormatError

if TYPE_CHECKING:
    from commitstore.backends import Backend

log = logging.getLogger("commitstore")

SCHEMA = "commitstore.scrub/1"
STATE_PARTS: Parts = (META_DIR, SCRUB_DIR, "state.json")


@dataclass(frozen=True, slots=True)
class Checked:
    """One full check: the version checked (``size``, ``digest``) and when (epoch seconds)."""

    size: int
    digest: str
    at: float


State = dict[str, Checked]
"""Name -> its last full check on one target."""


MAX_SKEW = 86400.0
"""Seconds a check may lie in the future (clocks of the machines that scrub differ); an entry
further ahead is damaged (dropped), so no entry can keep a copy from being verified again."""


def _entry(value: Any, now: float) -> Checked | None:
    if not isinstance(value, list) or len(value) != 3:
        return None
    size, digest, at = value
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return None
    if not isinstance(digest, str) or len(digest) > 200:
        return None
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return None
    if at > now + MAX_SKEW:
        return None
    return Checked(size, digest, float(at))


def decode(blob: bytes) -> State | None:
    """The state in ``blob``, malformed entries dropped; None for a malformed document."""
    try:
        doc: Any = json.loads(blob.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    entries = doc.get("verified")
    if not isinstance(entries, dict):
        return None
    out: State = {}
    now = time.time()
    for name, value in entries.items():
        checked = _entry(value, now)
        if checked is None:
            continue
        try:
            validate_name(name)
        except InvalidNameError:
            continue
        out[name] = checked
    return out


def encode(state: State) -> bytes:
    """``state`` as stored; the oldest checks are left out when it would pass the small-file
    bound (those copies are verified again first, which is where they stand anyway)."""
    items = sorted(state.items(), key=lambda kv: kv[1].at, reverse=True)
    while True:
        doc = {
            "schema": SCHEMA,
            "verified": {n: [c.size, c.digest, c.at] for n, c in items},
        }
        body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(body) <= MAX_SMALL_BYTES or not items:
            return body
        items = items[: len(items) * 9 // 10]


def read(backend: Backend, url: str) -> State:
    """The state kept on a target (``url`` for messages). Never raises for its content; an
    unreadable file is no state (with a warning)."""
    try:
        blob = backend.read_small(STATE_PARTS)
    except NotFoundError:
        return {}
    except (CommitStoreError, RecordFormatError, OSError) as exc:
        log.warning(
            "scrub: the scrub state on %s could not be read (starting afresh): %s", url, exc
        )
        return {}
    state = decode(blob)
    if state is None:
        log.warning("scrub: the scrub state on %s is damaged; starting afresh", url)
        return {}
    return state


def merge(ours: State, theirs: State) -> State:
    """Both states, the newer check of each name winning."""
    out = dict(theirs)
    for name, checked in ours.items():
        other = out.get(name)
        if other is None or checked.at >= other.at:
            out[name] = checked
    return out


def write(backend: Backend, url: str, checks: State) -> bool:
    """Add ``checks`` to the state kept on the target, merged with what it holds now; True if
    written. Best effort: a failure is logged, never raised."""
    if not checks:
        return True
    try:
        merged = merge(checks, read(backend, url))
        put_small(backend, STATE_PARTS, encode(merged), PutMode.REPLACE)
    except (CommitStoreError, OSError) as exc:
        log.warning("scrub: the scrub state on %s was not written: %s", url, exc)
        return False
    return True
