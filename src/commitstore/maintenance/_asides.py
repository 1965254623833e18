"""gc's part of the move-aside replace (``backends/rename/aside.py``): settle the aside entries
``.commitstore.old.<name>`` that replaces stopped by a crash or a failure left behind.

Rules, each applied under the publish lock (so no writer of this host is between its moves):

- The name is missing and the aside entry verifies (``"full"``) as the name's record or its
  pending record: it is moved back under the name (roll back; ``Backend.restore_aside``),
  whatever its age. Moving it back destroys nothing.
- The name holds a version that verifies as its record or its pending record: the aside entry
  is garbage (the replace got its new version in), removed once older than ``min_age``.
- Anything else (the name missing and the aside matching no record; the name not verifying;
  no record or pending record to tell): the aside entry is kept, with the reason. An aside
  entry is never deleted while the name is missing or does not verify, at any ``min_age``.
- The store's own files (records, pending records, the record cache) are replaced by the same
  protocol where the storage has no one-step replace: an aside of one whose file is missing
  moves back (a record only if it is a valid record of that path); one whose file is present
  is garbage, removed once older than ``min_age``.
"""

from __future__ import annotations

from commitstore._scan import read_intent, read_record
from commitstore._verify import check_at
from commitstore.backends import Backend
from commitstore.errors import AlreadyExistsError, CommitStoreError, InvalidNameError
from commitstore.layout import (
    ASIDE_PREFIX,
    INTENT_HASHED_PREFIX,
    META_DIR,
    RECORD_HASHED_PREFIX,
    Parts,
    aside_parts,
    aside_record_parts,
    is_record_leaf,
    record_parts,
    unaside_part,
    validate_name,
)
from commitstore.records import Record, RecordFormatError, decode_record


def _name_of(backend: Backend, aside: Parts) -> Parts | None:
    """The artifact whose aside entry ``aside`` is: spelled out in the aside name, or (a hashed
    aside, for a long name) read from the record or pending record stored under the same hash.
    None if it cannot be known."""
    leaf = aside[-1]
    if leaf.startswith(ASIDE_PREFIX):
        try:
            return validate_name("/".join((*aside[:-1], leaf[len(ASIDE_PREFIX) :])))
        except InvalidNameError:
            return None
    rec = aside_record_parts(aside)
    if rec is None:
        return None
    pending = (*rec[:-1], INTENT_HASHED_PREFIX + rec[-1][len(RECORD_HASHED_PREFIX) :])
    for path in (rec, pending):
        try:
            parts = validate_name(decode_record(backend.read_small(path)).name)
        except (CommitStoreError, RecordFormatError):
            continue
        if aside_parts(parts) == aside:
            return parts
    return None


def _versions(backend: Backend, parts: Parts) -> list[Record]:
    """The name's record and pending record, those that can be read."""
    out = []
    try:
        found = read_record(backend, parts)
    except (RecordFormatError, CommitStoreError):
        found = None
    if found is not None:
        out.append(found.record)
    pending = read_intent(backend, parts)
    if pending is not None:
        out.append(pending.record)
    return out


def settle(
    backend: Backend, aside: Parts, *, min_age: float, now: float, dry_run: bool
) -> tuple[bool, str, float | None, str] | None:
    """Apply the module's rules to one aside entry (see there), under the publish lock.

    Returns (done, kind, age, reason): ``done`` True if it was (in a dry run: would be)
    restored (kind ``"restored"``) or removed (kind ``"aside"``); else ``reason`` says why it
    was kept. ``age`` in seconds, None when unknown. None if the entry is gone (a writer
    settled it meanwhile)."""
    with backend.publish_lock():
        info = backend.stat(aside)
        if info is None:
            return None
        mtime = backend.last_change(aside) if info.is_dir else info.mtime
        age = None if mtime is None else max(0.0, now - mtime)
        if aside[0] == META_DIR:
            return _bookkeeping(backend, aside, age, min_age=min_age, dry_run=dry_run)
        parts = _name_of(backend, aside)
        if parts is None:
            return False, "aside", age, "the artifact it belongs to is unknown"
        versions = _versions(backend, parts)
        if backend.stat(parts) is None:
            if not any(check_at(backend, v, aside, "full").status == "ok" for v in versions):
                return False, "aside", age, "the name is missing and this matches no record of it"
            if not dry_run:  # whatever its age: moving it back loses nothing
                try:
                    backend.restore_aside(parts)
                except AlreadyExistsError:  # the name appeared meanwhile (another host)
                    return False, "aside", age, "the name appeared meanwhile"
            return True, "restored", age, ""
        if not any(check_at(backend, v, parts, "full").status == "ok" for v in versions):
            return (
                False,
                "aside",
                age,
                "the name does not verify: this may be its last good version",
            )
        return _drop_once_old(backend, aside, age, min_age=min_age, dry_run=dry_run)


def _bookkeeping(
    backend: Backend, aside: Parts, age: float | None, *, min_age: float, dry_run: bool
) -> tuple[bool, str, float | None, str]:
    """An aside entry of the store's own files (a record, a pending record, the record cache:
    replaced by the same protocol where the storage has no one-step replace). The file missing:
    the aside moves back (a record only if it is a valid record of that path). Present: the
    aside is garbage, removed once older than ``min_age``."""
    last = unaside_part(aside[-1])
    if last is None:
        return False, "aside", age, "the file it belongs to is unknown"
    target = (*aside[:-1], last)
    if backend.stat(target) is None:
        if is_record_leaf(last):
            try:
                record = decode_record(backend.read_small(aside))
                valid = record_parts(validate_name(record.name)) == target
            except (CommitStoreError, RecordFormatError):
                valid = False
            if not valid:
                return False, "aside", age, "the record is missing and this is not a record of it"
        if not dry_run:
            try:
                backend.restore_aside(target)
            except AlreadyExistsError:
                return False, "aside", age, "the file appeared meanwhile"
        return True, "restored", age, ""
    return _drop_once_old(backend, aside, age, min_age=min_age, dry_run=dry_run)


def _drop_once_old(
    backend: Backend, aside: Parts, age: float | None, *, min_age: float, dry_run: bool
) -> tuple[bool, str, float | None, str]:
    """Remove an aside entry that is garbage (its name holds a verifying version), but only
    once it is older than ``min_age``; an unknown mtime never deletes."""
    if age is None:
        return False, "aside", None, "unknown mtime"
    if age < min_age:
        return False, "aside", age, "younger than min_age"
    if not dry_run:
        backend.remove(aside)
    return True, "aside", age, ""
