"""Hostile or damaged input: records, names and trees on storage are untrusted.

Records are planted through the backdoor (a raw file write locally, boto3 on S3) and every public
call must return a typed answer: ``bad_record`` in scans, IntegrityError from reads, nothing
written outside the destination. Special files (FIFOs, symlinks) are local only. Every call runs
in a thread joined with a timeout, so a regression that blocks fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from commitstore import (
    CommitError,
    ConfigurationError,
    IntegrityError,
    InvalidNameError,
    open_store,
)
from commitstore.cli import main as cli_main
from commitstore.mirrors.sync import sync_mirrors
from commitstore.options import Level
from commitstore.records import RecordFormatError, decode_record
from commitstore.testing import LocalBackdoor, S3Backdoor, Target, record_path, xxh

from .helpers.blocking import mkfifo, returns
from .helpers.s3servers import BUCKET, MotoServer

MAX_DEPTH = 32
"""The documented bounds (docs/format.md): metadata nesting, record bytes."""
MAX_RECORD_BYTES = 16 * 1024 * 1024
pytestmark = pytest.mark.usefixtures("unblock_fifos")  # every test here may plant FIFOs


def _local(root: Path) -> Target:
    return Target(open_store(str(root)), LocalBackdoor(root), lambda: open_store(str(root)))


def _s3(server: MotoServer) -> Target:
    prefix = f"h{time.monotonic_ns()}"
    url, opts = server.url(prefix), server.options()
    return Target(
        open_store(url, **opts),
        S3Backdoor(server.client(), BUCKET, prefix),
        lambda: open_store(url, **opts),
    )


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """Two folders deep in ``tmp_path``, so that ``../`` escapes still land inside it."""
    b = tmp_path / "a" / "b"
    b.mkdir(parents=True)
    return b


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, base: Path) -> Target:
    if request.param == "local":
        return _local(base / "store")
    return _s3(request.getfixturevalue("moto"))


def plant(t: Target, name: str, doc: dict[str, Any] | bytes) -> None:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc, sort_keys=True).encode() + b"\n"
    t.door.write(record_path(name), raw)


def doc_of(t: Target, name: str) -> dict[str, Any]:
    raw = t.door.read(record_path(name))
    assert raw is not None
    out: dict[str, Any] = json.loads(raw)
    return out


def manifest(files: list[dict[str, Any]]) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    for f in sorted(files, key=lambda f: (f["path"], f["size"], f["digest"])):
        h.update(f"{f['path']}\t{f['size']}\t{f['digest']}\n".encode())
    return "xxh3_128:" + h.hexdigest()


def snapshot(top: Path) -> dict[str, bytes]:
    """Every regular file under ``top`` outside a store's own ``.commitstore`` folders."""
    out = {}
    for dirpath, _dirs, files in os.walk(top):
        for f in files:
            p = Path(dirpath) / f
            rel = str(p.relative_to(top))
            if ".commitstore" in Path(rel).parts[:-1] or not p.is_file():
                continue
            out[rel] = p.read_bytes()
    return out


def assert_bad_everywhere(t: Target, name: str, good: tuple[str, ...] = ("good",)) -> None:
    """``name`` is bad_record in every answer; the good artifact beside it is unaffected."""
    store = t.reopen()
    one = returns(lambda: store.verify(name)).results
    assert [r.status for r in one] == ["bad_record"], one
    full = returns(store.verify)
    by = {r.name: r.status for r in full.results}
    assert by.get(name) == "bad_record", full.results
    assert all(by.get(g) == "ok" for g in good), full.results
    assert [r.name for r in returns(store.list)] == list(good)
    latest = returns(store.latest)
    assert latest is not None and latest.name == good[-1]
    with pytest.raises(IntegrityError) as ei:
        returns(lambda: store.record(name))
    assert ei.value.status == "bad_record"
    with pytest.raises(IntegrityError):
        returns(lambda: store.read_bytes(name))


