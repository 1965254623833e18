"""The move-aside replace (``backends/rename/aside.py``) on every backend that needs it, against
real servers: folders on a FUSE bridge (faultfs), on SMB (Samba), WebDAV (wsgidav) and SFTP
(asyncssh), and files on an SFTP server that refuses posix-rename (the replace then has no
one-step form). A writer forked from this process is stopped at each point of the
protocol (``aside._reached``) and SIGKILLed there, or one of its moves fails; then the raw
files and records on the server's disk (a backdoor, not commitstore) must hold the old version
or the new one, before and after ``gc(min_age=0)``, and commitstore's readers must agree.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from commitstore import CommitStore, CommitStoreError, open_store
from commitstore.backends.rename import aside as aside_mod
from commitstore.testing import LocalBackdoor, record_path, xxh

from .helpers.fusemount import FaultMount
from .helpers.remote_fs import remote
from .helpers.samba import PASSWORD as SMB_PASSWORD
from .helpers.samba import SambaServer
from .helpers.serverfixture import module_server
from .helpers.sftpserver import PASSWORD as SFTP_PASSWORD
from .helpers.sftpserver import SftpServer
from .helpers.webdavserver import PASSWORD as DAV_PASSWORD
from .helpers.webdavserver import WebdavServer

NAME = "ck/w"
ASIDE = "ck/.commitstore.old.w"
OLD_FILE, NEW_FILE = b"the old version " * 300, b"new bytes " * 700
OLD_DIR = {"a.bin": b"old a " * 200, "sub/b.bin": b"old b " * 100}
NEW_DIR = {"a.bin": b"new a " * 300, "c.bin": b"new c " * 50}
VERSIONS: dict[str, dict[str, Any]] = {
    "file": {"old": OLD_FILE, "new": NEW_FILE},
    "dir": {"old": OLD_DIR, "new": NEW_DIR},
}


def pending_path(name: str) -> str:
    return record_path(name).replace("/.commitstore.rec.", "/.commitstore.new.")


@dataclass
class Place:
    """A fresh store folder on a real server, and that folder on the server's disk."""

    backend: str
    url: str
    options: dict[str, Any]
    disk: Path
    door: LocalBackdoor = field(init=False)

    def __post_init__(self) -> None:
        self.door = LocalBackdoor(self.disk)

    def open(self) -> CommitStore:
        return open_store(self.url, **self.options)


# -- servers (one each per module) -----------------------------------------------------------
mount = module_server(FaultMount, "mount", attr_timeout=0)


samba = module_server(SambaServer, "samba")


dav = module_server(WebdavServer, "dav")


sftp = module_server(SftpServer, "sftp")


sftp_plain = module_server(SftpServer, "sftp_plain", posix_rename=False)


class Fixtures(Protocol):
    def getfixturevalue(self, name: str) -> Any: ...


def make_place(backend: str, request: Fixtures) -> Place:
    sub = f"t{uuid.uuid4().hex[:12]}"
    if backend == "bridge":
        mount: FaultMount = request.getfixturevalue("mount")
        mount.clear()
        place = Place(backend, str(mount.mnt / sub), {}, mount.backing / sub)
        assert place.open().describe()["strategy"] == "bridge-checked"
        return place
    if backend == "smb":
        samba: SambaServer = request.getfixturevalue("samba")
        return Place(backend, samba.url(sub), {"password": SMB_PASSWORD}, samba.share_dir / sub)
    if backend == "webdav":
        rem = remote(request.getfixturevalue("dav"), {"password": DAV_PASSWORD})
        return Place(backend, rem.url, rem.options, rem.disk)
    assert backend in ("sftp", "sftp-file")
    server = request.getfixturevalue("sftp" if backend == "sftp" else "sftp_plain")
    rem = remote(server, {"password": SFTP_PASSWORD, "known_hosts": None})
    place = Place(backend, rem.url, rem.options, rem.disk)
    assert place.open().describe()["capabilities"]["atomic_replace"] is (backend == "sftp")
    return place


