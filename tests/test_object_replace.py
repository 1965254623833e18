"""Folder replace on object stores is old-or-new: the new version is uploaded whole (a staged
copy) before anything old is touched, then copied over the old files with the store's checked
server-side copy; a failure at any request, or a SIGKILL mid-copy, leaves a name that verifies
as the old version or the new one, and gc settles it (``backends/object/dirsink``).

Every state is judged twice: through the backdoor, against ``docs/format.md`` computed here
(the files under the name are exactly the old or the new ones, or the pending record names the
new version and its staged copy holds exactly the new files), and through a fresh store.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from commitstore import BackendUnavailableError, CommitStoreError, open_store
from commitstore.fsspec import CommitFileSystem
from commitstore.mirrors.sync import sync_mirrors
from commitstore.testing import GcsBackdoor, S3Backdoor, Target, pending_paths, record_path

from .helpers.azurite import Azurite, azure_backdoor
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.s3servers import BUCKET, MotoServer

NAME = "run/ckpt-7"
OLD = {"a.bin": b"old a " * 300, "b.bin": b"old b " * 200, "old-only.txt": b"only old"}
NEW = {"a.bin": b"NEW a " * 310, "b.bin": b"NEW b " * 190, "sub/new-only.txt": b"only new"}
ADDS_FIRST = {"0-only-new.bin": b"only new, first in order " * 40, "a.bin": NEW["a.bin"]}
"""A new version whose first file in order (the copy made first, alone) is one the old version
lacks: stopped after that copy, the final keys are the old files plus it."""


# -- the layout of docs/format.md, computed independently ------------------------------------
def manifest_hex(files: dict[str, bytes]) -> str:
    h = xxhash.xxh3_128()
    for path in sorted(files):
        body = files[path]
        h.update(f"{path}\t{len(body)}\txxh3_128:{xxhash.xxh3_128_hexdigest(body)}\n".encode())
    return h.hexdigest()


def staged_prefix(name: str, files: dict[str, bytes]) -> str:
    head, _, last = name.rpartition("/")
    return f".commitstore/staged/{head}/.commitstore.stg.{last}.{manifest_hex(files)}/"


def under(door: Any, prefix: str) -> dict[str, bytes]:
    return {f[len(prefix) :]: door.read(f) for f in door.files() if f.startswith(prefix)}


def backdoor_state(door: Any, name: str = NAME, new: dict[str, bytes] = NEW) -> str:
    """``old``, ``new`` or ``staged`` (the final keys a mix, the new version whole in its staged
    copy and named by the pending record); anything else fails the test."""
    final = under(door, name + "/")
    record = json.loads(door.read(record_path(name)))
    if final == OLD and record["digest"] == f"xxh3_128:{manifest_hex(OLD)}":
        return "old"
    if final == new:
        return "new"  # under the new record, or the pending one (the core resolves that)
    found = pending_paths(door, name)
    assert found, f"neither version, and no pending record: {sorted(final)}"
    pending = door.read(found[-1])
    assert pending is not None
    assert json.loads(pending)["digest"] == f"xxh3_128:{manifest_hex(new)}"
    assert under(door, staged_prefix(name, new)) == new, "a mix without a whole staged copy"
    return "staged"


def check_store_agrees(t: Target, tmp_path: Path, state: str, new: dict[str, bytes] = NEW) -> None:
    """A fresh store sees exactly the version the backdoor shows (``verify``, ``latest``,
    ``get_file`` and a mirror's copy agree), and gc leaves it final."""
    fresh = t.reopen()
    want = OLD if state == "old" else new
    assert fresh.verify(NAME).ok
    latest = fresh.latest()
    assert latest is not None and latest.digest == f"xxh3_128:{manifest_hex(want)}"
    out = tmp_path / f"got-{time.monotonic_ns()}"
    fresh.get_file(NAME, out)
    assert files_below(out) == want
    fresh.get_file(NAME, out.with_name(out.name + "-size"), verify="size")
    assert files_below(out.with_name(out.name + "-size")) == want
    for path, body in want.items():  # member by member, as DCP and fsspec read a folder
        assert fresh.read_member(latest, path) == body
        with fresh.open_member(latest, path) as f:
            assert f.read() == body
    view = CommitFileSystem(root=fresh.url)  # the commit:// view, over this very store
    assert view._root is not None
    view._stores[view._root] = fresh
    for path in {*OLD, *want}:  # never a file of the other version beside these
        url = f"{fresh.url}/{NAME}/{path}"
        if path in want:
            assert view.cat_file(url) == want[path], path
        else:
            with pytest.raises((FileNotFoundError, CommitStoreError)):
                view.cat_file(url)
    root = tmp_path / f"mirror-{time.monotonic_ns()}"
    mirror = open_store(str(root))
    report = sync_mirrors(fresh._committer, [mirror._committer], repair=True)
    assert report.ok, report
    assert files_below(root / NAME) == want  # the mirror's copy, read beside the API
    assert json.loads((root / record_path(NAME)).read_bytes())["digest"] == latest.digest
    fresh.gc(min_age=0)
    assert backdoor_state(t.door, new=new) == ("old" if state == "old" else "new")
    assert fresh.record(NAME).digest == f"xxh3_128:{manifest_hex(want)}"
    assert pending_paths(t.door, NAME) == []
    assert [f for f in t.door.files() if f.startswith(".commitstore/staged/")] == []
    assert t.reopen().verify().ok


def files_below(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def commit(store: Any, files: dict[str, bytes], *, overwrite: bool, name: str = NAME) -> None:
    with store.stage_dir(name, overwrite=overwrite) as d:
        for rel, body in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)


# -- request-level fault injection -----------------------------------------------------------
PRIMITIVES = (
    "head",
    "list_objects",
    "delete_key",
    "delete_keys",
    "server_copy",
    "read_small_tagged",
    "open_read",
)


class Requests:
    """Counts every storage request a backend makes (each primitive call, and each call of an
    upload session), logging (what, key); request number ``fail_at`` raises instead."""

    def __init__(self, backend: Any, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()  # a folder's files go up (and are copied) several at once
        for meth in PRIMITIVES:
            setattr(backend, meth, self._wrap(meth, getattr(backend, meth)))
        make = backend.new_upload

        def new_upload(parts: tuple[str, ...], **kw: Any) -> Any:
            up = make(parts, **kw)
            for meth in ("put_whole", "send_part", "complete"):
                setattr(up, meth, self._wrap(meth, getattr(up, meth), "/".join(parts)))
            return up

        backend.new_upload = new_upload

    def _wrap(self, what: str, fn: Callable[..., Any], key: str = "") -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            target = args[1] if what == "server_copy" else (args[0] if args else ())
            where = key or "/".join(target)
            with self._lock:
                self.log.append((what, where))
                hit = len(self.log) == self.fail_at
            if hit:
                raise BackendUnavailableError(f"injected failure of request {self.fail_at}")
            return fn(*args, **kw)

        return call


# -- targets ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        server.stop()


def make_target(kind: str, request: pytest.FixtureRequest, **extra: Any) -> Target:
    """A fresh store on ``kind``'s server (``extra``: more store options, for every handle)."""
    prefix = f"r{time.monotonic_ns()}"
    if kind == "s3":
        moto: MotoServer = request.getfixturevalue("moto")
        url, opts = moto.url(prefix), moto.options()
        door: Any = S3Backdoor(moto.client(), BUCKET, prefix)
    elif kind == "gcs":
        gcs: FakeGcs = request.getfixturevalue("gcs")
        url, opts = gcs.url(prefix), gcs.options()
        door = GcsBackdoor(gcs.endpoint, GCS_BUCKET, prefix)
    else:
        az: Azurite = request.getfixturevalue("azurite")
        url, opts = az.url(prefix), az.options()
        door = azure_backdoor(az, prefix)
    opts = {**opts, **extra}
    store = open_store(url, **opts)
    backend: Any = store._committer.backend
    known = {**opts, "conditional_writes": backend.conditional_writes()}
    return Target(store, door, lambda: open_store(url, **known))


KINDS = ["s3", "gcs", "azure"]


def prepared(kind: str, request: pytest.FixtureRequest, **extra: Any) -> Target:
    t = make_target(kind, request, **extra)
    commit(t.store, OLD, overwrite=False)
    t.store.list()  # the conditional-write probe and the first scan happen before counting
    return t


@pytest.mark.parametrize("kind", KINDS)
def test_replace_stages_everything_before_touching_old(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = prepared(kind, request)
    reqs = Requests(t.store._committer.backend)
    commit(t.store, NEW, overwrite=True)
    staged = staged_prefix(NAME, NEW).rstrip("/")
    log = reqs.log
    touching_old = [
        i
        for i, (what, key) in enumerate(log)
        if what in ("server_copy", "delete_key", "delete_keys") and not key.startswith(".")
    ]
    staged_done = [i for i, (what, key) in enumerate(log) if what == "put_whole" and staged in key]
    assert len(staged_done) == len(NEW) and touching_old
    assert max(staged_done) < min(touching_old)
    assert sum(what == "server_copy" for what, _ in log) == len(NEW)
    assert backdoor_state(t.door) == "new"
    check_store_agrees(t, tmp_path, "new")


def check_settles(t: Target, name: str, state: str) -> None:
    """The cheap form of :func:`check_store_agrees` for one of many names in one store: the
    store verifies ``name`` as the version the backdoor shows, and gc leaves it final."""
    want = OLD if state == "old" else NEW
    result = t.store.verify(name).results[0]
    assert result.status == "ok", result
    found = t.store.latest()
    assert found is not None and found.digest == f"xxh3_128:{manifest_hex(want)}"
    t.store.gc(min_age=0)
    assert backdoor_state(t.door, name) == ("old" if state == "old" else "new")
    assert t.store.record(name).digest == f"xxh3_128:{manifest_hex(want)}"
    assert pending_paths(t.door, name) == []
    assert not any(f.startswith(".commitstore/staged/") for f in t.door.files())


def landmarks(log: list[tuple[str, str]]) -> list[int]:
    """The requests of one replace where its state changes (1-based): the pending record, the
    first staged upload, each server-side copy, the first delete of an old file and of the
    staged copy, the record."""
    out = []
    for i, (what, key) in enumerate(log, 1):
        first = (
            (what == "put_whole" and ".commitstore.new." in key)
            or (
                what == "put_whole"
                and "/staged/" in key
                and not any("/staged/" in k for _, k in log[: i - 1])
            )
            or what == "server_copy"
            or (
                what == "delete_key"
                and not key.startswith(".")
                and not any(w == "delete_key" and not k.startswith(".") for w, k in log[: i - 1])
            )
            or (what == "delete_keys" and "/staged/" in key)
            or (what == "put_whole" and ".commitstore.rec." in key)
        )
        if first:
            out.append(i)
    return out


def every_request(kind: str, request: pytest.FixtureRequest, *, every: bool) -> None:
    """Fail request k of one replace, for every k (or at its :func:`landmarks`), each on its
    own name in one store (step k, so ``latest`` is always the name just tried)."""
    t = make_target(kind, request)
    commit(t.store, OLD, overwrite=False, name="run/ckpt-0")
    reqs = Requests(t.store._committer.backend)
    commit(t.store, NEW, overwrite=True, name="run/ckpt-0")
    total = len(reqs.log)
    points = list(range(1, total + 1)) if every else landmarks(reqs.log)
    assert len(points) >= 7
    seen: dict[str, int] = {}
    outcomes: dict[tuple[str, str], int] = {}
    for k in points:
        name = f"run/ckpt-{k}"
        commit(t.store, OLD, overwrite=False, name=name)
        reqs.fail_at, reqs.log = k, []
        try:
            commit(t.store, NEW, overwrite=True, name=name)
            outcome = "returned"
        except CommitStoreError:
            outcome = "raised"
        reqs.fail_at = None
        assert len(reqs.log) >= k, f"request {k} of {total} was never made"
        state = backdoor_state(t.door, name)
        seen[state] = seen.get(state, 0) + 1
        outcomes[(outcome, state)] = outcomes.get((outcome, state), 0) + 1
        # the binary outcome (docs/guarantees.md): a call that raised left the old version; a
        # call that returned left the new version (a replace that failed among its server-side
        # copies returns its record: the new version is whole in its staged copy)
        assert (outcome, state) != ("raised", "new"), (k, reqs.log)
        assert (outcome, state) != ("raised", "staged"), (k, reqs.log)
        assert (outcome, state) != ("returned", "old"), (k, reqs.log)
        check_settles(t, name, state)
    # failures before the data's publish reach the caller; those after it return the record
    # (durable=False, the record write failing among them)
    assert ("raised", "old") in outcomes and ("returned", "new") in outcomes, outcomes
    assert set(seen) == {"old", "staged", "new"}, seen  # every row of the crash table


SOAK = pytest.mark.soak


@pytest.mark.parametrize(
    "kind", ["s3", pytest.param("gcs", marks=SOAK), pytest.param("azure", marks=SOAK)]
)
def test_failure_at_each_step_of_a_replace_leaves_old_or_new(
    kind: str, request: pytest.FixtureRequest
) -> None:
    every_request(kind, request, every=False)


@pytest.mark.soak
@pytest.mark.parametrize("kind", KINDS)
def test_failure_at_every_request_of_a_replace_leaves_old_or_new(
    kind: str, request: pytest.FixtureRequest
) -> None:
    every_request(kind, request, every=True)


def _kill_mid_copy(t: Target, copies_before_kill: int, new: dict[str, bytes] = NEW) -> None:
    """Fork a writer that replaces the folder and stops after its ``copies_before_kill``-th
    server-side copy; SIGKILL it there (a real process, killed mid-replace)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(ready_r)
            store = t.reopen()
            backend: Any = store._committer.backend
            copy, done, lock = backend.server_copy, [], threading.Lock()

            def server_copy(*args: Any, **kw: Any) -> Any:
                got = copy(*args, **kw)
                with lock:  # copies run several at a time
                    done.append(1)
                    hit = len(done) == copies_before_kill
                if hit:
                    os.write(ready_w, b"k")
                    time.sleep(120)
                return got

            backend.server_copy = server_copy
            commit(store, new, overwrite=True)
            os.write(ready_w, b"d")
        finally:
            os._exit(0)
    os.close(ready_w)
    got = os.read(ready_r, 1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(ready_r)
    assert got == b"k", "the writer finished before it could be killed"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("copies", [1, pytest.param(2, marks=SOAK), pytest.param(3, marks=SOAK)])
def test_sigkill_mid_copy_verifies_as_new_and_gc_rolls_forward(
    kind: str, copies: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = prepared(kind, request)
    _kill_mid_copy(t, copies)
    assert backdoor_state(t.door) == "staged"  # mid-copy: only the staged copy is whole
    fresh = t.reopen()
    result = fresh.verify(NAME).results[0]
    assert (result.status, "staged copy" in result.detail) == ("ok", True)
    check_store_agrees(t, tmp_path, "staged")


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_after_copying_an_added_file_every_reader_serves_new(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The first copy is of a file only the new version has: killed right after it, the final
    keys are the old version's files, intact, plus that file. Only the unlisted file tells them
    from the old version, and every reader must see it: ``verify`` and ``latest`` name the new
    version (whole in its staged copy), so ``get_file`` and a mirror's copy serve it too, never
    the old files that still match the old record."""
    t = prepared(kind, request)
    _kill_mid_copy(t, 1, new=ADDS_FIRST)
    final = under(t.door, NAME + "/")
    assert final == {**OLD, "0-only-new.bin": ADDS_FIRST["0-only-new.bin"]}
    assert backdoor_state(t.door, new=ADDS_FIRST) == "staged"
    check_store_agrees(t, tmp_path, "staged", new=ADDS_FIRST)


SAME_SIZES = {path: body.upper() for path, body in OLD.items()}
"""A same-size overwrite (the usual one of a checkpoint): sizes cannot tell it from the old."""


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_mid_copy_of_a_same_size_replace_never_serves_a_mix(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Killed after its first copy, a same-size replace leaves one new file among old ones of
    the same sizes: a size-level read (``get_file(verify="size")``, the commit:// view) must
    serve the new version whole, never the old record's sizes over a mix."""
    t = prepared(kind, request)
    _kill_mid_copy(t, 1, new=SAME_SIZES)
    final = under(t.door, NAME + "/")
    assert final not in (OLD, SAME_SIZES)  # a mix
    assert backdoor_state(t.door, new=SAME_SIZES) == "staged"
    check_store_agrees(t, tmp_path, "staged", new=SAME_SIZES)


@pytest.mark.parametrize("gone_at", [1, len(ADDS_FIRST) + 1], ids=["checking", "copying"])
def test_get_file_racing_a_live_replace_serves_new(
    gone_at: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A reader sent to a live replace's staged copy (the final keys a mix) finds it deleted
    meanwhile (the copies done, the record not written yet), while it checks the staged copy
    or while it copies it out: it reads the new version where it is now, under the name,
    instead of calling a healthy store damaged."""
    t = prepared("s3", request)
    writer = t.reopen()
    wb: Any = writer._committer.backend
    copied, go_on, staged_gone, reader_done = (threading.Event() for _ in range(4))
    copies: list[int] = []
    copy, remove = wb.copy_checked, wb.remove

    def copy_checked(*args: Any, **kw: Any) -> Any:
        got = copy(*args, **kw)
        copies.append(1)
        if len(copies) == 1:  # the added file is in: the final keys are a mix
            copied.set()
            go_on.wait(30)
        return got

    def removing(parts: tuple[str, ...]) -> Any:
        got = remove(parts)
        if parts[:2] == (".commitstore", "staged"):  # copies done, record not written yet
            staged_gone.set()
            reader_done.wait(30)
        return got

    wb.copy_checked, wb.remove = copy_checked, removing
    failed: list[BaseException] = []

    def write() -> None:
        try:
            commit(writer, ADDS_FIRST, overwrite=True)
        except BaseException as exc:  # pragma: no cover - reported below
            failed.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        assert copied.wait(30)
        reader = t.reopen()
        rb: Any = reader._committer.backend
        open_read = rb.open_read

        staged_reads: list[int] = []

        def reading(parts: tuple[str, ...]) -> Any:
            if parts[:2] == (".commitstore", "staged"):
                staged_reads.append(1)
                if len(staged_reads) == gone_at:
                    go_on.set()  # the writer finishes its copies and deletes the staged copy
                    assert staged_gone.wait(30)
            return open_read(parts)

        rb.open_read = reading
        out = tmp_path / "got"
        reader.get_file(NAME, out)
        assert go_on.is_set(), "the reader never went to the staged copy"
        assert files_below(out) == ADDS_FIRST
    finally:
        reader_done.set()
        go_on.set()
        thread.join(60)
    assert not failed, failed
    assert backdoor_state(t.door, new=ADDS_FIRST) == "new"


NEWER = {"a.bin": b"N2 a " * 333, "b.bin": b"N2 b " * 170, "z-newer-only.txt": b"only newer"}


def _commit_failing_at_copy(store: Any, files: dict[str, bytes], failing: int) -> Any:
    """Replace ``NAME`` with ``files``; the ``failing``-th server-side copy raises: the call
    returns its record (``durable`` False), its copies stopped, the version whole in its staged
    copy."""
    backend: Any = store._committer.backend
    copy, calls, lock = backend.server_copy, [], threading.Lock()

    def server_copy(*args: Any, **kw: Any) -> Any:
        with lock:
            calls.append(1)
            hit = len(calls) == failing
        if hit:
            raise BackendUnavailableError("injected: the copy failed")
        return copy(*args, **kw)

    backend.server_copy = server_copy
    records: list[Any] = []
    with store.stage_dir(NAME, overwrite=True, records=records) as d:
        for rel, body in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)
    backend.server_copy = copy
    return records[-1]


@pytest.mark.parametrize("kind", KINDS)
def test_a_returned_replace_over_a_killed_one_stays_committed(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A writer killed among its copies (a preempted trainer), then a writer of a newer version
    of the same folder whose copies stop too but which returns its record: that record is the
    name's committed version. Every reader serves it, never the killed writer's older staged
    version, and gc completes it, never rolls the older one forward over it."""
    t = prepared(kind, request)
    _kill_mid_copy(t, 1)
    assert backdoor_state(t.door) == "staged"
    rec = _commit_failing_at_copy(t.reopen(), NEWER, 2)
    assert rec.digest == f"xxh3_128:{manifest_hex(NEWER)}" and not rec.outcome.durable
    fresh = t.reopen()
    assert fresh.verify(NAME).ok
    latest = fresh.latest()
    assert latest is not None and latest.digest == rec.digest
    out = tmp_path / "got"
    fresh.get_file(NAME, out)
    assert files_below(out) == NEWER
    fresh.gc(min_age=0)
    assert under(t.door, NAME + "/") == NEWER  # completed, read beside the API
    raw = t.door.read(record_path(NAME))
    assert raw is not None and json.loads(raw)["digest"] == rec.digest
    assert pending_paths(t.door, NAME) == []
    assert t.reopen().verify().ok


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["delete", "prune", "stacked-delete"])
def test_a_deleted_name_whose_replace_stopped_never_comes_back(
    how: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A replace returns its record with its copies stopped (gc would complete them); the name
    is then deleted (``delete``, or by retention: ``prune``), also over the older staged version
    of a writer killed (``stacked-delete``) more than three heartbeats before the record was
    written (dead before it). Nothing of it is left, and gc never rolls a staged version
    forward over the deleted name."""
    t = prepared(kind, request, heartbeat=0.1)
    if how == "stacked-delete":
        _kill_mid_copy(t, 1)
        time.sleep(1.5)  # > 3 heartbeats, also by a store's 1 s clock
    # for retention, every file of the new version is under the name (one of its files missing
    # there would make the name's age unknown: never pruned)
    newer = {path: body * 2 for path, body in OLD.items()} if how == "prune" else NEWER
    _commit_failing_at_copy(t.reopen(), newer, 2)
    store = t.reopen()
    if how == "prune":
        for step in (10, 20):
            with store.stage_dir(f"run/later-{step}", step=step) as d:
                (d / "w.bin").write_bytes(bytes([step]) * 100)
        report = store.prune(keep_last=2, min_age=0)
        assert NAME in report.targets[0].deleted
    else:
        store.delete(NAME)
    assert NAME not in [r.name for r in t.reopen().list()]
    t.reopen().gc(min_age=0)
    assert NAME not in [r.name for r in t.reopen().list()]
    assert under(t.door, NAME + "/") == {}  # read beside the API: nothing of any version
    assert t.door.read(record_path(NAME)) is None
    assert pending_paths(t.door, NAME) == []
    assert not any(f.startswith(".commitstore/staged/") for f in t.door.files())
    assert t.reopen().verify().ok


def test_a_delete_keeps_the_slot_of_a_writer_alive_after_the_record(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers of one file start within a heartbeat of its record; one is held after its
    data publish, before its record, while the name is deleted and the other commits whole. A
    delete removes only slots of writers it can tell dead (or the record's own): both writers
    return, and the name then verifies (its data matches the record or a pending record)."""
    import commitstore._commit as commit_module

    t = make_target("s3", request)
    with t.store.stage(NAME) as f:
        f.write(b"R" * 100)
    first, second = t.reopen(), t.reopen()
    real = commit_module.put_small
    at_record, go_on = threading.Event(), threading.Event()
    record_at = tuple(record_path(NAME).split("/"))[2:]

    def put_small(backend: Any, parts: tuple[str, ...], body: bytes, mode: Any) -> Any:
        if threading.current_thread().name == "first" and parts[2:] == record_at:
            at_record.set()
            go_on.wait(30)
        return real(backend, parts, body, mode)

    monkeypatch.setattr(commit_module, "put_small", put_small)
    returned: list[str] = []

    def write(store: Any, body: bytes, who: str) -> None:
        with store.stage(NAME, overwrite=True) as f:
            f.write(body)
        returned.append(who)

    thread = threading.Thread(target=write, args=(first, b"1" * 100, "first"), name="first")
    thread.start()
    try:
        assert at_record.wait(30)  # the first writer's slot and data are in
        t.reopen().delete(NAME)
        write(second, b"2" * 200, "second")
    finally:
        go_on.set()
        thread.join(60)
    assert sorted(returned) == ["first", "second"]
    result = t.reopen().verify(NAME).results[0]
    assert result.status == "ok", result


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("again", ["same", "newer"])
def test_committing_again_completes_a_returned_stopped_replace(
    again: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """After a replace returned its record with its copies stopped (files of the version
    before it still under the name), the folder is committed again (as its warning says it
    may be): the stopped copies are completed first, and the new commit lands whole, never
    refused for the old version's leftover files."""
    t = prepared(kind, request)
    _commit_failing_at_copy(t.reopen(), NEWER, 2)
    files = NEWER if again == "same" else NEW
    commit(t.reopen(), files, overwrite=True)
    assert under(t.door, NAME + "/") == files
    raw = t.door.read(record_path(NAME))
    assert raw is not None and json.loads(raw)["digest"] == f"xxh3_128:{manifest_hex(files)}"
    t.reopen().gc(min_age=0)
    assert not any(f.startswith(".commitstore/staged/") for f in t.door.files())
    assert t.reopen().verify().ok


def test_completing_a_returned_replace_spares_a_writer_in_flight(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer D's replace is in flight (slot written after B's record) while B returned with its
    copies stopped; D's copies land whole, and before D writes its record a third commit C
    starts (and fails uploading): C must not complete B's stopped replace over D's files. D
    returns, and the name is D's version, also after gc."""
    import commitstore._commit as commit_module

    t = prepared("s3", request)
    real = commit_module.put_small
    at_record, go_on = threading.Event(), threading.Event()
    record_at = tuple(record_path(NAME).split("/"))[2:]

    def put_small(backend: Any, parts: tuple[str, ...], body: bytes, mode: Any) -> Any:
        if threading.current_thread().name == "D" and parts[2:] == record_at:
            at_record.set()  # D's copies are in, its staged copy gone; its record comes next
            go_on.wait(30)
        return real(backend, parts, body, mode)

    monkeypatch.setattr(commit_module, "put_small", put_small)
    d_records: list[Any] = []
    staging, staged_go = threading.Event(), threading.Event()

    def write_d() -> None:
        store = t.reopen()
        backend: Any = store._committer.backend
        open_sink = backend.open_sink

        def held(parts: tuple[str, ...], **kw: Any) -> Any:
            if "staged" in parts:
                staging.set()
                staged_go.wait(30)
            return open_sink(parts, **kw)

        backend.open_sink = held
        with store.stage_dir(NAME, overwrite=True, records=d_records) as d:
            for rel, body in NEW.items():
                (d / rel).parent.mkdir(parents=True, exist_ok=True)
                (d / rel).write_bytes(body)

    thread = threading.Thread(target=write_d, name="D")
    thread.start()
    try:
        assert staging.wait(60)
        assert not _commit_failing_at_copy(t.reopen(), NEWER, 2).outcome.durable  # B
        staged_go.set()
        assert at_record.wait(60)
        assert under(t.door, NAME + "/") == NEW
        c = t.reopen()
        c_backend: Any = c._committer.backend
        c_open = c_backend.open_sink

        def failing(parts: tuple[str, ...], **kw: Any) -> Any:
            if "staged" in parts:
                raise BackendUnavailableError("injected: C's upload failed")
            return c_open(parts, **kw)

        c_backend.open_sink = failing
        with pytest.raises(CommitStoreError):
            commit(c, {"a.bin": b"C a " * 50, "q.txt": b"c"}, overwrite=True)
        assert under(t.door, NAME + "/") == NEW  # C touched nothing of D's
    finally:
        go_on.set()
        staged_go.set()
        thread.join(60)
    assert d_records and d_records[-1].digest == f"xxh3_128:{manifest_hex(NEW)}"
    assert t.reopen().verify(NAME).ok
    t.reopen().gc(min_age=0)
    assert under(t.door, NAME + "/") == NEW
    raw = t.door.read(record_path(NAME))
    assert raw is not None and json.loads(raw)["digest"] == f"xxh3_128:{manifest_hex(NEW)}"