# -- folder records whose paths leave the folder ----------------------------------------------
BAD_PATHS = [
    pytest.param(["../../../victim"], id="dotdot"),
    pytest.param(["x/../../../../victim"], id="dotdot-inner"),
    pytest.param(["ABS"], id="absolute"),
    pytest.param(["a\\b"], id="backslash"),
    pytest.param(["x", "x"], id="duplicate"),
    pytest.param(["y", "x"], id="unsorted"),
    pytest.param(["./x"], id="dot"),
    pytest.param(["x//y"], id="empty-part"),
    pytest.param(["x", "x/y"], id="file-and-folder"),
]


@pytest.mark.parametrize("paths", BAD_PATHS)
def test_folder_record_paths_never_leave_the_folder(
    target: Target, base: Path, tmp_path: Path, paths: list[str]
) -> None:
    t, store = target, target.store
    body = b"precious"
    (base / "victim").write_bytes(body)
    (tmp_path / "a" / "victim").write_bytes(body)
    paths = [str(tmp_path / "a" / "absvictim") if p == "ABS" else p for p in paths]
    (tmp_path / "a" / "absvictim").write_bytes(body)
    store.put_bytes("good", b"fine", step=1)
    with store.stage_dir("run/ckpt", step=2):
        pass
    files = [{"path": p, "size": len(body), "digest": xxh(body)} for p in paths]
    for p in paths:  # data where the hostile paths point, inside the folder where possible
        if ".." not in p and not p.startswith("/") and "//" not in p:
            with contextlib.suppress(OSError):  # "x" and "x/y": only one of them can exist
                t.door.write("run/ckpt/" + p, body)
    doc = doc_of(t, "run/ckpt")
    doc.update(files=files, size=len(body) * len(files), digest=manifest(files))
    plant(t, "run/ckpt", doc)
    before = snapshot(tmp_path)

    assert_bad_everywhere(t, "run/ckpt")
    dest = base / "dl" / "out"
    dest.parent.mkdir()
    with pytest.raises(IntegrityError) as ei:
        returns(lambda: store.get_file("run/ckpt", dest))
    assert ei.value.status == "bad_record"
    assert not dest.exists()

    mirror_root = base / "mirror"
    primary, mirror = t.reopen(), open_store(str(mirror_root))
    report = returns(lambda: sync_mirrors(primary._committer, [mirror._committer], repair=True))
    assert report.mirrors[0].copied == ("good",)
    assert not (mirror_root / "run").exists() or not any((mirror_root / "run").rglob("*"))
    assert snapshot(tmp_path) == {**before, **_mirror_good(tmp_path, mirror_root)}


def _mirror_good(tmp_path: Path, mirror_root: Path) -> dict[str, bytes]:
    return {str((mirror_root / "good").relative_to(tmp_path)): b"fine"}


