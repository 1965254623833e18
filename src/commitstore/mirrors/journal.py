"""The owed journal: copies a mirror is owed, kept on the PRIMARY so they outlive the process.

Every copy queued for a mirror (in sync mode: every copy about to start), so also one handed off
as owed (its mirror's queue stayed full), one that failed, and one still pending when the exit
flush ran out of time, has one small entry
``.commitstore/owed/<mirror key>/<name key>.json`` (:func:`entry_parts`: xxh3 hashes of the
mirror's URL and of the artifact's name, so any name fits one short file name) holding the
mirror's URL, the name, the digest of the version owed and when. The entry is removed once a copy
of the name reached the mirror (or ``sync`` found or made it whole there, or the name is no
longer committed on the primary). The next replicator opened with that mirror reads the entries
and completes the copies (``replicator.py``).

Entries are untrusted input: one larger than :data:`MAX_ENTRY_BYTES`, not JSON of this schema,
naming another mirror, an invalid name, or filed under a key that is not its name's, is ignored
with a warning (never an error of ``open_store``). Writing and removing entries is best effort:
a failure is logged and never fails a commit or a copy (an entry left behind only costs a copy
made again, which is idempotent).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import xxhash

from commitstore._scan import list_records
from commitstore._small import put_small
from commitstore.backends import PutMode
from commitstore.errors import CommitStoreError, InvalidNameError, NotFoundError
from commitstore.layout import META_DIR, OWED_DIR, Parts, validate_name
from commitstore.records import RecordFormatError

if TYPE_CHECKING:
    from commitstore.backends import Backend

log = logging.getLogger("commitstore")

SCHEMA = "commitstore.owed/1"
MAX_ENTRY_BYTES = 4096
"""The largest entry read; a larger one is damaged (ignored). An entry is a few hundred bytes
beside its name; a name so long that its entry would be larger is never journaled (the copy is
still owed in memory, and ``sync`` makes it)."""
MAX_ENTRIES = 100_000
"""Entries read per mirror at a start; more are left for a later start or ``sync``."""


def mirror_key(url: str) -> str:
    return xxhash.xxh3_64_hexdigest(url.encode("utf-8", "surrogatepass"))


def name_key(name: str) -> str:
    return xxhash.xxh3_128_hexdigest(name.encode("utf-8", "surrogatepass")) + ".json"


def mirror_dir(url: str) -> Parts:
    return (META_DIR, OWED_DIR, mirror_key(url))


def entry_parts(url: str, name: str) -> Parts:
    return (*mirror_dir(url), name_key(name))


@dataclass(frozen=True, slots=True)
class Entry:
    """One owed copy read back from the journal."""

    name: str
    digest: str | None
    since: float


def encode(url: str, name: str, digest: str | None, since: float) -> bytes:
    doc = {"schema": SCHEMA, "mirror": url, "name": name, "digest": digest, "since": since}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def write(backend: Backend, url: str, name: str, digest: str | None) -> bool:
    """Record that ``name`` is owed to mirror ``url``; True if the entry was written. Never
    raises for the storage: a failure is logged (the copy is still owed in memory)."""
    body = encode(url, name, digest, time.time())
    if len(body) > MAX_ENTRY_BYTES:
        log.warning("owed copy of %s to %s not journaled: its entry would be too large", name, url)
        return False
    try:
        put_small(backend, entry_parts(url, name), body, PutMode.REPLACE)
    except (CommitStoreError, OSError) as exc:
        log.warning(
            "owed copy of %s to %s not journaled on the primary (it is owed until this process "
            "ends; sync() completes it): %s: %s",
            name,
            url,
            type(exc).__name__,
            exc,
        )
        return False
    return True


def remove(backend: Backend, url: str, name: str) -> None:
    """Remove ``name``'s entry for mirror ``url`` (no matter if it is gone); failures logged."""
    try:
        backend.remove_leftover(entry_parts(url, name))
    except NotFoundError:
        pass
    except (CommitStoreError, OSError) as exc:
        log.warning("owed entry of %s to %s not removed (harmless): %s", name, url, exc)


def _parse(blob: bytes, url: str, leaf: str) -> Entry | None:
    """The entry in ``blob`` (filed as ``leaf``), or None when it is damaged or not ours."""
    if len(blob) > MAX_ENTRY_BYTES:
        return None
    try:
        doc: Any = json.loads(blob.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("mirror") != url:
        return None
    name, digest, since = doc.get("name"), doc.get("digest"), doc.get("since")
    if not isinstance(name, str) or name_key(name) != leaf:
        return None
    try:
        validate_name(name)
    except InvalidNameError:
        return None
    if digest is not None and not isinstance(digest, str):
        return None
    if isinstance(since, bool) or not isinstance(since, (int, float)):
        return None
    return Entry(name, digest, float(since))


def read(backend: Backend, url: str) -> list[Entry]:
    """The entries owed to mirror ``url``, oldest first. Damaged entries are skipped with a
    warning; an unreadable journal is an empty one (with a warning). Never raises for the
    storage's state."""
    folder = mirror_dir(url)
    try:
        listed = backend.walk(folder)
    except NotFoundError:
        return []
    except (CommitStoreError, OSError) as exc:
        log.warning("the owed journal for %s could not be listed: %s", url, exc)
        return []
    out: list[Entry] = []
    damaged = 0
    for rel, info in sorted(listed)[:MAX_ENTRIES]:
        if len(rel) != 1 or not rel[0].endswith(".json") or info.is_dir or not info.regular:
            continue  # a staging file of an interrupted write, or something not ours
        if info.size > MAX_ENTRY_BYTES:
            damaged += 1
            continue
        try:
            blob = backend.read_small((*folder, rel[0]))
        except NotFoundError:
            continue  # removed meanwhile
        except (CommitStoreError, RecordFormatError, OSError):
            damaged += 1
            continue
        entry = _parse(blob, url, rel[0])
        if entry is None:
            damaged += 1
        else:
            out.append(entry)
    if damaged:
        log.warning(
            "%d damaged entries of the owed journal for %s were ignored (%s)",
            damaged,
            url,
            "/".join(folder),
        )
    if len(listed) > MAX_ENTRIES:
        log.warning("the owed journal for %s holds more than %d entries", url, MAX_ENTRIES)
    out.sort(key=lambda e: e.since)
    return out


def owed_at_start(backend: Backend, urls: list[str]) -> dict[str, list[tuple[str, int]]]:
    """Per mirror URL, the names (and their sizes by the primary's records, 0 when unknown) an
    earlier run owed it, oldest first. Entries of names the primary no longer holds are
    removed (nothing is left to copy). Lists the journal of each mirror once, and the primary's
    records once when there is any entry; never raises for the storage's state."""
    entries = {url: read(backend, url) for url in urls}
    if not any(entries.values()):
        return {url: [] for url in urls}
    try:
        held: dict[str, int] | None = {r.name: r.size for r in list_records(backend)}
    except Exception as exc:  # the copies themselves will say what is wrong
        log.warning("owed copies: the primary's records could not be listed: %s", exc)
        held = None
    out: dict[str, list[tuple[str, int]]] = {}
    for url, found in entries.items():
        out[url] = []
        for e in found:
            if held is not None and e.name not in held:
                remove(backend, url, e.name)
            else:
                out[url].append((e.name, held[e.name] if held is not None else 0))
    return out
