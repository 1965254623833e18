"""Edges of "an exception means nothing changed; a returned record means the artifact is
published and visible" (docs/guarantees.md), each found by an attack on the commit path.

Every state is read from the storage through a backdoor (``commitstore.testing``), on local
disk and on moto (S3) where the edge is an object-store one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore.errors import (
    AlreadyExistsError,
    InsufficientSpaceError,
    NameConflictError,
    NotFoundError,
)
from commitstore.testing import LocalBackdoor, S3Backdoor, Target, pending_paths, record_path

from .helpers.recordfault import refuse_record_writes
from .helpers.requestproxy import RequestProxy
from .helpers.s3servers import BUCKET, MotoServer

KINDS = ["local", "moto"]


def _target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if kind == "local":
        root = tmp_path / "store"
        return Target(open_store(root), LocalBackdoor(root), lambda: open_store(root))
    moto: MotoServer = request.getfixturevalue("moto")
    prefix = f"ce{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    return Target(open_store(url, **opts), door, lambda: open_store(url, **opts))


def _data(door: Any) -> dict[str, bytes | None]:
    """The data files (not the store's own bookkeeping, not staging) and their bytes."""
    return {
        f: door.read(f)
        for f in door.files()
        if not f.startswith(".commitstore/") and ".commitstore.tmp." not in f
    }


# -- 1. a create-only folder commit over a name another writer took meanwhile -------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_create_only_folder_commit_over_a_taken_name_raises_and_leaves_the_other_version(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = _target(kind, request, tmp_path)
    folder = t.store.begin_folder("f", overwrite=False)
    files = [folder.write_bytes("a.bin", b"mine")]
    # another writer takes the name meanwhile (on an object store its file sits at the key
    # "f", beside this write's "f/a.bin"; locally, the staging folder is beside the name)
    t.reopen().put_bytes("f", b"theirs", overwrite=kind != "local")
    theirs = t.door.read(record_path("f"))
    assert theirs is not None
    with pytest.raises(AlreadyExistsError):
        folder.commit(files)
    assert t.door.read(record_path("f")) == theirs
    assert t.door.read("f") == b"theirs"
    assert pending_paths(t.door, "f") == []  # nothing makes the name verify as this write
    assert t.reopen().read_bytes("f") == b"theirs"


# -- 2. delete never takes the files of a folder write in progress ------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["runs/x", "runs"])
def test_delete_refuses_a_name_a_folder_write_in_progress_uploads_to(
    kind: str, name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``delete("runs")`` while a ``begin_folder`` of ``runs`` (or of ``runs/x``, beside data
    without a record in ``runs``) is writing: refused, nothing removed, the write commits."""
    t = _target(kind, request, tmp_path)
    if name != "runs":
        t.door.write("runs/junk.bin", b"left by another tool")  # data without a record
    folder = t.store.begin_folder(name, overwrite=False)
    files = [folder.write_bytes("a.bin", b"in flight")]
    before = _data(t.door)
    if kind == "local" and name == "runs":  # staged beside the name: nothing is at "runs"
        with pytest.raises(NotFoundError):
            t.reopen().delete("runs")
    else:
        with pytest.raises(NameConflictError, match="in progress"):
            t.reopen().delete("runs")
    assert _data(t.door) == before
    folder.commit(files)  # the write was left whole
    assert t.door.read(f"{name}/a.bin") == b"in flight"
    assert t.door.read(record_path(name)) is not None


# -- 3. a new name whose record write fails after its data was placed ---------------------------
@pytest.fixture
def fail_record_write(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """The storage refuses the record write of ``name`` (``helpers.recordfault``)."""
    return refuse_record_writes(monkeypatch)


def _put(store: CommitStore) -> Callable[[], Any]:
    return lambda: store.put_bytes("ckpt", b"new bytes")


def _stage_dir(store: CommitStore) -> Callable[[], Any]:
    def run() -> None:
        with store.stage_dir("ckpt") as d:
            (d / "model.bin").write_bytes(b"new bytes")

    return run


def _folder(store: CommitStore) -> Callable[[], Any]:
    folder = store.begin_folder("ckpt")
    files = [folder.write_bytes("model.bin", b"new bytes")]
    return lambda: folder.commit(files)


NEW_NAME_WRITERS = {"put_bytes": _put, "stage_dir": _stage_dir, "begin_folder": _folder}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", sorted(NEW_NAME_WRITERS))
def test_a_new_name_whose_record_write_fails_raises_and_nothing_is_visible(
    kind: str,
    writer: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    fail_record_write: Callable[[str], None],
) -> None:
    t = _target(kind, request, tmp_path)
    run = NEW_NAME_WRITERS[writer](t.store)
    in_place = writer == "begin_folder" and kind == "moto"  # uploaded to its final keys
    before = _data(t.door)
    fail_record_write("ckpt")
    with pytest.raises(InsufficientSpaceError):
        run()
    fail_record_write("")
    assert t.door.read(record_path("ckpt")) is None
    assert pending_paths(t.door, "ckpt") == []  # nothing makes the name verify as it
    assert _data(t.door) == before  # the data it published is withdrawn (in place: as before)
    if in_place:  # the folder's files are still its own: its commit can be tried again
        run()
        assert t.door.read(record_path("ckpt")) is not None
        assert t.reopen().verify("ckpt").ok
        return
    t.reopen().gc(min_age=0)
    assert t.door.read(record_path("ckpt")) is None  # gc does not complete it either


# -- 6. stage_dir of a name a begin_folder write is filling --------------------------------------
def test_stage_dir_over_an_open_folder_write_says_what_to_do(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = _target("moto", request, tmp_path)
    folder = t.store.begin_folder("f")
    files = [folder.write_bytes("a.bin", b"in flight")]
    with pytest.raises(AlreadyExistsError) as caught, t.reopen().stage_dir("f") as d:
        (d / "b.bin").write_bytes(b"other")
    message = str(caught.value)
    assert "pass overwrite=True" not in message  # it would replace the other write's files
    assert "begin_folder" in message and "abort()" in message and "commit" in message
    assert t.door.read("f/a.bin") == b"in flight" and t.door.read("f/b.bin") is None
    folder.commit(files)
    assert t.door.read(record_path("f")) is not None


# -- 4. commit:// transactions ---------------------------------------------------------------
def test_a_transaction_checks_every_file_before_committing_any(tmp_path: Path) -> None:
    """A create-only file whose name another writer takes before the transaction ends:
    refused before the first file is published, so the transaction publishes nothing."""
    import fsspec

    root = tmp_path / "store"
    door = LocalBackdoor(root)
    fs = fsspec.filesystem("commit")
    with pytest.raises(FileExistsError), fs.transaction:
        with fs.open(f"{root}/a.pt", "wb") as f:
            f.write(b"new a")
        with fs.open(f"{root}/b.pt", "xb") as f:
            f.write(b"new b")
        open_store(root).put_bytes("b.pt", b"theirs")  # taken meanwhile
    assert door.read(record_path("a.pt")) is None and door.read("a.pt") is None
    assert door.read("b.pt") == b"theirs"
    assert not [f for f in door.files() if ".commitstore.tmp." in f]


def test_a_transaction_stopped_midway_says_which_names_were_committed(
    tmp_path: Path, fail_record_write: Callable[[str], None]
) -> None:
    """The second of three commits fails after every check passed: the first stands (new), the
    second and third keep their old state, and the error names each group."""
    import fsspec

    from commitstore.errors import TransactionError

    root = tmp_path / "store"
    open_store(root).put_bytes("c.pt", b"old c")
    door = LocalBackdoor(root)
    fs = fsspec.filesystem("commit")
    fail_record_write("b.pt")  # a new name whose record write fails: its commit raises
    with pytest.raises(TransactionError) as caught, fs.transaction:
        for name in ("a.pt", "b.pt", "c.pt"):
            with fs.open(f"{root}/{name}", "wb") as f:
                f.write(b"new " + name.encode())
    err = caught.value
    assert isinstance(err.__cause__, InsufficientSpaceError)
    assert [n.rsplit("/", 1)[-1] for n in err.committed] == ["a.pt"]
    assert err.failed.endswith("/b.pt")
    assert [n.rsplit("/", 1)[-1] for n in err.discarded] == ["c.pt"]
    assert "a.pt" in str(err) and "b.pt" in str(err) and "c.pt" in str(err)
    assert door.read("a.pt") == b"new a.pt" and door.read(record_path("a.pt")) is not None
    assert door.read("b.pt") is None and door.read(record_path("b.pt")) is None
    assert door.read("c.pt") == b"old c"
    assert not fs._intrans  # the transaction ended


# -- 5. retention with a mirror down ---------------------------------------------------------
@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[RequestProxy]:
    p = RequestProxy(moto.port)
    try:
        yield p
    finally:
        p.stop()


def test_prune_goes_on_on_the_primary_and_healthy_mirrors_when_one_mirror_is_down(
    tmp_path: Path, moto: MotoServer, proxy: RequestProxy
) -> None:
    prefix = f"pm{time.monotonic_ns()}"
    s3_url = moto.url(prefix)
    s3_opts = {**moto.options(), "endpoint_url": proxy.endpoint, "retries": 1}
    down_door = S3Backdoor(moto.client(), BUCKET, prefix)
    healthy = open_store(tmp_path / "mirror")
    names = [f"step_{i}.pt" for i in range(1, 5)]
    with open_store(
        tmp_path / "primary",
        mirrors=[healthy, open_store(s3_url, **s3_opts)],
        mirror_mode="sync",
    ) as store:
        for i, name in enumerate(names, 1):
            store.put_bytes(name, b"x" * i, step=i)
        on_s3 = sorted(f for f in down_door.files() if not f.startswith(".commitstore/"))
        assert on_s3 == names
        proxy.fail(1, "error", sticky=True)  # the S3 mirror answers nothing but errors now
        report = store.prune(keep_last=1, min_age=0)
    assert list(report.errors) == [report.targets[2].url], report
    assert report.targets[2].deleted == ()
    for root in (tmp_path / "primary", tmp_path / "mirror"):
        door = LocalBackdoor(root)
        assert [n for n in names if door.read(record_path(n))] == ["step_4.pt"], root
        assert [n for n in names if door.read(n)] == ["step_4.pt"], root
    left = sorted(f for f in down_door.files() if not f.startswith(".commitstore/"))
    assert left == names  # the mirror that was down lost nothing