# -- records that break a naive decoder ---------------------------------------------------------
def _nest(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


MARK = 123456789012345678


def _huge(doc: Any, put: Callable[[Any], None]) -> bytes:
    """``doc`` as JSON, with the value ``put`` sets replaced by a 10,000-digit integer (more
    than Python's int-string limit)."""
    put(MARK)
    return json.dumps(doc, sort_keys=True).replace(str(MARK), "9" * 10_000).encode()


def _huge_raw(field: str) -> Callable[[dict[str, Any]], bytes]:
    def make(doc: dict[str, Any]) -> bytes:
        return _huge(doc, lambda v: doc.__setitem__(field, v))

    return make


def _raw_edit(old: str, new: str) -> Callable[[dict[str, Any]], bytes]:
    def make(doc: dict[str, Any]) -> bytes:
        raw = json.dumps(doc, sort_keys=True)
        assert old in raw
        return raw.replace(old, new, 1).encode()

    return make


def _set(**kw: Any) -> Callable[[dict[str, Any]], bytes]:
    def make(doc: dict[str, Any]) -> bytes:
        doc.update(kw)
        return json.dumps(doc, sort_keys=True).encode()

    return make


HOSTILE = [
    pytest.param(
        lambda d: (
            json.dumps({**d, "metadata": {"m": "DEEP"}}, sort_keys=True)
            .replace('"DEEP"', "[" * 10_000 + "]" * 10_000)
            .encode()
        ),
        id="deep-10000",
    ),
    pytest.param(_set(metadata={"m": _nest(MAX_DEPTH + 1)}), id="deep-bound"),
    pytest.param(_huge_raw("size"), id="huge-size"),
    pytest.param(_huge_raw("step"), id="huge-step"),
    pytest.param(_set(size=2**63), id="size-2**63"),
    pytest.param(_set(step=2**63), id="step-2**63"),
    pytest.param(_set(step=-1), id="step-negative"),
    pytest.param(_set(step="7"), id="step-str"),
    pytest.param(_set(step=1.0), id="step-float"),
    pytest.param(_set(name=7), id="name-int"),
    pytest.param(_set(files={}), id="files-object"),
    pytest.param(_set(metadata=[1]), id="metadata-list"),
    pytest.param(_raw_edit('"m": 1', '"m": NaN'), id="metadata-nan"),
    pytest.param(_raw_edit('"m": 1', '"m": -Infinity'), id="metadata-infinity"),
    pytest.param(_raw_edit('"m": 1', '"m": 1e999'), id="metadata-overflow"),
    pytest.param(_raw_edit('"m": 1', '"m": "\\ud800"'), id="lone-surrogate"),
    pytest.param(_raw_edit('"m": 1', '"\\ud800": 1'), id="lone-surrogate-key"),
    pytest.param(lambda d: b"\xff\xfe" + json.dumps(d).encode(), id="not-utf8"),
    pytest.param(
        lambda d: json.dumps({**d, "metadata": {"m": "x" * (20 * 1024 * 1024)}}).encode(),
        id="20MiB",
    ),
    pytest.param(_set(name="other"), id="names-other-artifact"),
    pytest.param(_set(name="good"), id="names-good-artifact"),
    pytest.param(_set(kind="dir"), id="file-claims-dir"),
]


@pytest.mark.parametrize("make", HOSTILE)
def test_hostile_record_is_bad_record_not_an_exception(
    target: Target, make: Callable[[dict[str, Any]], bytes]
) -> None:
    t, store = target, target.store
    store.put_bytes("good", b"fine", step=1)
    store.put_bytes("other", b"other", step=0, metadata={"m": 1})
    store.put_bytes("victim", b"data", step=2, metadata={"m": 1})
    plant(t, "victim", make(doc_of(t, "victim")))
    # "other" and "good" are still fine (a hostile record naming one of them replaces nothing)
    assert_bad_everywhere(t, "victim", good=("other", "good"))


def _dump(mutate: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], bytes]:
    def make(doc: dict[str, Any]) -> bytes:
        mutate(doc)
        return json.dumps(doc, sort_keys=True).encode()

    return make


DIR_HOSTILE = [
    pytest.param(_dump(lambda d: d.update(size=d["size"] + 1)), id="size-not-sum"),
    pytest.param(
        _dump(lambda d: d.update(digest="xxh3_128:" + "0" * 32)), id="digest-not-manifest"
    ),
    pytest.param(
        lambda d: _huge(d, lambda v: d["files"][0].__setitem__("size", v)), id="file-size-huge"
    ),
    pytest.param(_dump(lambda d: d["files"][0].update(path=3)), id="file-path-int"),
    pytest.param(_dump(lambda d: d["files"].append("x")), id="file-entry-str"),
    pytest.param(_dump(lambda d: d["files"][0].pop("digest")), id="file-entry-no-digest"),
]


@pytest.mark.parametrize("make", DIR_HOSTILE)
def test_inconsistent_folder_record_is_bad_record(
    target: Target, make: Callable[[dict[str, Any]], bytes]
) -> None:
    t, store = target, target.store
    store.put_bytes("good", b"fine", step=1)
    with store.stage_dir("victim", step=2) as d:
        (d / "f").write_bytes(b"abc")
    plant(t, "victim", make(doc_of(t, "victim")))
    assert_bad_everywhere(t, "victim")