CASES = [
    ("bridge", "dir"),
    ("smb", "dir"),
    ("webdav", "dir"),
    ("sftp", "dir"),
    ("sftp-file", "file"),
]
CHEAP = ("bridge", "sftp-file")
"""Where the extra cases run by default (the fastest servers); ``nox -s soak`` runs them all."""


ALL = tuple(backend for backend, _kind in CASES)


def cases(default: tuple[str, ...] = ALL) -> list[Any]:
    """:data:`CASES`, those whose backend is not in ``default`` marked soak."""
    return [
        pytest.param(b, k, id=f"{b}-{k}", marks=() if b in default else (pytest.mark.soak,))
        for b, k in CASES
    ]


# -- what the raw files say ------------------------------------------------------------------
def content(door: LocalBackdoor, rel: str, kind: str) -> Any:
    """The bytes (a file) or {path: bytes} (a folder) stored at ``rel``, None if absent."""
    path = door.root / rel
    if kind == "file":
        return path.read_bytes() if path.is_file() else None
    if not path.is_dir():
        return None
    return {
        str(p.relative_to(path)).replace(os.sep, "/"): p.read_bytes()
        for p in path.rglob("*")
        if p.is_file()
    }


def describes(raw: bytes | None, found: Any, kind: str) -> bool:
    """True if the record ``raw`` (JSON, read from disk) is of the bytes ``found``."""
    if raw is None or found is None:
        return False
    rec = json.loads(raw)
    if kind == "file":
        return bool(rec["size"] == len(found) and rec["digest"] == xxh(found))
    files = {f["path"]: (f["size"], f["digest"]) for f in rec["files"]}
    return files == {p: (len(b), xxh(b)) for p, b in found.items()}


def state(place: Place, kind: str) -> str:
    """``old`` / ``new``: the name holds that version and its record (or, for the new one, its
    pending record) describes it; ``old-aside``: the name is missing and the old version, still
    described by the record, is under the aside name; ``neither`` otherwise."""
    door = place.door
    here, aside = content(door, NAME, kind), content(door, ASIDE, kind)
    record, pending = door.read(record_path(NAME)), door.read(pending_path(NAME))
    old, new = VERSIONS[kind]["old"], VERSIONS[kind]["new"]
    if here == old and describes(record, here, kind):
        return "old"
    if here == new and (describes(record, here, kind) or describes(pending, here, kind)):
        return "new"
    if here is None and aside == old and describes(record, aside, kind):
        return "old-aside"
    return f"neither (name: {here is not None}, aside: {aside is not None})"


def commit(store: CommitStore, kind: str, which: str) -> None:
    data = VERSIONS[kind][which]
    if kind == "file":
        store.put_bytes(NAME, data, overwrite=True)
        return
    with store.stage_dir(NAME, overwrite=True) as d:
        for rel, body in data.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)


def readers_agree(place: Place, kind: str, version: str, tmp: Path) -> None:
    """commitstore's readers on a fresh handle: the name verifies and reads as ``version``."""
    store = place.open()
    result = store.verify(NAME).results[0]
    assert result.status == "ok", result
    assert store.verify().ok, store.verify()  # an aside entry is never data without a record
    expected = VERSIONS[kind][version]
    if kind == "file":
        assert store.read_bytes(NAME) == expected
        with store.open(NAME) as f:
            assert f.read() == expected
    else:
        dest = tmp / f"got-{uuid.uuid4().hex[:8]}"
        store.get_file(NAME, dest)
        assert content(LocalBackdoor(dest.parent), dest.name, "dir") == expected
    latest = store.latest()
    assert latest is not None and latest.name == NAME


def staging_left(place: Place) -> list[str]:
    out = []
    for p in place.disk.rglob("*"):
        rel = p.relative_to(place.disk).parts
        if rel[0] != ".commitstore" and any(x.startswith(".commitstore.tmp.") for x in rel):
            out.append("/".join(rel))
    return out


