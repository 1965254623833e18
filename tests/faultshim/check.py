"""The old-or-new check after one case of a fault matrix, from the raw files of the store (a
backdoor: ``os`` calls, no commitstore code) and then through a freshly opened store.

Layout facts (record and pending-record paths, the record's fields) come from ``docs/format.md``,
not from commitstore.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import xxhash

from commitstore import NotFoundError, open_store
from commitstore.testing import record_path

from .ops import GONE, Op, Version

STAGING = ".commitstore.tmp."
PENDING = ".commitstore.new."


def pending_path(name: str) -> str:
    return record_path(name).replace("/.commitstore.rec.", f"/{PENDING}")


def xxh(data: bytes) -> str:
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, IsADirectoryError):
        return "unreadable"


def raw_version(root: Path, name: str) -> Version | None:
    """The bytes of ``root/name``, the ``{path: bytes}`` of a folder there, or None."""
    path = root / name
    if path.is_file():
        return path.read_bytes()
    if not path.is_dir():
        return None
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            full = Path(dirpath) / f
            out[full.relative_to(path).as_posix()] = full.read_bytes()
    return out


def describes(record: Any, name: str, version: Version) -> bool:
    """True if ``record`` (parsed JSON) is a record of ``name`` whose sizes and digests are
    those of ``version``."""
    if not isinstance(record, dict) or record.get("name") != name:
        return False
    if isinstance(version, bytes):
        return bool(
            record.get("kind") == "file"
            and record.get("size") == len(version)
            and record.get("digest") == xxh(version)
        )
    files = sorted((p, len(d), xxh(d)) for p, d in version.items())
    listed = record.get("files")
    if record.get("kind") != "dir" or not isinstance(listed, list):
        return False
    try:
        found = sorted((f["path"], f["size"], f["digest"]) for f in listed)
    except (TypeError, KeyError):
        return False
    return found == files and record.get("size") == sum(len(d) for d in version.values())


def state(root: Path, name: str, versions: dict[str, Version], *, settled: bool = False) -> str:
    """What ``name`` verifies as, from the raw files: a label of ``versions``, :data:`GONE` (no
    record claims it), or a description of a broken state. ``settled``: a version that is only
    claimed by the pending record does not count (after gc, every pending record is resolved)."""
    data = raw_version(root, name)
    label = next((k for k, v in versions.items() if v == data), None)
    record = _json(root / record_path(name))
    pending = _json(root / pending_path(name))
    via_pending = (
        label is not None and not settled and describes(pending, name, versions[label])
    )
    if record is not None:
        if label is not None and describes(record, name, versions[label]):
            return label
        if via_pending:
            assert label is not None
            return label
        claims = next((k for k, v in versions.items() if describes(record, name, v)), "other")
        found = "nothing" if data is None else (label or "other data")
        return f"broken: the record describes {claims!r}, the data is {found!r}"
    if via_pending:
        assert label is not None
        return label
    return GONE


def leftovers(root: Path) -> list[str]:
    """Staging names and pending records anywhere below the root."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        for n in (*dirs, *files):
            if n.startswith((STAGING, PENDING)):
                out.append(os.path.relpath(os.path.join(dirpath, n), root))
    return sorted(out)


def check_outcome(reply: dict[str, Any], err: str) -> list[str]:
    """The operation's outcome: a typed error or success; the fault really hit."""
    problems = []
    if reply.get("outcome") == "setup failed":
        return [f"setup failed: {reply.get('message')}"]
    if err == "SIGKILL":
        if not reply["killed"]:
            problems.append(f"not killed (outcome {reply.get('outcome')})")
        return problems
    if reply["killed"] or not reply.get("fired"):
        problems.append(f"the fault did not fire (outcome {reply.get('outcome')})")
    if reply.get("outcome") == "raised":
        top = reply["chain"][0]
        if not top[2]:
            problems.append(f"untyped error escaped: {top[0]}: {reply.get('message')}")
        elif err == "ENOSPC" and top[0] != "InsufficientSpaceError" and top[1] != 28:
            # ENOSPC is documented as InsufficientSpaceError; a CommitError saying the new
            # version stands may wrap it.
            if not any(c[0] == "InsufficientSpaceError" for c in reply["chain"]):
                problems.append(f"ENOSPC raised {top[0]}, not InsufficientSpaceError")
    return problems


def check_states(root: Path, op: Op, reply: dict[str, Any], *, settled: bool) -> list[str]:
    problems = []
    expect = op.allowed
    if reply.get("outcome") == "ok" and not reply.get("killed"):
        if op.on_success is not None:
            expect = op.on_success
        elif "deleted" in reply.get("summary", {}):
            deleted = set(reply["summary"]["deleted"])
            expect = {n: {GONE} if n in deleted else {"old"} for n in op.versions}
    for name, versions in op.versions.items():
        found = state(root, name, versions, settled=settled)
        if found not in expect[name]:
            when = "after gc" if settled else "before gc"
            problems.append(f"{name} is {found!r} {when} (allowed: {sorted(expect[name])})")
    return problems


def check_case(root: Path, op: Op, reply: dict[str, Any], err: str) -> list[str]:
    """Every check of one case; an empty list when all hold."""
    problems = check_outcome(reply, err)
    if problems and reply.get("outcome") == "setup failed":
        return problems
    problems += check_states(root, op, reply, settled=False)
    try:
        fresh = open_store(root)
        fresh.gc(min_age=0)
    except Exception as exc:
        return [*problems, f"reopen + gc raised {type(exc).__name__}: {exc}"]
    problems += check_states(root, op, reply, settled=True)
    left = leftovers(root)
    if left:
        problems.append(f"left after gc: {left}")
    report = fresh.verify()
    if not report.ok:
        bad = [(r.name, r.status) for r in report.results if r.status not in ("ok", "no_record")]
        problems.append(f"verify() after gc reports {bad}")
    for name, versions in op.versions.items():
        found = state(root, name, versions, settled=True)
        if found == GONE:
            try:
                fresh.record(name)
                problems.append(f"{name}: a record is found through the API, none on disk")
            except NotFoundError:
                pass
        elif found in versions:
            version = versions[found]
            if isinstance(version, bytes):
                if fresh.read_bytes(name) != version:
                    problems.append(f"{name}: read_bytes differs from the {found} version")
            elif fresh.verify(name).results[0].status != "ok":
                problems.append(f"{name}: verify({name!r}) is not ok")
    return problems