def test_decoder_bounds() -> None:
    from commitstore import Record
    from commitstore.records import encode_record

    rec = Record("n", 1, 1, "xxh3_128:" + "a" * 32, metadata={"m": _nest(MAX_DEPTH - 1)})
    assert decode_record(encode_record(rec)) == rec
    doc = json.loads(encode_record(rec))
    doc["metadata"] = {"m": _nest(MAX_DEPTH)}
    with pytest.raises(RecordFormatError):
        decode_record(json.dumps(doc).encode())
    with pytest.raises(RecordFormatError):
        decode_record(b" " * (MAX_RECORD_BYTES + 1))
    for bad in (b"[" * 100_000, b'{"a": ' * 100_000):
        with pytest.raises(RecordFormatError):
            decode_record(bad)


# -- metadata and step are checked before any byte is published --------------------------------
class Unjson:
    pass


BAD_FIELDS = [
    pytest.param({"metadata": {"x": float("nan")}}, id="nan"),
    pytest.param({"metadata": {"x": math.inf}}, id="inf"),
    pytest.param({"metadata": {1: "int key"}}, id="int-key"),
    pytest.param({"metadata": {"x": Unjson()}}, id="object"),
    pytest.param({"metadata": {"x": {1, 2}}}, id="set"),
    pytest.param({"metadata": {"x": _nest(MAX_DEPTH + 1)}}, id="too-deep"),
    pytest.param({"metadata": {"x": 10**30}}, id="int-too-big"),
    pytest.param({"metadata": {"x": "\ud800"}}, id="lone-surrogate"),
    pytest.param({"metadata": ["not", "a", "dict"]}, id="not-a-mapping"),
    pytest.param({"metadata": {"x": "y" * MAX_RECORD_BYTES}}, id="too-big"),
    pytest.param({"step": "7"}, id="step-str"),
    pytest.param({"step": True}, id="step-bool"),
    pytest.param({"step": 1.5}, id="step-float"),
    pytest.param({"step": -1}, id="step-negative"),
    pytest.param({"step": 2**63}, id="step-too-big"),
]


def _no_new_files(t: Target, before: list[str]) -> None:
    assert t.door.files() == before


@pytest.mark.parametrize("overwrite", [False, True], ids=["new", "overwrite"])
@pytest.mark.parametrize("kw", BAD_FIELDS)
def test_bad_metadata_or_step_publishes_nothing(
    target: Target, tmp_path: Path, kw: dict[str, Any], overwrite: bool
) -> None:
    t, store = target, target.store
    store.put_bytes("old", b"version 1", step=1)
    with store.stage_dir("olddir", step=2) as d:
        (d / "f").write_bytes(b"v1")
    before = t.door.files()
    name, dname = ("old", "olddir") if overwrite else ("new", "newdir")
    src = tmp_path / "src.bin"
    src.write_bytes(b"version 2")

    calls: list[Callable[[], Any]] = [
        lambda: store.put_bytes(name, b"version 2", overwrite=overwrite, **kw),
        lambda: store.put_file(name, src, overwrite=overwrite, **kw),
        lambda: store.stage(name, overwrite=overwrite, **kw),
    ]
    for call in calls:
        with pytest.raises(ConfigurationError) as ei:
            call()
        assert not isinstance(ei.value, InvalidNameError)
        _no_new_files(t, before)
    entered = []
    with pytest.raises(ConfigurationError), store.stage_dir(dname, overwrite=overwrite, **kw) as d:
        entered.append(d)
        (d / "f").write_bytes(b"v2")
    assert entered == []
    _no_new_files(t, before)
    assert store.read_bytes("old") == b"version 1"
    assert store.verify().ok
    assert [r.name for r in store.list()] == ["old", "olddir"]


