"""The fault matrix at the request level: every request of a commit (new name, overwrite) and of
a delete fails in turn, on the FUSE bridge (faultfs's ``nth_request``: an errno, or the writer
SIGKILLed at that request), on S3 (``helpers/requestproxy.py`` in front of moto: the server
answering 500 from that request on, or the connection dropped at it) and on SMB (the same proxy
per SMB2 message in front of Samba: the connection dropped at it). After each: a typed error or
success, and every name old or new, from the backing folder or the bucket (a backdoor), before and
after a fresh store's gc (``tests/faultshim/check.py``).

The default run covers, on FUSE, every request that changes something under EIO and SIGKILL
(the overwrite under every fault), and on S3 the overwrite stopped at each of its requests;
``soak`` runs every request of every operation under every fault.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore.testing import LocalBackdoor, S3Backdoor

from .faultshim.check import chain, chain_of, check_case
from .faultshim.ops import OPS
from .faultshim.runner import FAULTS, MatrixSummary, Worker
from .helpers.fusemount import FaultMount
from .helpers.requestproxy import RequestProxy, SmbMessageProxy
from .helpers.s3servers import BUCKET, MotoServer
from .helpers.samba import PASSWORD, SHARE, USER, SambaServer

CHANGING = {"create", "write", "fsync", "flush", "release", "rename", "unlink", "link", "mkdir"}
"""FUSE requests that change what the backing folder holds (or make it durable)."""
ASYNC = {"release", "releasedir", "forget"}
"""Requests the kernel sends on its own after a close (pid 0): SIGKILL has no sender there."""
COUNTED: dict[str, int] = {}


def _soak_unless(default: bool) -> Any:
    return () if default else (pytest.mark.soak,)


# -- FUSE bridge --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultMount]:
    m = FaultMount(tmp_path_factory.mktemp("matrix-faultfs"))
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="module")
def fuse_worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    MatrixSummary.of(request.config).sizes["request fault matrix (FUSE, S3, SMB)"] = COUNTED
    w = Worker(None)
    try:
        yield w
    finally:
        w.stop()


FUSE_CASES = [
    pytest.param(op, err, every, id=f"{op}-{err}-{'all' if every else 'changing'}", marks=marks)
    for op in ("put_overwrite", "put_new", "delete_file", "dir_new")
    for err in FAULTS
    for every, marks in (
        (False, _soak_unless(op == "put_overwrite" or err in ("EIO", "SIGKILL"))),
        (True, _soak_unless(False)),
    )
]


@pytest.mark.parametrize(("op", "err", "every"), FUSE_CASES)
def test_fuse_request_matrix(
    mount: FaultMount, fuse_worker: Worker, op: str, err: str, every: bool
) -> None:
    """Each request faultfs receives for ``op`` fails in turn (``every``: all of them; else the
    ones that change something); SIGKILL kills the writer at that request."""
    tag = f"{op}-{err}-{every}-{time.monotonic_ns()}"
    counted = fuse_worker.run(
        op, mount.mnt / f"c{tag}", 0, 0, control=str(mount.control), match=f"/c{tag}/"
    )
    assert counted.get("outcome") == "ok", counted
    calls: list[str] = counted["calls"]
    kinds = [c.split(" ")[0] for c in calls]
    picked = [k for k, kind in enumerate(kinds, 1) if every or kind in CHANGING]
    assert len(picked) >= 3, calls
    failures = []
    vacuous: list[int] = []
    for k in picked:
        name = f"k{k}-{tag}"
        reply = fuse_worker.run(
            op, mount.mnt / name, k, FAULTS[err], control=str(mount.control), match=f"/{name}/"
        )
        mount.clear()
        root = mount.backing / name / "store"
        hit = reply.get("hit_pids", [])
        # A SIGKILL that landed on a request the kernel sent on its own (pid 0) after the
        # writer's last one found no process to kill: that request just failed with EIO.
        seen = "EIO" if err == "SIGKILL" and hit and not any(hit) else err
        if err == "SIGKILL" and not reply["killed"] and kinds[k - 1] in ASYNC:
            # The same for a release the kernel sends after the writer's last close, which
            # may land after the case ended: no process to kill; it failed with EIO or not.
            seen, reply["fired"] = "EIO", True
        if err == "SIGKILL" and not reply["killed"] and kinds[k - 1] == "flush":
            # A flush is the kernel's request of a close(): the signal sent at it can land
            # after the close returned and the writer, its work done, exited (seen on the close
            # of the store's lock). The case is still checked, as a failed request.
            print(f"{op}: the SIGKILL at {calls[k - 1]!r} landed after the writer exited")
            seen, reply["fired"] = "EIO", True
        if not hit and not reply["killed"] and reply.get("count", 0) < k:
            vacuous.append(k)  # this run sent fewer requests (the kernel's caching varies)
            reply["fired"] = True
        problems = check_case(LocalBackdoor(root), partial(open_store, root), OPS[op], reply, seen)
        if reply.get("hit_in_caller"):  # the caller's own write failed: its OSError is its own
            problems = [p for p in problems if not p.startswith("untyped error escaped")]
        if problems:
            failures.append(
                f"[{op} request {k} {calls[k - 1]!r} {err}] {chain_of(reply)}: {problems}"
            )
        shutil.rmtree(mount.backing / name, ignore_errors=True)
    COUNTED[f"fuse {op} {err}"] = len(picked)
    assert not failures, "\n".join(failures)
    assert len(vacuous) <= max(2, len(picked) // 10), f"requests never reached: {vacuous}"


# -- S3 -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3proxy(moto: MotoServer, request: pytest.FixtureRequest) -> Iterator[RequestProxy]:
    MatrixSummary.of(request.config).sizes["request fault matrix (FUSE, S3, SMB)"] = COUNTED
    proxy = RequestProxy(moto.port)
    try:
        yield proxy
    finally:
        proxy.stop()


ONE_RETRY = {"retries": 2}
"""Two attempts per request (the store's ``retries``; its default is five, with the SDK's
exponential backoff between them): a fault still meets the SDK's retry, and a fault that stays
costs a fraction of a second instead of seconds per request."""
S3_FAULTS = {"500-from-here": ("error", True), "drop": ("drop", False), "500": ("error", False)}
S3_CASES = [
    pytest.param(
        op,
        fault,
        id=f"{op}-{fault}",
        marks=_soak_unless(op == "put_overwrite" and fault == "500-from-here"),
    )
    for op in ("put_overwrite", "put_new", "delete_file")
    for fault in S3_FAULTS
]


def _s3_run(
    moto: MotoServer, proxy: RequestProxy, op: str, fault: tuple[str, bool] | None, k: int
) -> tuple[dict[str, Any], S3Backdoor, Any]:
    prefix = f"m{time.monotonic_ns()}"
    url = moto.url(prefix)
    opts = {**moto.options(), "endpoint_url": proxy.endpoint, **ONE_RETRY}
    proxy.count()
    store: CommitStore = open_store(url, **opts)
    OPS[op].setup(store, Path("/nonexistent"))
    if fault is None:
        proxy.count()
    else:
        proxy.fail(k, fault[0], sticky=fault[1])
    reply: dict[str, Any] = {"killed": False}
    try:
        OPS[op].run(store, lambda on: None)
        reply["outcome"] = "ok"
    except Exception as exc:
        reply["outcome"], reply["chain"] = "raised", chain(exc)
        reply["message"] = str(exc)[:300]
    reply["fired"] = bool(proxy.hit) or fault is None
    reply["calls"] = list(proxy.log)
    proxy.count()
    return reply, S3Backdoor(moto.client(), BUCKET, prefix), lambda: open_store(url, **opts)


@pytest.mark.parametrize(("op", "fault"), S3_CASES)
def test_s3_request_matrix(moto: MotoServer, s3proxy: RequestProxy, op: str, fault: str) -> None:
    """Each HTTP request of ``op`` in turn gets a 500 (from it on, or that one only) or its
    connection dropped."""
    counted, _, _ = _s3_run(moto, s3proxy, op, None, 0)
    assert counted["outcome"] == "ok", counted
    calls = counted["calls"]
    assert len(calls) >= 2, calls
    failures = []
    for k in range(1, len(calls) + 1):
        reply, door, reopen = _s3_run(moto, s3proxy, op, S3_FAULTS[fault], k)
        problems = check_case(door, reopen, OPS[op], reply, "request")
        if problems:
            failures.append(
                f"[{op} request {k} {calls[k - 1]!r} {fault}] {chain_of(reply)}: {problems}"
            )
    COUNTED[f"s3 {op} {fault}"] = len(calls)
    assert not failures, "\n".join(failures)


# -- SMB ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def samba(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SambaServer]:
    server = SambaServer(tmp_path_factory.mktemp("matrix-samba"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def smbproxy(samba: SambaServer, request: pytest.FixtureRequest) -> Iterator[SmbMessageProxy]:
    MatrixSummary.of(request.config).sizes["request fault matrix (FUSE, S3, SMB)"] = COUNTED
    proxy = SmbMessageProxy(samba.port)
    try:
        yield proxy
    finally:
        proxy.stop()


def _smb_run(
    samba: SambaServer, proxy: SmbMessageProxy, op: str, k: int
) -> tuple[dict[str, Any], LocalBackdoor, Any]:
    sub = f"m{time.monotonic_ns()}"
    url = f"smb://{USER}@127.0.0.1:{proxy.port}/{SHARE}/{sub}"
    proxy.count()
    store = open_store(url, password=PASSWORD)
    OPS[op].setup(store, Path("/nonexistent"))
    proxy.fail(k or None)
    reply: dict[str, Any] = {"killed": False}
    try:
        OPS[op].run(store, lambda on: None)
        reply["outcome"] = "ok"
    except Exception as exc:
        reply["outcome"], reply["chain"] = "raised", chain(exc)
        reply["message"] = str(exc)[:300]
    reply["fired"] = bool(proxy.hit) or not k
    reply["calls"] = list(proxy.log)
    proxy.count()
    return reply, LocalBackdoor(samba.share_dir / sub), partial(open_store, url, password=PASSWORD)


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(op, marks=_soak_unless(op == "put_overwrite"))
        for op in ("put_overwrite", "put_new", "delete_file")
    ],
)
def test_smb_request_matrix(samba: SambaServer, smbproxy: SmbMessageProxy, op: str) -> None:
    """Each SMB2 message of ``op`` in turn is dropped with its connection (the client
    reconnects; a write stream it cannot resume fails the commit)."""
    counted, _, _ = _smb_run(samba, smbproxy, op, 0)
    assert counted["outcome"] == "ok", counted
    calls = counted["calls"]
    assert len(calls) >= 5, calls
    failures = []
    for k in range(1, len(calls) + 1):
        reply, door, reopen = _smb_run(samba, smbproxy, op, k)
        problems = check_case(door, reopen, OPS[op], reply, "drop")
        if problems:
            failures.append(f"[{op} message {k} {calls[k - 1]} drop] {chain_of(reply)}: {problems}")
    COUNTED[f"smb {op}"] = len(calls)
    assert not failures, "\n".join(failures)


def test_bridge_folder_replace(mount: FaultMount) -> None:
    """``stage_dir(name, overwrite=True)`` over an existing folder on a FUSE mount commits (the
    matrix leaves ``dir_overwrite`` out on FUSE until it does)."""
    mount.clear()
    root = mount.mnt / f"replace-{time.monotonic_ns()}"
    store = open_store(root)
    assert store.describe()["strategy"] == "bridge-checked"
    OPS["dir_overwrite"].setup(store, root)
    OPS["dir_overwrite"].run(store, lambda on: None)
    assert open_store(root).verify("ck/w").ok
