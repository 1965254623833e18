"""What gc may remove of a dead writer's files: exactly the files its pending record or marker
names, never by prefix, and never a file a committed record (of any name) names or could name.

Pending records and markers are untrusted input (anyone with write access to the storage can
plant one): they only ever narrow what gc removes, never widen it to a committed artifact.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from commitstore._scan import scan_records
from commitstore.backends import Backend
from commitstore.errors import CommitStoreError, InvalidNameError
from commitstore.layout import Parts, validate_name
from commitstore.records import Record


@dataclass(frozen=True, slots=True)
class Committed:
    """The store's committed artifacts, as gc protects them (one scan of the records)."""

    files: frozenset[Parts]
    """Every file a valid record names: a file artifact's name, each file of a folder's."""
    names: frozenset[Parts]
    """Every artifact name with a record, valid or not (an unreadable record may be a folder's:
    everything below such a name is protected too)."""

    @classmethod
    def scan(cls, backend: Backend) -> Committed:
        records, bad = scan_records(backend)
        files: set[Parts] = set()
        names: set[Parts] = set()
        for r in records:
            parts = tuple(r.name.split("/"))
            names.add(parts)
            if r.kind == "dir":
                files.update((*parts, *f.path.split("/")) for f in r.files)
            else:
                files.add(parts)
        names.update(tuple(b.name.split("/")) for b in bad)
        return cls(frozenset(files), frozenset(names))

    def protects(self, path: Parts) -> bool:
        """True if ``path`` is a committed file, or a committed artifact is ``path`` itself or
        one of the folders it is in."""
        if path in self.files:
            return True
        return any(path[:i] in self.names for i in range(1, len(path) + 1))

    def overlaps(self, record: Record) -> bool:
        """True if making ``record`` its name's record would put it over another committed
        artifact: a committed artifact in a folder the name is in, or one inside the name."""
        parts = tuple(record.name.split("/"))
        if any(parts[:i] in self.names for i in range(1, len(parts))):
            return True
        n = len(parts)
        return any(len(other) > n and other[:n] == parts for other in self.names)


def listed_paths(name: Parts, paths: Iterable[object]) -> list[Parts]:
    """The files below folder ``name`` that an untrusted list of relative paths names (each one
    checked as a path inside a folder; anything else is skipped)."""
    out: list[Parts] = []
    for p in paths:
        try:
            out.append((*name, *validate_name(p, inside_folder=True)))
        except InvalidNameError:
            continue
    return out


def remove_listed(backend: Backend, files: Iterable[Parts], committed: Committed) -> list[Parts]:
    """Remove each of ``files`` that is a file (a single object) and that no committed record
    protects; never anything below it. Returns what was removed."""
    gone: list[Parts] = []
    for path in sorted(set(files)):
        if committed.protects(path):
            continue
        try:
            info = backend.stat(path)
            if info is None or info.is_dir:
                continue
            if backend.remove(path):
                gone.append(path)
        except CommitStoreError:
            continue
    return gone
