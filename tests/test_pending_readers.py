"""Every reader honours the pending version, with one resolution.

A commit killed between its data step and its record step leaves the name's new bytes under
the name and the new record only as a pending record (beside the record on local disks, in the
writer's slot on object stores). The name then verifies as the new version (docs/guarantees.md,
"What a crash leaves"). These tests build that state for real, by SIGKILLing a writer process
just before it writes the record, on a local store and on S3 (moto), and check that every reader
serves the new version *with its record* (its step and metadata): ``fetch`` (also over a cached
copy of the old version), ``commitstore.torch.load`` (mmap or not, by name and newest-first),
``latest()`` and ``latest(source="any")``, ``sync`` (to a mirror that lacks the artifact and to
one holding the old version; the mirror is then read through a backdoor) and ``restore`` from a
mirror in that state; and, for a folder artifact, ``latest(source="any")``, ``sync`` and
``restore``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import commitstore.torch as cs_torch
from commitstore import (
    AlreadyExistsError,
    CommitStore,
    ConfigurationError,
    IntegrityError,
    open_store,
)
from commitstore.testing import LocalBackdoor, S3Backdoor, Target, pending_paths, record_path, xxh

from .helpers.s3servers import BUCKET, MotoServer

ROOT_DIR = Path(__file__).resolve().parent.parent
NAME = "last.pt"
FOLDER = "hf/checkpoint"
torch.set_num_threads(1)


def payload(step: int, n: int) -> bytes:
    """A torch file of a training state at ``step`` (``n`` weights)."""
    buf = io.BytesIO()
    torch.save({"step": step, "w": torch.full((n,), float(step))}, buf)
    return buf.getvalue()


OLD, NEW = payload(1, 1000), payload(2, 3000)
FIRST = payload(0, 500)
OLD_DIR = {"model.bin": b"old weights " * 3000, "config.json": b'{"v": 1}'}
NEW_DIR = {"model.bin": b"new weights!! " * 4000, "config.json": b'{"v": 2}', "extra.txt": b"x"}

WRITER = textwrap.dedent(
    """
    import json, os, shutil, signal, sys
    from pathlib import Path
    from commitstore import _commit, open_store
    from commitstore.backends.rename.posix import LocalBackend

    url, opts, name, source = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    original = _commit.put_small

    def put_small(backend, parts, body, mode):
        if parts[-1].startswith(".commitstore.rec."):
            os.kill(os.getpid(), signal.SIGKILL)  # the data is published, its record not yet
        return original(backend, parts, body, mode)

    _commit.put_small = put_small
    renamed = LocalBackend.publish_small_from

    def publish_small_from(self, src, dst, *, mode):  # the record as the pending one renamed
        if dst[-1].startswith(".commitstore.rec."):
            os.kill(os.getpid(), signal.SIGKILL)  # the data is published, its record not yet
        return renamed(self, src, dst, mode=mode)

    LocalBackend.publish_small_from = publish_small_from
    store = open_store(url, **opts)
    meta = {"version": 2}
    if source.is_dir():
        with store.stage_dir(name, step=2, metadata=meta, overwrite=True) as d:
            shutil.copytree(source, d, dirs_exist_ok=True)
    else:
        store.put_bytes(name, source.read_bytes(), step=2, metadata=meta, overwrite=True)
    """
)


@dataclass
class Place:
    """A store under test (local or on moto), its URL and the options to open it again."""

    t: Target
    url: str
    opts: dict[str, Any]

    def open(self, *mirrors: CommitStore) -> CommitStore:
        """A new handle, with ``mirrors`` replicated to synchronously."""
        return open_store(self.url, mirrors=list(mirrors), mirror_mode="sync", **self.opts)


def make(where: str, tmp_path: Path, moto: MotoServer, label: str) -> Place:
    if where == "local":
        root = tmp_path / label
        door = LocalBackdoor(root)
        return Place(Target(open_store(root), door, lambda: open_store(root)), str(root), {})
    prefix = f"{label}{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    target = Target(
        open_store(url, **opts),
        S3Backdoor(moto.client(), BUCKET, prefix),
        lambda: open_store(url, **opts),
    )
    return Place(target, url, opts)


def kill_new_version(p: Place, name: str, source: Path) -> None:
    """Commit ``source`` (a file or a folder) as version 2 of ``name`` (step 2, metadata
    ``{"version": 2}``) in a real process, SIGKILLed after the data step, before the record
    step; then check that state through the backdoor."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT_DIR / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-c", WRITER, p.url, json.dumps(p.opts), name, str(source)],
        env=env,
        capture_output=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    assert pending_paths(p.t.door, name) != []