# -- a writer stopped at a point of the protocol ---------------------------------------------
def kill_at(place: Place, kind: str, stop_at: str, leaf: str = "w") -> None:
    """Fork a writer replacing the old version with the new one; it stops at ``stop_at`` of the
    move-aside protocol's replace of ``leaf`` (the data's name, or its record's) and says so,
    and is SIGKILLed there."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(ready_r)
            store = place.open()

            def reached(point: str, name: str) -> None:
                if (point, name) == (stop_at, leaf):
                    os.write(ready_w, b"k")
                    time.sleep(120)

            aside_mod._reached = reached
            commit(store, kind, "new")
            os.write(ready_w, b"d")
        finally:
            os._exit(0)
    os.close(ready_w)
    got = os.read(ready_r, 1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(ready_r)
    assert got == b"k", f"the writer did not stop at {stop_at!r} (it sent {got!r})"


EXPECTED = {"aside": ("old-aside", "old", "restored"), "in": ("new", "new", "aside")}
"""Per point: the state right after the kill, the state after gc, the kind of gc's item."""


@pytest.mark.crash
@pytest.mark.parametrize("point", ["aside", "in"])
@pytest.mark.parametrize(("backend", "kind"), cases())
def test_sigkill_at_each_point_leaves_old_or_new(
    backend: str, kind: str, point: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    place = make_place(backend, request)
    commit(place.open(), kind, "old")
    assert state(place, kind) == "old"
    kill_at(place, kind, point)
    killed, settled, item = EXPECTED[point]
    assert state(place, kind) == killed
    # the child really stopped between the moves: the old version is aside, not yet removed
    assert content(place.door, ASIDE, kind) == VERSIONS[kind]["old"]
    readers_agree(place, kind, settled, tmp_path)
    assert state(place, kind) == killed  # readers resolve without writing
    report = place.open().gc(min_age=0)
    assert [(i.path, i.kind) for i in report.removed if i.kind in ("aside", "restored")] == [
        (ASIDE, item)
    ], report
    assert state(place, kind) == settled
    assert content(place.door, ASIDE, kind) is None
    assert staging_left(place) == []
    assert place.door.read(pending_path(NAME)) is None
    readers_agree(place, kind, settled, tmp_path)


@pytest.mark.crash
@pytest.mark.parametrize("point", ["aside", "in"])
@pytest.mark.parametrize(("backend", "kind"), cases(CHEAP))
def test_the_next_replace_settles_a_stale_aside(
    backend: str, kind: str, point: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A replace after a crash (no gc in between) settles the aside entry first, then
    publishes: the new version stands and no aside entry is left."""
    place = make_place(backend, request)
    commit(place.open(), kind, "old")
    kill_at(place, kind, point)
    assert content(place.door, ASIDE, kind) is not None
    commit(place.open(), kind, "new")
    assert state(place, kind) == "new"
    assert content(place.door, ASIDE, kind) is None
    readers_agree(place, kind, "new", tmp_path)


@pytest.mark.crash
@pytest.mark.parametrize("point", ["aside", "in"])
def test_sigkill_in_the_record_replace_leaves_new(
    point: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Without posix-rename the record itself is replaced by the same protocol: a writer killed
    with its old record aside (the record missing) or the new one in. The data is the new
    version and its pending record says so; readers find the old record under its aside name
    (never "not committed"), and gc moves it back, then makes the pending record the record."""
    place = make_place("sftp-file", request)
    commit(place.open(), "file", "old")
    record_leaf = record_path(NAME).rsplit("/", 1)[1]
    kill_at(place, "file", point, leaf=record_leaf)
    record_aside = record_path(NAME).replace(
        "/.commitstore.rec.", "/.commitstore.old..commitstore.rec."
    )
    assert describes(place.door.read(record_aside), OLD_FILE, "file")
    assert (place.door.read(record_path(NAME)) is None) == (point == "aside")
    assert state(place, "file") == "new"
    assert [r.name for r in place.open().list()] == [NAME]
    readers_agree(place, "file", "new", tmp_path)
    report = place.open().gc(min_age=0)
    kinds = sorted(i.kind for i in report.removed if i.kind != "staging")
    assert kinds == (["pending", "restored"] if point == "aside" else ["aside", "pending"]), report
    assert place.door.read(record_aside) is None
    assert describes(place.door.read(record_path(NAME)), NEW_FILE, "file")
    readers_agree(place, "file", "new", tmp_path)


# -- failures (not crashes) of the moves -----------------------------------------------------
class FailingMoves:
    """The backend's own moves, except that the ones numbered in ``fail`` (1: old -> aside,
    2: new -> name, 3: the move back) raise an I/O error before reaching the storage."""

    def __init__(self, moves: aside_mod.AsideMoves, fail: set[int]) -> None:
        self.moves, self.fail, self.count = moves, fail, 0

    def exists(self, name: str) -> bool:
        return self.moves.exists(name)

    def move(self, src: str, dst: str) -> None:
        self.count += 1
        if self.count in self.fail:
            raise OSError(errno.EIO, f"injected failure of move {self.count}")
        self.moves.move(src, dst)

    def remove(self, name: str) -> None:
        self.moves.remove(name)


@pytest.mark.parametrize(
    ("case", "fail"),
    [
        *(pytest.param(c.values, {2, 3}, id=f"{c.id}-new-in-and-move-back") for c in cases()),
        *(pytest.param(c.values, {2}, id=f"{c.id}-new-in", marks=c.marks) for c in cases(CHEAP)),
    ],
)
def test_a_failed_move_leaves_old(
    case: tuple[str, str],
    fail: set[int],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The new version cannot move in: the old one is moved back (or, if that fails too,
    stays aside, where readers find it and gc moves it back). A typed error either way."""
    backend, kind = case
    place = make_place(backend, request)
    commit(place.open(), kind, "old")
    real = aside_mod.replace
    calls: list[FailingMoves] = []

    def replace(moves: aside_mod.AsideMoves, src: str, dst: str, notes: list[str]) -> None:
        if dst != NAME.rsplit("/", 1)[1]:  # a record on SFTP without posix-rename: untouched
            real(moves, src, dst, notes)
            return
        calls.append(FailingMoves(moves, fail))
        real(calls[-1], src, dst, notes)

    monkeypatch.setattr(aside_mod, "replace", replace)
    with pytest.raises(CommitStoreError):
        commit(place.open(), kind, "new")
    monkeypatch.undo()
    assert [c.count for c in calls] == [3], "the protocol did not try the move back"
    assert state(place, kind) == ("old-aside" if 3 in fail else "old")
    readers_agree(place, kind, "old", tmp_path)
    place.open().gc(min_age=0)
    assert state(place, kind) == "old"
    assert content(place.door, ASIDE, kind) is None
    assert staging_left(place) == []
    readers_agree(place, kind, "old", tmp_path)


def test_a_refused_rename_on_the_bridge_leaves_old(
    mount: FaultMount, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Once the old folder is aside, the FUSE server itself refuses (EIO) every rename onto
    the name: the new folder cannot move in and the old one cannot move back. It stays aside
    until gc moves it back; readers serve it meanwhile."""
    place = make_place("bridge", _Request(mount))
    commit(place.open(), "dir", "old")

    def reached(point: str, name: str) -> None:
        if point == "aside":
            mount.set(rename_errno={"match": f"/{NAME}", "errno": "EIO", "times": 100})

    monkeypatch.setattr(aside_mod, "_reached", reached)
    with pytest.raises(CommitStoreError):
        commit(place.open(), "dir", "new")
    mine = f"/{place.disk.name}/"
    refused = [
        e for e in mount.events() if e["op"] == "rename_refused" and e["path"].startswith(mine)
    ]
    mount.clear()
    sources = sorted(e["source"].rsplit("/", 1)[1][:17] for e in refused)
    assert sources == [".commitstore.old.", ".commitstore.tmp."], refused  # in, and back
    assert state(place, "dir") == "old-aside"
    readers_agree(place, "dir", "old", tmp_path)
    place.open().gc(min_age=0)
    assert state(place, "dir") == "old"
    assert staging_left(place) == []


class _Request:
    """Just enough of a FixtureRequest for :func:`make_place` outside parametrized tests."""

    def __init__(self, mount: FaultMount) -> None:
        self.mount = mount

    def getfixturevalue(self, name: str) -> Any:
        assert name == "mount"
        return self.mount


# -- what gc must never do -------------------------------------------------------------------
@pytest.mark.crash
def test_gc_keeps_an_aside_that_does_not_verify_while_the_name_is_missing(
    mount: FaultMount,
) -> None:
    """The name missing and its aside entry damaged (matching no record): gc(min_age=0) moves
    nothing and deletes nothing; it reports the entry kept, with the reason."""
    place = make_place("bridge", _Request(mount))
    commit(place.open(), "dir", "old")
    kill_at(place, "dir", "aside")
    damaged = place.disk / ASIDE / "a.bin"
    damaged.write_bytes(b"X" + damaged.read_bytes()[1:])
    assert place.open().verify(NAME).results[0].status == "missing"
    report = place.open().gc(min_age=0)
    kept = [(i.path, i.kind) for i in report.kept]
    assert (ASIDE, "aside") in kept, report
    assert content(place.door, ASIDE, "dir") is not None
    assert content(place.door, NAME, "dir") is None


@pytest.mark.crash
def test_a_dry_run_reports_the_roll_back_and_moves_nothing(mount: FaultMount) -> None:
    place = make_place("bridge", _Request(mount))
    commit(place.open(), "dir", "old")
    kill_at(place, "dir", "aside")
    report = place.open().gc(min_age=0, dry_run=True)
    assert [(i.path, i.kind) for i in report.removed if i.kind == "restored"] == [
        (ASIDE, "restored")
    ], report
    assert state(place, "dir") == "old-aside"
    place.open().gc(min_age=0)
    assert state(place, "dir") == "old"


def test_gc_leaves_files_named_like_asides_inside_a_committed_folder(tmp_path: Path) -> None:
    """Inside a committed folder artifact, files named like aside entries are the caller's:
    gc neither moves nor removes them, and the folder verifies."""
    store = open_store(tmp_path / "s")
    files = {".commitstore.old.w": b"mine", "sub/.commitstore.oldh.0123": b"also mine"}
    with store.stage_dir("ck/w") as d:
        for rel, body in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)
    report = store.gc(min_age=0)
    assert report.removed == () and report.kept == (), report
    assert content(LocalBackdoor(tmp_path / "s"), "ck/w", "dir") == files
    assert store.verify().ok


@pytest.mark.crash
def test_a_long_name_is_restored_through_its_hashed_aside(mount: FaultMount) -> None:
    """A final part too long for ``.commitstore.old.<name>`` gets a hashed aside name; gc
    still finds the name (from the record under the same hash) and moves the old one back."""
    place = make_place("bridge", _Request(mount))
    long = "ck/" + "x" * 250
    store = place.open()
    with store.stage_dir(long) as d:
        (d / "a.bin").write_bytes(b"old")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            child = place.open()

            def reached(point: str, name: str) -> None:
                if point == "aside":
                    os.write(w, b"k")
                    time.sleep(120)

            aside_mod._reached = reached
            with child.stage_dir(long, overwrite=True) as d:
                (d / "a.bin").write_bytes(b"new")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(r)
    assert got == b"k"
    asides = [p.name for p in (place.disk / "ck").iterdir() if p.name.startswith(".commitstore.o")]
    assert len(asides) == 1 and asides[0].startswith(".commitstore.oldh."), asides
    assert not (place.disk / long).exists()
    assert place.open().verify(long).results[0].status == "ok"
    report = place.open().gc(min_age=0)
    assert [i.kind for i in report.removed if i.kind == "restored"] == ["restored"], report
    assert (place.disk / long / "a.bin").read_bytes() == b"old"
    shutil.rmtree(place.disk, ignore_errors=True)
