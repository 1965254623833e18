"""A write call's outcome is binary: if it raises, the name holds what it held before; if it
returns, the name verifies as the new version (docs/guarantees.md, "What a crash leaves").

Each step of a commit fails in turn, on local storage (every libc call of the commit failed by
the project's LD_PRELOAD shim, ``tests/faultshim``) and on S3 (moto, every request of the
commit answered 500 once by the request proxy, with no SDK retry). A step after the data's
publish must not raise: the call returns the record, ``outcome.durable`` False with a note and a
warning when a step that matters failed, and the name verifies as the new version read from the
storage through the backdoor. A step before it raises a typed error and the old version (or
nothing, for a new name) verifies. Every public writer path (``put_bytes``, ``put_file``,
``stage()`` + ``commit()``, ``stage_dir``, ``begin_folder`` + ``commit``, ``commit://`` close,
``torch.save``, mirror copies) then returns the record of a commit whose record write failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from commitstore import (
    CommitOutcome,
    CommitStore,
    CommitStoreError,
    InsufficientSpaceError,
    open_store,
)
from commitstore import _commit as commit_module
from commitstore.backends.rename.posix import LocalBackend
from commitstore.testing import Backdoor, LocalBackdoor, S3Backdoor, record_path

from .faultshim.check import chain, chain_of, leftovers, state
from .faultshim.ops import GONE, NEW, OLD, OPS, Version
from .faultshim.runner import Worker, build_shim
from .helpers.recordfault import refuse_record_writes
from .helpers.requestproxy import RequestProxy
from .helpers.s3servers import BUCKET, MotoServer

EIO = 5


# -- local: every libc call of a commit ---------------------------------------------------------
@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    w = Worker(build_shim(tmp_path_factory.mktemp("shim")))
    try:
        yield w
    finally:
        w.stop()


def data_rename(op: str, calls: list[str]) -> int:
    """The 1-based index of the call that publishes the data under the name (its rename)."""
    name = next(iter(OPS[op].new_name), "w.bin").rsplit("/", 1)[-1]
    return next(
        k for k, c in enumerate(calls, 1) if c.startswith("rename") and c.split(" ")[1] == name
    )


MATTERS = ("write", "fsync", "fdatasync", "rename", "unlink")
"""Calls after the data's publish whose failure leaves the commit not durable, or something
for gc: the record's write, fsync and rename, the folder syncs, the pending record's removal.
(Others, such as a staging file's lock or a descriptor's close, are worked around.)"""


def names(op: str) -> dict[str, set[str]]:
    on_raise = OPS[op].on_raise
    assert on_raise is not None
    return on_raise


@pytest.mark.parametrize("op", ["put_overwrite", "put_new"])
def test_local_every_step_after_the_data_returns_before_it_raises(
    worker: Worker, tmp_path: Path, op: str
) -> None:
    counted = worker.run(op, tmp_path / "count", 0, 0)
    assert counted["outcome"] == "ok", counted
    calls: list[str] = counted["calls"]
    published = data_rename(op, calls)
    name = next(iter(OPS[op].new_name), "w.bin")
    new = name in OPS[op].new_name
    versions = OPS[op].versions[name]
    after_seen = before_seen = 0
    failures = []
    for k, call in enumerate(calls, 1):
        where = tmp_path / f"k{k}"
        reply = worker.run(op, where, k, EIO)
        door = LocalBackdoor(where / "store")
        found = state(door, name, versions)
        what = f"[{op} call {k} {call!r}] {chain_of(reply)}"
        if not reply.get("fired"):
            failures.append(f"{what}: the fault did not fire")
            continue
        if k > published and new and reply.get("outcome") == "raised":
            # a new name whose record step failed: the commit is withdrawn, nothing visible
            after_seen += 1
            if not reply["chain"][0][2] or found != GONE:
                failures.append(f"{what}: raised, name {found!r}")
        elif k > published:  # the data is published: the call returns the new version
            after_seen += 1
            summary = reply.get("summary") or {}
            if reply.get("outcome") != "ok" or found != "new":
                failures.append(f"{what}: outcome {reply.get('outcome')}, name {found!r}")
            elif call.startswith(MATTERS) and (
                summary["durable"] or not summary["notes"] or not summary["warned"]
            ):
                failures.append(f"{what}: not reported as durable=False with a note: {summary}")
        else:
            before_seen += reply.get("outcome") == "raised"
            # the data's rename, and the pending record's
            must_raise = k == published or (
                call.startswith("rename") and ".commitstore.new." in call
            )
            if reply.get("outcome") == "raised":
                typed = reply["chain"][0][2]
                if not typed or found not in names(op)[name]:
                    failures.append(f"{what}: raised, name {found!r} (typed: {typed})")
            elif must_raise or found != "new":
                failures.append(f"{what}: {reply.get('outcome')}, name {found!r}")
        reopened = open_store(where / "store")
        reopened.gc(min_age=0)
        if leftovers(door):
            failures.append(f"{what}: left after gc: {leftovers(door)}")
    assert after_seen >= 10 and before_seen >= 10, (after_seen, before_seen)
    assert not failures, "\n".join(failures)


# -- S3: every request of a commit, through the request proxy ----------------------------------
@pytest.fixture(scope="module")
def proxy(moto: MotoServer) -> Iterator[RequestProxy]:
    p = RequestProxy(moto.port)
    try:
        yield p
    finally:
        p.stop()


class S3Case:
    """A store on moto through the proxy (one attempt per request: a 500 is not retried), with
    a backdoor on the server itself."""

    def __init__(self, moto: MotoServer, proxy: RequestProxy) -> None:
        self.prefix = f"b{time.monotonic_ns()}"
        self.url = moto.url(self.prefix)
        self.opts = {**moto.options(), "endpoint_url": proxy.endpoint, "retries": 1}
        self.door: Backdoor = S3Backdoor(moto.client(), BUCKET, self.prefix)
        self.proxy = proxy

    def open(self) -> CommitStore:
        return open_store(self.url, **self.opts)

    def run(
        self, new_name: bool, k: int | None, *, sticky: bool = False
    ) -> tuple[dict[str, Any], list[str]]:
        """Commit NEW as ``w.bin`` (over OLD unless ``new_name``) with request ``k`` answered
        500 (None: counted); what happened, and the requests made."""
        store = self.open()
        if not new_name:
            store.put_bytes("w.bin", OLD)
        if k is None:
            self.proxy.count()
        else:
            self.proxy.fail(k, "error", sticky=sticky)
        reply: dict[str, Any] = {}
        handler = Collect()
        logging.getLogger("commitstore").addHandler(handler)
        try:
            rec = store.put_bytes("w.bin", NEW, overwrite=not new_name)
            assert rec.outcome is not None
            reply.update(outcome="ok", durable=rec.outcome.durable, notes=rec.outcome.notes)
        except Exception as exc:
            reply.update(outcome="raised", chain=chain(exc), message=str(exc)[:300])
        finally:
            logging.getLogger("commitstore").removeHandler(handler)
        reply["warned"] = handler.messages
        calls = list(self.proxy.log)
        reply["fired"] = bool(self.proxy.hit) or k is None
        self.proxy.count()
        return reply, calls


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def is_data_put(call: str) -> bool:
    method, _, target = call.partition(" ")
    return method == "PUT" and unquote(target).split("?")[0].endswith("/w.bin")


def is_record_put(call: str) -> bool:
    return call.startswith("PUT ") and ".commitstore.rec.w.bin" in unquote(call)


def is_pending_put(call: str) -> bool:
    return call.startswith("PUT ") and ".commitstore.new.w.bin" in unquote(call)


VERSIONS: dict[str, Version] = {"old": OLD, "new": NEW}


@pytest.mark.parametrize("new_name", [False, True], ids=["overwrite", "new"])
def test_s3_every_request_after_the_data_returns_before_it_raises(
    moto: MotoServer, proxy: RequestProxy, new_name: bool
) -> None:
    _, calls = S3Case(moto, proxy).run(new_name, None)
    published = next(k for k, c in enumerate(calls, 1) if is_data_put(c))
    assert any(is_record_put(c) for c in calls[published:]), calls
    failures = []
    for k, call in enumerate(calls, 1):
        case = S3Case(moto, proxy)
        reply, _ = case.run(new_name, k)
        found = state(case.door, "w.bin", VERSIONS)
        what = f"[request {k} {call!r}] {reply.get('outcome')} {reply.get('message', '')[:120]}"
        if k > published and new_name and reply["outcome"] == "raised":
            # a new name whose record step failed: the commit is withdrawn, nothing visible
            if not reply["chain"][0][2] or found != GONE:
                failures.append(f"{what}: raised, the name is {found!r}")
        elif k > published:
            if reply["outcome"] != "ok" or found != "new":
                failures.append(f"{what}: the name is {found!r}")
            elif is_record_put(call) and (
                reply["durable"]
                or not any(n.startswith("record:") for n in reply["notes"])
                or not reply["warned"]
            ):
                failures.append(f"{what}: not reported as durable=False with a note: {reply}")
        elif reply["outcome"] == "raised":
            if not reply["chain"][0][2] or found != ("old" if not new_name else GONE):
                failures.append(f"{what}: raised, the name is {found!r}")
        elif k == published or is_pending_put(call) or found != "new":
            failures.append(f"{what}: returned, the name is {found!r}")
    assert not failures, "\n".join(failures)


def test_s3_record_put_failing_for_good_returns_durable_false(
    moto: MotoServer, proxy: RequestProxy
) -> None:
    """Every request from the record's PUT on answered 500 (the store stops answering right
    after the data's publish): the call returns; the name verifies as the new version, and gc
    (the store answering again) makes its pending record the record."""
    _, calls = S3Case(moto, proxy).run(False, None)
    k = next(i for i, c in enumerate(calls, 1) if is_record_put(c))
    case = S3Case(moto, proxy)
    reply, _ = case.run(False, k, sticky=True)
    assert reply["outcome"] == "ok", reply
    assert reply["durable"] is False and any("record:" in n for n in reply["notes"]), reply
    assert any("durability unconfirmed" in m for m in reply["warned"]), reply
    assert state(case.door, "w.bin", VERSIONS) == "new"
    fresh = case.open()
    assert fresh.read_bytes("w.bin") == NEW
    fresh.gc(min_age=0)
    assert state(case.door, "w.bin", VERSIONS, settled=True) == "new"
    assert fresh.verify().ok


# -- every public writer path -------------------------------------------------------------------
@pytest.fixture
def fail_record_write(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """The storage refuses the record write of ``name`` (``helpers.recordfault``)."""
    return refuse_record_writes(monkeypatch)


def _put_bytes(store: CommitStore, name: str, tmp: Path) -> Any:
    return store.put_bytes(name, NEW, overwrite=True)


def _put_file(store: CommitStore, name: str, tmp: Path) -> Any:
    src = tmp / "src.bin"
    src.write_bytes(NEW)
    return store.put_file(name, src, overwrite=True)


def _stage(store: CommitStore, name: str, tmp: Path) -> Any:
    st = store.stage(name, overwrite=True)
    st.write(NEW)
    rec = st.commit()
    assert rec.outcome is not None
    assert st.durable is False and st.notes == rec.outcome.notes  # Stage reads the outcome
    return rec


def _stage_dir(store: CommitStore, name: str, tmp: Path) -> Any:
    got: list[Any] = []
    with store._stage_dir(name, got, overwrite=True) as d:
        (d / "model.bin").write_bytes(NEW)
    with store.stage_dir(name + "-b", overwrite=True) as d:  # the public call: no raise
        (d / "model.bin").write_bytes(NEW)
    return got[0]


def _folder(store: CommitStore, name: str, tmp: Path) -> Any:
    folder = store.begin_folder(name, overwrite=True)
    with folder.open_file("model.bin") as f:
        f.write(NEW)
    return folder.commit([f.finish()])


def _fsspec(store: CommitStore, name: str, tmp: Path) -> Any:
    import fsspec

    with fsspec.open(f"commit://{tmp / 'store'}/{name}", "wb") as f:  # a clean close commits
        f.write(NEW)
    return None


def _torch(store: CommitStore, name: str, tmp: Path) -> Any:
    import torch

    from commitstore import torch as cs_torch

    return cs_torch.save(torch.arange(4), store, name, overwrite=True)


WRITERS = {
    "put_bytes": _put_bytes,
    "put_file": _put_file,
    "stage": _stage,
    "stage_dir": _stage_dir,
    "begin_folder": _folder,
    "commit_fsspec": _fsspec,
    "torch_save": _torch,
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_returns_when_only_the_record_write_fails(
    writer: str,
    tmp_path: Path,
    fail_record_write: Callable[[str], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = open_store(tmp_path / "store")
    OLD_VERSIONS[writer](store)
    door = LocalBackdoor(tmp_path / "store")
    old_record = door.read(record_path("ckpt"))
    fail_record_write("ckpt")
    with caplog.at_level(logging.WARNING, logger="commitstore"):
        rec = WRITERS[writer](store, "ckpt", tmp_path)  # no exception
    if rec is not None:
        outcome = rec.outcome
        assert isinstance(outcome, CommitOutcome)
        assert outcome.durable is False
        assert any(n.startswith("record:") for n in outcome.notes), outcome
        assert (outcome.target, outcome.bytes) == (store.url, rec.size)
        assert outcome.seconds > 0
    assert "durability unconfirmed" in caplog.text
    assert door.read(record_path("ckpt")) == old_record  # the record write did fail
    fresh = open_store(tmp_path / "store")
    result = fresh.verify("ckpt").results[0]
    assert (result.status, result.detail) == ("ok", PENDING_NOTE)  # the new version
    fresh.gc(min_age=0)
    assert fresh.verify().ok and door.read(record_path("ckpt")) != old_record


def _old_file(store: CommitStore) -> None:
    store.put_bytes("ckpt", b"an old version")


def _old_folder(store: CommitStore) -> None:
    with store.stage_dir("ckpt") as d:
        (d / "model.bin").write_bytes(b"an old version")
    with store.stage_dir("ckpt-b") as d:
        (d / "model.bin").write_bytes(b"an old version")


OLD_VERSIONS: dict[str, Callable[[CommitStore], None]] = {
    w: _old_folder if w in ("stage_dir", "begin_folder") else _old_file for w in WRITERS
}
PENDING_NOTE = "the new version of a commit whose record is pending"


def test_a_mirror_copy_whose_record_write_fails_is_delivered(
    tmp_path: Path, fail_record_write: Callable[[str], None]
) -> None:
    primary = open_store(tmp_path / "p")
    mirror = open_store(tmp_path / "m")
    mirror.put_bytes("ckpt", OLD)
    primary.put_bytes("ckpt", NEW)
    fail_record_write("ckpt")
    with open_store(primary.url, mirrors=[mirror], mirror_mode="sync") as both:
        report = both.sync()
    assert report.mirrors[0].failed == {}, report
    assert "ckpt" in report.mirrors[0].repaired
    door = LocalBackdoor(tmp_path / "m")
    assert state(door, "ckpt", VERSIONS) == "new"


def test_a_failure_before_the_data_raises_and_the_old_version_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "store")
    store.put_bytes("ckpt", OLD)
    original = commit_module.put_small

    def refuse_pending(backend: Any, parts: tuple[str, ...], body: bytes, mode: Any) -> Any:
        if ".commitstore.new." in parts[-1]:
            raise InsufficientSpaceError("no space left while writing the pending record")
        return original(backend, parts, body, mode)

    def refuse_in_place(self: LocalBackend, parts: tuple[str, ...], body: bytes) -> Any:
        raise InsufficientSpaceError("no space left while writing the pending record")

    monkeypatch.setattr(commit_module, "put_small", refuse_pending)
    monkeypatch.setattr(LocalBackend, "put_pending", refuse_in_place)  # local disks write it so
    with pytest.raises(CommitStoreError):
        store.put_bytes("ckpt", NEW, overwrite=True)
    assert state(LocalBackdoor(tmp_path / "store"), "ckpt", VERSIONS) == "old"


def test_records_read_from_storage_carry_no_outcome(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    rec = store.put_bytes("ckpt", NEW)
    assert rec.outcome is not None and rec.outcome.durable is True
    assert rec.outcome.notes == () and rec.outcome.bytes == len(NEW)
    stored = store.record("ckpt")
    assert stored.outcome is None
    assert stored == rec  # not compared
    assert b"outcome" not in (LocalBackdoor(tmp_path / "store").read(record_path("ckpt")) or b"")