def test_inferred_step_out_of_range_is_no_step(target: Target) -> None:
    name = "step_" + "9" * 30
    rec = target.store.put_bytes(name, b"x")
    assert rec.step is None
    assert target.reopen().record(name) == rec
    assert [r.name for r in target.reopen().list()] == [name]


def test_folder_file_with_unstorable_name_is_refused_before_publish(base: Path) -> None:
    t = _local(base / "store")
    store = t.store
    with store.stage_dir("d", step=1) as d:
        (d / "f").write_bytes(b"v1")
    before = snapshot(base)
    for bad in (b"\xff\xfe", b"a\\b", b"ctl\x01"):
        with pytest.raises(CommitError), store.stage_dir("d", overwrite=True) as d:
            (d / "f").write_bytes(b"v2")
            fd = os.open(os.fsencode(d) + b"/" + bad, os.O_CREAT | os.O_WRONLY, 0o644)
            os.close(fd)
        with pytest.raises(CommitError), store.stage_dir("new") as d:
            os.close(os.open(os.fsencode(d) + b"/" + bad, os.O_CREAT | os.O_WRONLY, 0o644))
        assert snapshot(base) == before
        assert store.verify().ok
        assert [r.name for r in store.list()] == ["d"]


# -- special files (local) -----------------------------------------------------------------------
@pytest.fixture
def local(base: Path) -> Target:
    return _local(base / "store")


def _status(t: Target, name: str, level: Level = "full") -> tuple[str, str]:
    r = returns(lambda: t.reopen().verify(name, level=level)).results
    assert len(r) == 1
    return r[0].status, r[0].detail


def test_fifo_at_a_data_path_never_blocks(local: Target, base: Path) -> None:
    store = local.store
    store.put_bytes("good", b"fine", step=1)
    store.put_bytes("empty", b"", step=2)  # a FIFO's size (0) matches the record
    os.unlink(base / "store" / "empty")
    mkfifo(base / "store" / "empty")
    for level in ("size", "full"):
        assert _status(local, "empty", level) == ("size_mismatch", "not a regular file")
    by = {r.name: r.status for r in returns(store.verify).results}
    assert by == {"good": "ok", "empty": "size_mismatch"}
    latest = returns(store.latest)
    assert latest is not None and latest.name == "good"
    for call in (
        lambda: store.open("empty"),
        lambda: store.open("empty", verify="none"),
        lambda: store.read_bytes("empty"),
        lambda: store.read_bytes("empty", verify="none"),
        lambda: store.get_file("empty", base / "out"),
    ):
        with pytest.raises(IntegrityError):
            returns(call)
    assert not (base / "out").exists()


def test_fifo_at_a_record_path_is_bad_record(local: Target, base: Path) -> None:
    store = local.store
    store.put_bytes("good", b"fine", step=1)
    store.put_bytes("victim", b"data", step=2)
    rec = base / "store" / record_path("victim")
    os.unlink(rec)
    mkfifo(rec)
    assert_bad_everywhere(local, "victim")
    by = {r.name: r for r in returns(store.verify).results}
    assert "not a regular file" in by["victim"].detail


def test_fifo_inside_stage_dir_is_refused(local: Target, base: Path) -> None:
    store = local.store
    with store.stage_dir("d", step=1) as d:
        (d / "f").write_bytes(b"v1")
    before = snapshot(base)

    def fill_with_fifo(name: str, overwrite: bool) -> None:
        with store.stage_dir(name, overwrite=overwrite) as d:
            (d / "f").write_bytes(b"v2")
            (d / "sub").mkdir()
            mkfifo(d / "sub" / "pipe")

    for name, overwrite in (("d", True), ("new", False)):
        with pytest.raises(CommitError):
            returns(lambda n=name, o=overwrite: fill_with_fifo(n, o))  # type: ignore[misc]
        assert snapshot(base) == before
    assert returns(store.verify).ok
    assert [r.name for r in store.list()] == ["d"]


