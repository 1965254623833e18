"""What every conformance test works on: a :class:`Target`, and layout helpers computed
independently of commitstore (from ``docs/format.md``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from commitstore import CommitStore
from commitstore.testing.backdoor import Backdoor

RECORDS = ".commitstore/records"


def record_path(name: str) -> str:
    """Where the documented layout (``docs/format.md``) puts the record of ``name``, computed
    independently of commitstore (long final parts are stored under their xxh3_128)."""
    head, _, last = name.rpartition("/")
    leaf = f".commitstore.rec.{last}.json"
    if len(leaf.encode()) > 255:
        leaf = f".commitstore.rech.{xxhash.xxh3_128_hexdigest(last.encode())}.json"
    return f"{RECORDS}/{head}/{leaf}" if head else f"{RECORDS}/{leaf}"


def pending_paths(door: Backdoor, name: str) -> list[str]:
    """Where the documented layout (``docs/format.md``) has pending records of ``name`` now:
    the one beside its record (``.commitstore.new.<last>.json``), if present, then each
    writer's under ``.commitstore/pending/<dir>/.commitstore.new.<last>.json/`` (object
    stores), sorted."""
    beside = record_path(name).replace("/.commitstore.rec.", "/.commitstore.new.")
    beside = beside.replace("/.commitstore.rech.", "/.commitstore.newh.")
    slots = ".commitstore/pending/" + beside[len(RECORDS) + 1 :] + "/"
    files = door.files()
    return [f for f in files if f == beside] + sorted(f for f in files if f.startswith(slots))


def xxh(data: bytes) -> str:
    """The digest, computed independently of commitstore."""
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)


def data_files(door: Backdoor) -> list[str]:
    """Files that are not the store's own bookkeeping."""
    return [f for f in door.files() if not f.startswith(".commitstore/")]


def staging_files(door: Backdoor) -> list[str]:
    """Files (or files inside folders) with a staging name."""
    return [f for f in door.files() if any(p.startswith(".commitstore.tmp.") for p in f.split("/"))]


@dataclass
class Target:
    """A store under test, a backdoor onto the same storage, and a way to open another handle."""

    store: CommitStore
    door: Backdoor
    reopen: Callable[[], CommitStore]
