"""Findings of the fourth attack on the documented guarantees, where operations meet (64
attacks, 18 findings): each test provokes one for real (local disk, or moto S3) and reads the
storage through the backdoor. Each guards its fix.

Fixed: ``prune(keep="best")`` and ``Retention(keep="best")`` (a str taken as one name per
character, "best" deleted); ``mirrors="<one URL>"`` (one mirror per character); a retention that
is not a ``Retention``; ``restore(source="<mirror URL>")`` (a raw ``AttributeError``, now the
mirror that URL names); ``put_bytes(name, "text")``; names with C1 control characters;
``open_store("")`` (the current folder); bad ``flush`` timeouts; a folder at a record's path
(now ``bad_record``); a file and a folder of one path in one S3 folder write (now typed); a
delete killed after its record step undone by gc; S3 ``join_folder`` with a committed write's
token writing into the committed folder; an S3 folder commit over a file committed below its
name meanwhile; ``sync`` and replication replacing another tool's file on a mirror; a commit
into a folder another tool moved away returning for a missing name; ``adopt()`` stopped by one
foreign file name; ``get_file``/``sync`` of an empty folder artifact that fails its check.

A folder replace (local and S3) over a folder holding a file that no version of the name names
(another tool's): it removed that file with the old version's; now refused (NameConflictError),
nothing changed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from commitstore import (
    CommitError,
    CommitStoreError,
    ConfigurationError,
    InvalidNameError,
    NameConflictError,
    Retention,
    open_store,
)
from commitstore.testing import LocalBackdoor, S3Backdoor, Target, record_path, xxh
from commitstore.testing.crashwriter import stop_at

from .helpers.s3servers import BUCKET, MotoServer


def _age(root: Path) -> None:
    """Every file below ``root`` 30 years old, so ``min_age`` never keeps one."""
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(dirpath, f), (1e9, 1e9))


def _data_files(root: Path) -> list[str]:
    return [f for f in LocalBackdoor(root).files() if not f.startswith(".commitstore")]


# --- bad input that is taken for good ---------------------------------------------------------


def test_prune_keep_given_one_name_as_a_str_keeps_that_name(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("best", b"b", step=1)
    for i in (2, 3, 4):
        store.put_bytes(f"step_{i}", b"x" * i)
    _age(root)
    with contextlib.suppress(ConfigurationError):  # refusing the str is fine too
        store.prune(keep_last=1, keep="best", min_age=0)
    assert LocalBackdoor(root).read("best") == b"b"
    assert LocalBackdoor(root).read(record_path("best")) is not None


def test_retention_keep_given_one_name_as_a_str_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        Retention(keep_last=1, keep="best")  # type: ignore[arg-type]


def test_mirrors_given_one_url_as_a_str_is_refused_before_any_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the per-character mirrors are relative paths: "m", "x"
    try:
        store = open_store(tmp_path / "p", mirrors="mx", mirror_mode="sync")
    except ConfigurationError:
        return
    try:
        store.put_bytes("a", b"a")
    finally:
        store.close()
    assert not (tmp_path / "m").exists() and not (tmp_path / "x").exists()


def test_retention_that_is_not_a_retention_is_refused_at_open(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        open_store(tmp_path / "s", retention={"keep_last": 1})  # type: ignore[arg-type]


def test_restore_from_a_mirror_url_is_a_typed_error_or_works(tmp_path: Path) -> None:
    mirror = tmp_path / "m"
    open_store(mirror).put_bytes("a", b"from the mirror")
    store = open_store(tmp_path / "p", mirrors=[str(mirror)])
    try:
        store.restore("a", source=str(mirror))
    except CommitStoreError:
        return
    finally:
        store.close()
    assert LocalBackdoor(tmp_path / "p").read("a") == b"from the mirror"


def test_put_bytes_of_text_is_a_typed_error_before_any_io(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with pytest.raises(CommitStoreError):
        open_store(root).put_bytes("a", "text")  # type: ignore[arg-type]
    assert not root.exists()


@pytest.mark.parametrize("char", ["\x85", "\x9b"])
def test_a_name_with_a_c1_control_character_is_refused_before_any_io(
    tmp_path: Path, char: str
) -> None:
    root = tmp_path / "s"
    with pytest.raises(InvalidNameError):
        open_store(root).put_bytes(f"step{char}1", b"x")
    assert not root.exists()


def test_an_empty_url_is_refused_before_any_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # an unset variable (open_store(os.environ.get("CKPT", "")))
    with contextlib.suppress(ConfigurationError):
        open_store("").put_bytes("a", b"a")
    assert list(tmp_path.iterdir()) == []


# --- adopt meets another tool's file whose name is no artifact name --------------------------


@pytest.mark.parametrize("foreign", [b"bad\\name", b"\xff\xfe", b".commitstore.zz"])
def test_adopt_rejects_a_file_whose_name_is_no_artifact_name_and_adopts_the_rest(
    tmp_path: Path, foreign: bytes
) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("ok", b"k")
    (root / "good.bin").write_bytes(b"an old checkpoint")
    with open(os.path.join(bytes(root), foreign), "wb") as f:  # another tool's file
        f.write(b"data")
    store.adopt(trust=True)
    assert LocalBackdoor(root).read(record_path("good.bin")) is not None


def test_adopt_rejects_a_key_whose_name_is_no_artifact_name_and_adopts_the_rest_s3(
    moto: MotoServer,
) -> None:
    prefix = "attack4-adopt-foreign"
    store = open_store(moto.url(prefix), **moto.options())
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    store.put_bytes("ok", b"k")
    door.write("good.bin", b"an old checkpoint")
    door.write("bad\\name", b"another tool's object")
    store.adopt(trust=True)
    assert door.read(record_path("good.bin")) is not None


@pytest.mark.parametrize("timeout", [-1.0, float("nan"), "5"])
def test_flush_with_a_bad_timeout_is_a_configuration_error(tmp_path: Path, timeout: object) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    try:
        store.put_bytes("a", b"a")
        with pytest.raises(ConfigurationError):
            store.flush(timeout=timeout)  # type: ignore[arg-type]
    finally:
        store.close()


# --- storage that lies ------------------------------------------------------------------------


def test_a_folder_at_a_records_path_is_a_bad_record(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    store.put_bytes("a", b"aaa")
    store.put_bytes("b", b"b")
    rec = root / record_path("a")
    rec.unlink()
    rec.mkdir()  # another tool (or a damaged disk) left a folder where the record was
    report = store.verify()
    assert {r.name: r.status for r in report.results}["a"] == "bad_record"
    assert not report.ok


@pytest.mark.parametrize("damage", ["removed", "a file in its place"])
def test_get_file_never_serves_an_empty_folder_that_fails_its_check(
    tmp_path: Path, damage: str
) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    with store.stage_dir("e"):
        pass  # an empty folder artifact
    (root / "e").rmdir()
    if damage != "removed":
        LocalBackdoor(root).write("e", b"another tool's file")
    assert store.verify("e").results[0].status in ("missing", "size_mismatch")
    with pytest.raises(CommitStoreError):
        store.get_file("e", tmp_path / "out")


def test_sync_never_copies_an_empty_folder_that_fails_its_check(tmp_path: Path) -> None:
    primary, mirror = tmp_path / "p", tmp_path / "m"
    store = open_store(primary)
    with store.stage_dir("e"):
        pass
    (primary / "e").rmdir()
    LocalBackdoor(primary).write("e", b"another tool's file")
    with_mirror = open_store(primary, mirrors=[str(mirror)])
    try:
        report = with_mirror.sync()
    finally:
        with_mirror.close()
    # "a primary copy that fails its own record is never copied anywhere"
    assert "e" in report.primary_bad
    assert LocalBackdoor(mirror).read(record_path("e")) is None


# --- one name's replace meets files that are not its own --------------------------------------


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """A store on a local folder or on a fresh prefix of moto S3, with a backdoor onto it."""
    if request.param == "local":
        root = tmp_path / "s"
        return Target(open_store(root), LocalBackdoor(root), lambda: open_store(root))
    moto: MotoServer = request.getfixturevalue("moto")
    prefix = f"attack4-{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    return Target(open_store(url, **opts), door, lambda: open_store(url, **opts))


def test_folder_replace_refuses_a_file_no_version_names(target: Target) -> None:
    store, door = target.store, target.door
    with store.stage_dir("a") as d:
        (d / "m").write_bytes(b"m")
    record = door.read(record_path("a"))
    door.write("a/extra", b"another tool's file")
    with pytest.raises(NameConflictError, match="extra"), store.stage_dir("a", overwrite=True) as d:
        (d / "n").write_bytes(b"n")
    assert door.read("a/extra") == b"another tool's file"
    assert door.read("a/m") == b"m"
    assert door.read("a/n") is None
    assert door.read(record_path("a")) == record
    door.remove("a/extra")  # moved away: the replace goes through
    with store.stage_dir("a", overwrite=True) as d:
        (d / "n").write_bytes(b"n")
    assert door.read("a/n") == b"n"
    assert door.read("a/m") is None
    assert store.verify("a").ok


def test_folder_write_with_a_file_and_a_folder_of_one_path_fails_typed_s3(
    moto: MotoServer,
) -> None:
    prefix = "attack4-file-and-folder"
    store = open_store(moto.url(prefix), **moto.options())
    folder = store.begin_folder("f")
    try:
        records = [folder.write_bytes("sub", b"1"), folder.write_bytes("sub/x", b"2")]
    except CommitStoreError:
        folder.abort()
        return  # refusing the second path when it is written is the local behaviour
    with pytest.raises(CommitError):
        folder.commit(records)
    folder.abort()


# --- a crash between two steps (SIGKILL of a real process) ------------------------------------


def _killed_at(run: Callable[[], object], arm: Callable[[Callable[[], None]], None]) -> None:
    """Fork a child that calls ``arm(stop)`` (which patches the one step to stop after), then
    ``run()``; SIGKILL it once it reached ``stop`` (it must)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:

            def stop() -> None:
                os.write(ready_w, b"k")
                time.sleep(600)  # until SIGKILL

            arm(stop)
            run()
            os.write(ready_w, b"d")
        except BaseException:
            os.write(ready_w, b"e")
        finally:
            os._exit(0)
    os.close(ready_w)
    got = os.read(ready_r, 1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(ready_r)
    assert got == b"k", f"the child did not stop where it should ({got!r})"


def test_a_delete_killed_after_its_record_step_leaves_nothing_claiming_to_be_whole(
    tmp_path: Path,
) -> None:
    root = tmp_path / "s"
    open_store(root).put_bytes("x", b"version 1")
    # an overwrite killed after its record step, before it dropped its pending record (the
    # crash table's "after the record rename" row; a power loss leaves the same)
    writer = open_store(root)
    _killed_at(
        lambda: writer.put_bytes("x", b"version 2", overwrite=True),
        lambda stop: stop_at("before-cleanup", writer, stop),
    )
    door = LocalBackdoor(root)
    assert door.read(record_path("x")) is not None and door.read("x") == b"version 2"
    # then a delete of x, killed right after it removed the record
    deleter = open_store(root)
    backend: Any = deleter._committer.backend
    remove = backend.remove

    def arm(stop: Callable[[], None]) -> None:
        def stopping_remove(parts: tuple[str, ...]) -> bool:
            got = bool(remove(parts))
            if "/".join(parts) == record_path("x"):
                stop()
            return got

        backend.remove = stopping_remove

    _killed_at(lambda: deleter.delete("x"), arm)
    assert door.read(record_path("x")) is None  # the delete's first step happened
    store = open_store(root)
    store.gc(min_age=0)
    # "record first, then the data: a crash in between leaves nothing that claims to be whole"
    assert door.read(record_path("x")) is None
    assert [r.name for r in store.list()] == []


# --- a folder write's token used again after its commit ---------------------------------------


def test_a_late_writer_never_writes_into_the_committed_folder_s3(moto: MotoServer) -> None:
    prefix = "attack4-late-join"
    url = moto.url(prefix)
    store = open_store(url, **moto.options())
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    folder = store.begin_folder("f")
    folder.commit([folder.write_bytes("p0", b"zero")])
    # a rank restarted with the old token (or any process handed it late): refusing the late
    # writer (at join, or at its write) is fine
    with contextlib.suppress(CommitStoreError):
        late = open_store(url, **moto.options()).join_folder(folder.token)
        try:
            with contextlib.suppress(CommitStoreError):
                late.write_bytes("p2", b"late")
        finally:
            late.abort()
    assert sorted(f for f in door.files() if f.startswith("f/")) == ["f/p0"]
    assert store.verify("f").ok


# --- a folder write meets a file commit below its name ----------------------------------------


def test_a_folder_commit_over_a_file_committed_below_it_meanwhile_s3(moto: MotoServer) -> None:
    prefix = "attack4-folder-over-below"
    url = moto.url(prefix)
    store = open_store(url, **moto.options())
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    folder = store.begin_folder("f")
    mine = folder.write_bytes("x", b"AAAA")
    # another process commits f/x meanwhile; its create-only put is refused ("pass
    # overwrite=True to replace it"), so it does
    other = open_store(url, **moto.options())
    other.put_bytes("f/x", b"BBBB", overwrite=True)
    try:
        record = folder.commit([mine])
    except CommitStoreError:
        folder.abort()
        # refusing the folder commit keeps both guarantees, and the other artifact stands
        assert door.read("f/x") == b"BBBB"
        assert other.verify("f/x").ok
        return
    # it returned: the name must verify as the version it returned ...
    assert xxh(door.read("f/x") or b"") == record.files[0].digest
    # ... and a committed folder never holds another committed artifact
    assert door.read(record_path("f/x")) is None


# --- sync meets another tool's file on the mirror ---------------------------------------------


def test_sync_never_replaces_another_tools_file_on_a_mirror(tmp_path: Path) -> None:
    primary, mirror = tmp_path / "p", tmp_path / "m"
    open_store(mirror).put_bytes("z", b"z")
    LocalBackdoor(mirror).write("x", b"another tool's bytes")  # no record: not an artifact
    open_store(primary).put_bytes("x", b"primary")
    store = open_store(primary, mirrors=[str(mirror)])
    try:
        report = store.sync()
    finally:
        store.close()
    # "never deletes on a mirror ... other tools' files ... without touching them": refusing
    # that copy (reported failed) is what a create-only put_bytes does there
    assert LocalBackdoor(mirror).read("x") == b"another tool's bytes"
    assert "x" in report.mirrors[0].failed


# --- another tool moves the folder a commit is publishing into --------------------------------


def test_a_commit_whose_folder_moved_away_does_not_return_a_missing_name(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    stage = store.stage("a/b")
    stage.write(b"new bytes")
    # another tool moves the folder away and makes a new one at its path
    os.rename(root / "a", root / "a_moved")
    (root / "a").mkdir()
    try:
        stage.commit()
    except CommitStoreError:
        return  # refusing is fine: nothing was published under the name
    # it returned: "the name verifies as the new version"
    assert LocalBackdoor(root).read("a/b") == b"new bytes"


def test_replication_never_replaces_another_tools_file_on_a_mirror(tmp_path: Path) -> None:
    primary, mirror = tmp_path / "p", tmp_path / "m"
    open_store(mirror).put_bytes("z", b"z")
    LocalBackdoor(mirror).write("x", b"another tool's bytes")  # no record: not an artifact
    store = open_store(primary, mirrors=[str(mirror)])
    try:
        store.put_bytes("x", b"primary")
        store.flush(timeout=60)
        failed = store.mirror_status()[0].failed
    finally:
        store.close()
    assert LocalBackdoor(mirror).read("x") == b"another tool's bytes"
    assert LocalBackdoor(mirror).read(record_path("x")) is None
    assert "x" in failed


def test_sync_completes_a_copy_that_stopped_after_its_data_step(tmp_path: Path) -> None:
    """Data without a record on a mirror that is exactly the primary's version (a copy whose
    record step never happened) is no other tool's: sync completes it."""
    primary, mirror = tmp_path / "p", tmp_path / "m"
    open_store(primary).put_bytes("x", b"primary")
    open_store(mirror).put_bytes("z", b"z")
    LocalBackdoor(mirror).write("x", b"primary")
    store = open_store(primary, mirrors=[str(mirror)])
    try:
        report = store.sync()
    finally:
        store.close()
    assert report.ok and "x" in report.mirrors[0].copied
    assert LocalBackdoor(mirror).read(record_path("x")) is not None
