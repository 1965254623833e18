"""The old-or-new check after one case of a fault matrix, from the raw files or objects of the
store (a backdoor: ``os`` calls, or the server's own client; no commitstore code) and then
through a freshly opened store.

Layout facts (record and pending-record paths, the record's fields) come from ``docs/format.md``,
not from commitstore.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import xxhash

from commitstore import CommitStore, CommitStoreError, NotFoundError
from commitstore.testing import Backdoor, pending_paths, record_path

from .ops import GONE, Op, Version

STAGING = ".commitstore.tmp."
PENDING = ".commitstore.new."


def pending_path(name: str) -> str:
    return record_path(name).replace("/.commitstore.rec.", f"/{PENDING}")


def xxh(data: bytes) -> str:
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)


def _json(door: Backdoor, rel: str) -> Any:
    data = door.read(rel)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return "unreadable"


def raw_version(door: Backdoor, name: str, files: list[str]) -> Version | None:
    """The bytes at ``name``, the ``{path: bytes}`` of a folder there, or None."""
    data = door.read(name)
    if data is not None:
        return data
    prefix = name + "/"
    inside = {f[len(prefix) :]: door.read(f) for f in files if f.startswith(prefix)}
    return {k: v for k, v in inside.items() if v is not None} or None


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


def manifest_hex(files: dict[str, bytes]) -> str:
    """A folder's manifest digest (hex), as ``docs/format.md`` defines it."""
    h = xxhash.xxh3_128()
    for path in sorted(files):
        body = files[path]
        h.update(f"{path}\t{len(body)}\t{xxh(body)}\n".encode())
    return h.hexdigest()


def staged_whole(door: Backdoor, name: str, version: Version) -> bool:
    """True if the staged copy of folder ``version`` (an object-store folder replace copies the
    new version from there over the old files) holds exactly its files."""
    if isinstance(version, bytes):
        return False
    head, _, last = name.rpartition("/")
    prefix = f".commitstore/staged/{head + '/' if head else ''}.commitstore.stg.{last}."
    prefix += f"{manifest_hex(version)}/"
    found = {f[len(prefix) :]: door.read(f) for f in door.files() if f.startswith(prefix)}
    return found == version


def state(door: Backdoor, name: str, versions: dict[str, Version], *, settled: bool = False) -> str:
    """What ``name`` verifies as, from the raw files: a label of ``versions``, :data:`GONE` (no
    record claims it), or a description of a broken state. ``settled``: a version that is only
    claimed by the pending record does not count (after gc, every pending record is resolved).
    Before gc, a folder whose pending record describes a version whole in its staged copy is
    that version (readers and gc finish the copy from there)."""
    data = raw_version(door, name, door.files())
    label = next((k for k, v in versions.items() if v == data), None)
    record = _json(door, record_path(name))
    pendings = [_json(door, p) for p in pending_paths(door, name)]
    via_pending = (
        label is not None
        and not settled
        and any(describes(p, name, versions[label]) for p in pendings)
    )
    if not settled:  # a folder replace stopped while copying: its pending record and staged copy
        staged = (k for k, v in versions.items() if any(describes(p, name, v) for p in pendings))
        if (found := next(staged, None)) is not None and staged_whole(door, name, versions[found]):
            return found
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


def leftovers(door: Backdoor) -> list[str]:
    """Files with a staging name or a pending record's name anywhere in the store."""
    return [f for f in door.files() if any(p.startswith((STAGING, PENDING)) for p in f.split("/"))]


def chain(exc: BaseException) -> list[list[Any]]:
    """``[type name, errno, typed]`` of an exception and of each one it was raised from."""
    out: list[list[Any]] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 8:
        typed = isinstance(seen, CommitStoreError)
        out.append([type(seen).__name__, getattr(seen, "errno", None), typed])
        seen = seen.__cause__ or seen.__context__
    return out


def chain_of(reply: dict[str, Any]) -> str:
    """What a case ended with, for a failure message."""
    if reply.get("killed"):
        return "killed"
    if reply.get("outcome") != "raised":
        return str(reply.get("outcome"))
    return " <- ".join(f"{n}({e})" if e is not None else n for n, e, _ in reply["chain"])


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
        elif (
            err == "ENOSPC"
            and not str(reply.get("call", "")).startswith("close")
            and not any(c[0] == "InsufficientSpaceError" for c in reply["chain"])
        ):
            # (close(2) failing with ENOSPC: typed is enough; shutil.rmtree closes such a
            # descriptor again and reports the EBADF)
            # ENOSPC is documented as InsufficientSpaceError (a CommitError saying the new
            # version stands may carry it as its cause)
            problems.append(f"ENOSPC raised {top[0]}, not InsufficientSpaceError")
    return problems


def check_returned(reply: dict[str, Any]) -> list[str]:
    """A write call that returned: a commit it reports as not durable says why, and warned."""
    summary = reply.get("summary") or {}
    if reply.get("outcome") != "ok" or reply.get("killed") or summary.get("durable", True):
        return []
    if not summary.get("notes") or not summary.get("warned"):
        return [f"durable=False without a note and a warning: {summary}"]
    return []


def check_states(
    door: Backdoor, op: Op, reply: dict[str, Any], *, settled: bool, binary: bool = False
) -> list[str]:
    """Every name verifies as a version ``op`` allows; ``binary``: a write call that raised left
    every name as it was (the fault was one failed step, which the commit could survive)."""
    problems = []
    expect = op.allowed
    if binary and op.on_raise is not None and reply.get("outcome") == "raised":
        expect = op.on_raise
    if reply.get("outcome") == "ok" and not reply.get("killed"):
        if op.on_success is not None:
            expect = op.on_success
        elif "deleted" in reply.get("summary", {}):
            deleted = set(reply["summary"]["deleted"])
            expect = {n: {GONE} if n in deleted else {"old"} for n in op.versions}
    for name, versions in op.versions.items():
        found = state(door, name, versions, settled=settled)
        if found not in expect[name]:
            when = "after gc" if settled else "before gc"
            problems.append(f"{name} is {found!r} {when} (allowed: {sorted(expect[name])})")
    return problems


def check_case(
    door: Backdoor,
    reopen: Callable[[], CommitStore],
    op: Op,
    reply: dict[str, Any],
    err: str,
    *,
    binary: bool = False,
) -> list[str]:
    """Every check of one case (``door``: the store's storage; ``reopen``: a fresh store on it);
    an empty list when all hold. ``binary``: see :func:`check_states`."""
    problems = check_outcome(reply, err)
    if problems and reply.get("outcome") == "setup failed":
        return problems
    problems += check_returned(reply)
    problems += check_states(door, op, reply, settled=False, binary=binary)
    try:
        fresh = reopen()
        fresh.gc(min_age=0)
    except Exception as exc:
        return [*problems, f"reopen + gc raised {type(exc).__name__}: {exc}"]
    problems += check_states(door, op, reply, settled=True, binary=binary)
    left = leftovers(door)
    if left:
        problems.append(f"left after gc: {left}")
    report = fresh.verify()
    if not report.ok:
        bad = [(r.name, r.status) for r in report.results if r.status not in ("ok", "no_record")]
        problems.append(f"verify() after gc reports {bad}")
    for name, versions in op.versions.items():
        found = state(door, name, versions, settled=True)
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