def write_tree(folder: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def tree(door: Any, name: str) -> dict[str, bytes | None]:
    """The files below folder ``name`` on the storage, read through the backdoor."""
    found = [f for f in door.files() if f.startswith(name + "/")]
    return {f[len(name) + 1 :]: door.read(f) for f in found}


def stored_record(door: Any, name: str) -> dict[str, Any]:
    raw = door.read(record_path(name))
    assert raw is not None, f"no record of {name}"
    found: dict[str, Any] = json.loads(raw)
    return found


def pending_file(where: str, tmp_path: Path, moto: MotoServer) -> Place:
    """``first.pt`` (step 0), then ``last.pt`` committed as OLD (step 1)."""
    p = make(where, tmp_path, moto, "store")
    p.t.store.put_bytes("first.pt", FIRST, step=0)
    p.t.store.put_bytes(NAME, OLD, step=1, metadata={"version": 1})
    return p


def crash(p: Place, tmp_path: Path, old: bytes = OLD) -> None:
    """``last.pt`` (holding ``old``) overwritten by NEW in a writer killed before its record
    step: the new bytes under the name, the old record, a pending record."""
    source = tmp_path / "new.pt"
    source.write_bytes(NEW)
    kill_new_version(p, NAME, source)
    assert p.t.door.read(NAME) == NEW
    assert stored_record(p.t.door, NAME)["digest"] == xxh(old)


def pending_folder(where: str, tmp_path: Path, moto: MotoServer) -> Place:
    p = make(where, tmp_path, moto, "store")
    with p.t.store.stage_dir(FOLDER, step=1, metadata={"version": 1}) as d:
        write_tree(d, OLD_DIR)
    return p


def crash_folder(p: Place, tmp_path: Path) -> None:
    kill_new_version(p, FOLDER, write_tree(tmp_path / "newdir", NEW_DIR))
    assert tree(p.t.door, FOLDER) == NEW_DIR
    assert stored_record(p.t.door, FOLDER)["size"] == sum(map(len, OLD_DIR.values()))


def assert_new_record(rec: Any, name: str = NAME, size: int = len(NEW)) -> None:
    assert rec is not None
    assert (rec.name, rec.size, rec.step, rec.metadata) == (name, size, 2, {"version": 2})
    if name == NAME:
        assert rec.digest == xxh(NEW)


def assert_mirror_holds_new(door: Any, name: str = NAME) -> None:
    """Through the backdoor: the new version's bytes and its record, as a normal record."""
    rec = stored_record(door, name)
    assert (rec["step"], rec["metadata"]) == (2, {"version": 2})
    if name == NAME:
        assert rec["digest"] == xxh(NEW)
        assert door.read(name) == NEW
    else:
        assert tree(door, name) == NEW_DIR
        assert rec["size"] == sum(map(len, NEW_DIR.values()))
    assert pending_paths(door, name) == []


WHERE = ["local", "s3"]


@pytest.mark.crash
@pytest.mark.parametrize("where", WHERE)
def test_fetch_serves_the_pending_version_even_over_a_cached_old_one(
    where: str, tmp_path: Path, moto: MotoServer
) -> None:
    p = pending_file(where, tmp_path, moto)
    cache = tmp_path / "cache"
    old_copy = p.t.store.fetch(NAME, cache)  # the old version is cached before the crash
    assert old_copy.read_bytes() == OLD
    crash(p, tmp_path)
    fresh = p.t.reopen()
    got = fresh.fetch(NAME, cache)
    assert got.read_bytes() == NEW
    assert got != old_copy
    assert fresh.fetch(NAME, cache).read_bytes() == NEW  # now from the cache
    assert fresh.fetch(NAME, cache, rehash=True).read_bytes() == NEW
    assert fresh.fetch(NAME, tmp_path / "cache2").read_bytes() == NEW
    # the readers that already resolved it, through the same resolution
    assert fresh.read_bytes(NAME) == NEW
    with fresh.open(NAME) as f:
        assert f.read() == NEW
    assert fresh.verify().ok


@pytest.mark.crash
@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("where", WHERE)
def test_torch_load_resumes_from_the_pending_step(
    where: str, mmap: bool, tmp_path: Path, moto: MotoServer
) -> None:
    p = pending_file(where, tmp_path, moto)
    crash(p, tmp_path)
    fresh, cache = p.t.reopen(), tmp_path / "cache"
    obj, rec = cs_torch.load_with_record(fresh, NAME, mmap=mmap, cache_dir=cache)
    assert (obj["step"], obj["w"].numel()) == (2, 3000)
    assert_new_record(rec)
    obj, rec = cs_torch.load_with_record(fresh, mmap=mmap, cache_dir=cache)  # newest first
    assert (obj["step"], obj["w"].numel()) == (2, 3000)
    assert_new_record(rec)
    assert cs_torch.load(fresh, mmap=mmap, cache_dir=cache)["step"] == 2


@pytest.mark.crash
@pytest.mark.parametrize("where", WHERE)
def test_latest_is_the_pending_version_from_any_source(
    where: str, tmp_path: Path, moto: MotoServer
) -> None:
    p = pending_file(where, tmp_path, moto)
    mirror = open_store(tmp_path / "mirror")
    with p.open(mirror) as both:
        assert both.sync().ok  # the mirror holds the old version
    crash(p, tmp_path)
    with p.open(mirror) as both:
        assert_new_record(both.latest())
        assert_new_record(both.latest(source="any"))


@pytest.mark.crash
@pytest.mark.parametrize("where", WHERE)
def test_sync_copies_the_pending_version_as_a_normal_record(
    where: str, tmp_path: Path, moto: MotoServer
) -> None:
    p = pending_file(where, tmp_path, moto)
    stale_root, empty_root = tmp_path / "stale", tmp_path / "empty"
    with p.open(open_store(stale_root)) as both:
        assert both.sync().ok  # this mirror holds the old version
    crash(p, tmp_path)
    on_s3 = make("s3", tmp_path, moto, "mirror")  # an object store's sink (reread bodies)
    with p.open(open_store(stale_root), open_store(empty_root), on_s3.t.store) as both:
        report = both.sync()
        assert report.ok, report
        stale, empty, s3 = report.mirrors
        assert NAME in stale.repaired and NAME in empty.copied and NAME in s3.copied
        again = both.sync()  # settled: nothing more to copy
        assert again.ok and all(NAME in m.ok for m in again.mirrors)
    for root in (stale_root, empty_root):
        assert_mirror_holds_new(LocalBackdoor(root))
        assert open_store(root).verify().ok
    assert_mirror_holds_new(on_s3.t.door)
    assert on_s3.t.reopen().verify().ok


@pytest.mark.crash
@pytest.mark.parametrize("where", WHERE)
def test_restore_from_a_mirror_holding_a_pending_version(
    where: str, tmp_path: Path, moto: MotoServer
) -> None:
    m = pending_file(where, tmp_path, moto)  # the mirror is the store left in the crash state
    kept_root = tmp_path / "kept"
    with open_store(kept_root, mirrors=[m.t.reopen()]) as kept:
        kept.restore(NAME)  # this primary holds the old version, its record identical
    crash(m, tmp_path)
    primary_root = tmp_path / "primary"
    with open_store(primary_root, mirrors=[m.t.reopen()]) as primary:
        assert_new_record(primary.restore(NAME))
        assert primary.read_bytes(NAME) == NEW
        assert_new_record(primary.record(NAME))
    assert_mirror_holds_new(LocalBackdoor(primary_root))
    with open_store(kept_root, mirrors=[m.t.reopen()]) as kept:
        # the old version verifies there and differs from the mirror's: kept unless overwrite
        with pytest.raises(AlreadyExistsError, match="is newer"):
            kept.restore(NAME)
        assert kept.read_bytes(NAME) == OLD
        assert_new_record(kept.restore(NAME, overwrite=True))
    assert_mirror_holds_new(LocalBackdoor(kept_root))


@pytest.mark.crash
@pytest.mark.parametrize("where", WHERE)
def test_a_pending_folder_version_is_synced_restored_and_latest(
    where: str, tmp_path: Path, moto: MotoServer
) -> None:
    p = pending_folder(where, tmp_path, moto)
    stale_root = tmp_path / "stale"
    with p.open(open_store(stale_root)) as both:
        assert both.sync().ok
    crash_folder(p, tmp_path)
    size = sum(map(len, NEW_DIR.values()))
    with p.open(open_store(stale_root)) as both:
        assert_new_record(both.latest(source="any"), FOLDER, size)
        report = both.sync()
        assert report.ok, report
        assert FOLDER in report.mirrors[0].repaired
        out = tmp_path / "out"
        both.get_file(FOLDER, out)
        assert {f.name: f.read_bytes() for f in out.iterdir()} == NEW_DIR
    assert_mirror_holds_new(LocalBackdoor(stale_root), FOLDER)
    primary_root = tmp_path / "primary"
    with open_store(primary_root, mirrors=[p.t.reopen()]) as primary:
        assert_new_record(primary.restore(FOLDER), FOLDER, size)
    assert_mirror_holds_new(LocalBackdoor(primary_root), FOLDER)


@pytest.mark.crash
@pytest.mark.parametrize("where", WHERE)
def test_a_pending_folder_version_is_read_member_by_member(
    where: str, tmp_path: Path, moto: MotoServer
) -> None:
    """Members of a folder in the pending state are served from the new version, decided for
    the folder as a whole: ``record(name, level=...)`` is the new version (the stored record
    stays the old one), ``read_member`` checks against exactly the record it is given, and
    the ``commit://`` view opens members of the new version."""
    import fsspec

    p = pending_folder(where, tmp_path, moto)
    crash_folder(p, tmp_path)
    size = sum(map(len, NEW_DIR.values()))
    store = p.t.reopen()
    old = store.record(FOLDER)
    assert (old.step, old.size) == (1, sum(map(len, OLD_DIR.values())))
    for level in ("size", "full"):
        assert_new_record(store.record(FOLDER, level=level), FOLDER, size)
    new = store.record(FOLDER, level="size")
    assert store.read_member(new, "model.bin") == NEW_DIR["model.bin"]
    with pytest.raises(IntegrityError):
        store.read_member(old, "model.bin")  # the old record's file is gone: never mixed
    with pytest.raises(ConfigurationError):
        store.record(FOLDER, level="quick")  # type: ignore[arg-type]
    fs = fsspec.filesystem("commit", root=p.url, **p.opts)
    base = p.url.rstrip("/")
    for rel, data in NEW_DIR.items():
        assert fs.cat(f"{base}/{FOLDER}/{rel}") == data


@pytest.mark.parametrize("where", ["local"])
def test_record_at_a_level_refuses_a_folder_that_matches_no_version(
    where: str, tmp_path: Path, moto: MotoServer
) -> None:
    """A folder whose file was truncated behind the store's back verifies as no version:
    ``record(name, level="size")`` raises IntegrityError (fail loud), the plain record reads."""
    p = pending_folder(where, tmp_path, moto)
    (Path(p.url) / FOLDER / "model.bin").write_bytes(b"short")
    store = p.t.reopen()
    assert store.record(FOLDER).step == 1
    with pytest.raises(IntegrityError) as caught:
        store.record(FOLDER, level="size")
    assert caught.value.status == "size_mismatch"


SAME_SIZE_OLD = payload(0, 3000)
"""An old version of ``last.pt`` as large as NEW (one model's checkpoints): sizes cannot tell
them apart."""
assert len(SAME_SIZE_OLD) == len(NEW)
OLDS = {"other_size": OLD, "same_size": SAME_SIZE_OLD}


@pytest.mark.crash
@pytest.mark.parametrize("old", OLDS)
@pytest.mark.parametrize("where", WHERE)
def test_latest_orders_a_name_by_the_pending_version_it_verifies_as(
    where: str, old: str, tmp_path: Path, moto: MotoServer
) -> None:
    """``last.pt`` committed at step 0, ``mid.pt`` at step 1, then ``last.pt`` overwritten at
    step 2 by a writer killed before its record step: the newest whole artifact is ``last.pt``
    at step 2 (its pending version), not ``mid.pt``, although ``last.pt``'s stored record says
    step 0; also when the old version has the new one's size (checked in full then)."""
    p = make(where, tmp_path, moto, "store")
    p.t.store.put_bytes(NAME, OLDS[old], step=0, metadata={"version": 1})
    p.t.store.put_bytes("mid.pt", FIRST, step=1)
    mirror = open_store(tmp_path / "mirror")
    with p.open(mirror) as both:
        assert both.sync().ok  # the mirror holds the old version of last.pt and mid.pt
    crash(p, tmp_path, OLDS[old])
    assert stored_record(p.t.door, NAME)["step"] == 0
    with p.open(mirror) as both:
        assert_new_record(both.latest())
        assert_new_record(both.latest(level="size"))
        assert_new_record(both.latest(source="any"))
        obj, rec = cs_torch.load_with_record(both)  # newest first
        assert obj["step"] == 2
        assert_new_record(rec)
        data, rec = both.read_with_record(NAME, verify="size")  # sizes may not settle it
        assert data == NEW
        assert_new_record(rec)
        assert_new_record(both.record(NAME, level="size"))
        order = list(both.newest(level="full"))
        assert [(r.name, r.step) for r in order] == [(NAME, 2), ("mid.pt", 1)]
        assert_new_record(order[0])
    p.t.door.write("mid.pt", b"damaged")  # newest() skips what fails its check
    with p.open() as one:
        assert [(r.name, r.step) for r in one.newest(level="size")] == [(NAME, 2)]
        with pytest.raises(ConfigurationError):
            one.newest(level="quick")  # type: ignore[arg-type]


@pytest.mark.crash
@pytest.mark.parametrize("old", OLDS)
@pytest.mark.parametrize("where", WHERE)
def test_prune_ranks_a_name_by_the_pending_version_it_verifies_as(
    where: str, old: str, tmp_path: Path, moto: MotoServer
) -> None:
    """``last.pt`` committed at step 0, ``mid.pt`` at step 1, then ``last.pt`` overwritten at
    step 2 by a writer killed before its record step: ``prune(keep_last=1)`` keeps ``last.pt``
    (the newest whole version, step 2), never the data of the newest checkpoint; ``mid.pt`` goes.
    Also when the old version has the new one's size."""
    p = make(where, tmp_path, moto, "store")
    p.t.store.put_bytes(NAME, OLDS[old], step=0, metadata={"version": 1})
    p.t.store.put_bytes("mid.pt", FIRST, step=1)
    crash(p, tmp_path, OLDS[old])
    with p.open() as store:
        report = store.prune(keep_last=1, min_age=0)
    assert p.t.door.read(NAME) == NEW, report
    assert p.t.door.read("mid.pt") is None, report
    with p.open() as store:
        assert_new_record(store.latest())