def test_unreadable_folder_inside_stage_dir_is_refused(
    local: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder that cannot be listed (EACCES for a non-root writer, EIO on a damaged disk) fails
    the commit: a swallowed error would commit a record that misses its files."""
    store = local.store
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if str(path).endswith("/sub"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    def fill(name: str) -> None:
        with store.stage_dir(name) as d:
            (d / "sub").mkdir()
            (d / "sub" / "f").write_bytes(b"x")
            monkeypatch.setattr(os, "scandir", scandir)

    with pytest.raises(CommitError):
        returns(lambda: fill("new"))
    monkeypatch.undo()
    assert store.list() == []
    assert [f for f in local.door.files() if not f.startswith(".commitstore/")] == []


def test_dangling_symlink_inside_stage_dir_is_refused(local: Target) -> None:
    store = local.store

    def fill() -> None:
        with store.stage_dir("new") as d:
            os.symlink("/nonexistent", d / "dangling")

    with pytest.raises(CommitError):
        returns(fill)
    assert store.list() == []


def test_symlink_at_a_data_path_with_the_recorded_length(local: Target, base: Path) -> None:
    store = local.store
    outside = base / "outside.txt"
    outside.write_bytes(b"secret!!")
    link_text = str(outside)
    store.put_bytes("good", b"fine", step=1)
    store.put_bytes("s", b"x" * len(os.fsencode(link_text)), step=2)
    os.unlink(base / "store" / "s")
    os.symlink(link_text, base / "store" / "s")
    assert os.lstat(base / "store" / "s").st_size == store.record("s").size
    for level in ("size", "full"):
        assert _status(local, "s", level) == ("size_mismatch", "not a regular file")
    by = {r.name: r.status for r in returns(store.verify).results}
    assert by == {"good": "ok", "s": "size_mismatch"}
    latest = returns(store.latest)
    assert latest is not None and latest.name == "good"
    for call in (
        lambda: store.open("s", verify="none"),
        lambda: store.read_bytes("s"),
        lambda: store.get_file("s", base / "out"),
    ):
        with pytest.raises(IntegrityError):
            returns(call)
    assert cli_main(["verify", str(base / "store")]) == 1


def test_symlink_at_a_record_path_is_bad_record(local: Target, base: Path) -> None:
    store = local.store
    store.put_bytes("good", b"fine", step=1)
    store.put_bytes("victim", b"data", step=2)
    rec = base / "store" / record_path("victim")
    copy = base / "copy.json"
    copy.write_bytes(rec.read_bytes())
    os.unlink(rec)
    os.symlink(copy, rec)
    assert_bad_everywhere(local, "victim")
    by = {r.name: r for r in returns(store.verify).results}
    assert "not a regular file" in by["victim"].detail


@pytest.mark.parametrize("what", ["file", "folder"])
def test_symlink_inside_a_folder_artifact(local: Target, base: Path, what: str) -> None:
    store = local.store
    outside = base / "outside"
    outside.mkdir()
    (outside / "f").write_bytes(b"secret")
    link_text = str(outside) if what == "folder" else str(outside / "f")
    store.put_bytes("good", b"fine", step=1)
    with store.stage_dir("d", step=2) as d:
        (d / "x").write_bytes(b"y" * len(os.fsencode(link_text)))
        (d / "z").write_bytes(b"z")
    os.unlink(base / "store" / "d" / "x")
    os.symlink(link_text, base / "store" / "d" / "x")
    for level in ("size", "full"):
        status, detail = _status(local, "d", level)
        assert status == "size_mismatch" and "not a regular file" in detail
    by = {r.name: r.status for r in returns(store.verify).results}
    assert by == {"good": "ok", "d": "size_mismatch"}
    with pytest.raises(IntegrityError):
        returns(lambda: store.get_file("d", base / "out"))
    assert not (base / "out").exists()
    assert stat.S_ISLNK(os.lstat(base / "store" / "d" / "x").st_mode)
