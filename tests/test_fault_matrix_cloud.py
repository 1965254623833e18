"""The request-level fault matrix on the object stores, through the HTTP request proxy
(``helpers/requestproxy.py``) in front of moto (S3), fake-gcs-server (GCS) and Azurite (Azure):
request k of an operation gets a 500 (that one only, or from it on) or its connection dropped,
for every k. On S3: folder commits (new, replace), a folder delete, prune and gc; on GCS and
Azure: file and folder commits, new and replace, and a file delete (S3's file commits and
delete are in ``test_fault_matrix_requests.py``).

After each case: a typed error or success, and every name old or new, read from the server
with the store's own SDK bypassed (a backdoor talking to the server, not the proxy), before and
after a fresh store's gc (``tests/faultshim/check.py``).

The default run fails, under a 500 that stays (the operation's own clean-up fails too), the
first request of each stage (:func:`landmarks`) of the cases in :data:`DEFAULT` (every request
of GCS's file overwrite); ``soak`` every request of every operation under every fault. The
session's summary prints how many cases ran.
"""

from __future__ import annotations

import asyncio
import os
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from commitstore import CommitStore, open_store
from commitstore.testing import Backdoor, GcsBackdoor, S3Backdoor, record_path

from .faultshim.check import chain, chain_of, check_case, pending_path
from .faultshim.ops import NEW, OLD, OLD_NEW, OPS, Op
from .faultshim.runner import MatrixSummary
from .helpers.azurite import ACCOUNT, Azurite, azure_backdoor
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.requestproxy import RequestProxy
from .helpers.s3servers import BUCKET, MotoServer
from .helpers.serverfixture import module_server

TITLE = "request fault matrix (S3, GCS, Azure)"
COUNTED: dict[str, int] = {}
FAULTS = {"500-from-here": ("error", True), "drop": ("drop", False), "500": ("error", False)}
READS = ("GET", "HEAD")


# -- gc on an object store: the interrupted commits are made with the backdoor ------------------
def _gc_run(store: CommitStore, pause: Callable[[bool], None]) -> dict[str, Any]:
    return {"removed": len(store.gc(min_age=0).removed)}


GC_OBJECTS = Op(
    "gc",
    lambda store, root: None,  # see _gc_setup: it needs the backdoor
    _gc_run,
    {"a.bin": {"old": OLD}, "w.bin": OLD_NEW, "v.bin": OLD_NEW},
    {"a.bin": {"old"}, "w.bin": {"new"}, "v.bin": {"old"}},
    {"a.bin": {"old"}, "w.bin": {"new"}, "v.bin": {"old"}},
)
"""``a.bin`` whole; ``w.bin``: its new data published, the record not yet (gc makes the pending
record the record); ``v.bin``: a pending record written, the data not (gc drops it)."""


def _gc_setup(
    store: CommitStore, door: Backdoor, scratch: CommitStore, scratch_door: Backdoor
) -> None:
    for name in ("a.bin", "w.bin", "v.bin"):
        store.put_bytes(name, OLD)
    for name in ("w.bin", "v.bin"):
        scratch.put_bytes(name, NEW)
        record = scratch_door.read(record_path(name))
        assert record is not None
        door.write(pending_path(name), record)
    door.write("w.bin", NEW)


CLOUD_OPS: dict[str, Op] = {**OPS, "gc": GC_OBJECTS}


# -- servers and their proxies ------------------------------------------------------------------
gcs = module_server(FakeGcs, "gcs")


azurite = module_server(Azurite, "azurite")


PROXIES: dict[str, RequestProxy] = {}


@pytest.fixture(scope="module")
def proxies(request: pytest.FixtureRequest) -> Iterator[dict[str, RequestProxy]]:
    MatrixSummary.of(request.config).sizes[TITLE] = COUNTED
    try:
        yield PROXIES
    finally:
        for proxy in PROXIES.values():
            proxy.stop()
        PROXIES.clear()


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """GCS's tries (the store's ``retries``, ``backends/object/gcs/client.py``) without their
    backoff (1, 2, 4, 8 s): a fault still meets each SDK's retry, and a fault that stays costs a
    fraction of a second (S3: :data:`S3_RETRIES`)."""
    # Imported the way the GCS backend imports gcsfs (which otherwise, once imported, probes
    # every bucket over gRPC/TLS first, and hangs against a plain-HTTP server).
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs.retry

    async def no_backoff(seconds: float) -> None:
        await asyncio.sleep(0)

    shim = types.ModuleType("asyncio")
    shim.__dict__.update(vars(asyncio))
    shim.sleep = no_backoff  # type: ignore[attr-defined]
    monkeypatch.setattr(gcsfs.retry, "asyncio", shim)
    # the store's own bounded tries, same backoff
    from commitstore.backends.object.gcs import client as _gcsfs

    monkeypatch.setattr(_gcsfs, "asyncio", shim)


S3_RETRIES = {"retries": 2}
"""One retry per request on S3 (the store's ``retries``; its default is five attempts, with the
SDK's exponential backoff between them): a fault still meets the SDK's retry, and a fault that
stays costs a fraction of a second instead of seconds per request."""


class Case:
    """One store on ``kind``'s server, opened through its proxy, with a backdoor on the server."""

    def __init__(
        self, kind: str, request: pytest.FixtureRequest, proxies: dict[str, RequestProxy]
    ) -> None:
        self.prefix = f"m{time.monotonic_ns()}"
        if kind == "s3":
            moto: MotoServer = request.getfixturevalue("moto")
            proxy = proxies.get(kind) or proxies.setdefault(kind, RequestProxy(moto.port))
            self.url = moto.url(self.prefix)
            self.opts: dict[str, Any] = {
                **moto.options(),
                "endpoint_url": proxy.endpoint,
                **S3_RETRIES,
            }
            self.door: Backdoor = S3Backdoor(moto.client(), BUCKET, self.prefix)
            self.scratch_door: Backdoor = S3Backdoor(moto.client(), BUCKET, self.prefix + "s")
        elif kind == "gcs":
            gcs: FakeGcs = request.getfixturevalue("gcs")
            proxy = proxies.get(kind) or proxies.setdefault(kind, RequestProxy(gcs.port))
            self.url = gcs.url(self.prefix)
            self.opts = {**gcs.options(), "endpoint_url": proxy.endpoint}
            self.door = GcsBackdoor(gcs.endpoint, GCS_BUCKET, self.prefix)
            self.scratch_door = GcsBackdoor(gcs.endpoint, GCS_BUCKET, self.prefix + "s")
        else:
            az: Azurite = request.getfixturevalue("azurite")
            proxy = proxies.get(kind) or proxies.setdefault(kind, RequestProxy(az.port))
            self.url = az.url(self.prefix)
            conn = az.connection_string.replace(az.endpoint, f"{proxy.endpoint}/{ACCOUNT}")
            # The SDK's retries, one and quick (its defaults wait 15 s, 18 s, 24 s... with 3 s
            # of jitter; its backoff is initial_backoff + increment_base ** n for retry n >= 1,
            # so increment_base 1 would still wait a second before each retry).
            quick = {"retry_total": 1, "initial_backoff": 0.05, "increment_base": 0}
            self.opts = {
                "connection_string": conn,
                "client_options": {**quick, "random_jitter_range": 0},
            }
            self.door = azure_backdoor(az, self.prefix)
            self.scratch_door = azure_backdoor(az, self.prefix + "s")
        self.proxy = proxy

    def open(self, prefix: str | None = None) -> CommitStore:
        url = self.url if prefix is None else self.url.replace(self.prefix, prefix)
        return open_store(url, **self.opts)

    def run(self, op: str, fault: tuple[str, bool] | None, k: int) -> dict[str, Any]:
        """Set ``op`` up with no fault, then run it with request ``k`` faulted (None: count)."""
        self.proxy.count()
        store = self.open()
        if op == "gc":
            _gc_setup(store, self.door, self.open(self.prefix + "s"), self.scratch_door)
        else:
            CLOUD_OPS[op].setup(store, Path("/nonexistent"))
        if fault is None:
            self.proxy.count()
        else:
            self.proxy.fail(k, fault[0], sticky=fault[1])
        reply: dict[str, Any] = {"killed": False}
        try:
            reply["summary"] = CLOUD_OPS[op].run(store, lambda on: None)
            reply["outcome"] = "ok"
        except Exception as exc:
            reply["outcome"], reply["chain"] = "raised", chain(exc)
            reply["message"] = str(exc)[:300]
        reply["fired"] = bool(self.proxy.hit) or fault is None
        reply["calls"] = list(self.proxy.log)
        self.proxy.count()
        return reply


def _soak_unless(default: bool) -> Any:
    return () if default else (pytest.mark.soak,)


def landmarks(calls: list[str]) -> list[int]:
    """The first request (1-based) of each kind of changing request (its method, and whether its
    key is a record, a pending record, a staged copy or data): where an operation's state on
    the server moves on to its next stage."""
    out, seen = [], set()
    for k, call in enumerate(calls, 1):
        if call.startswith(READS):
            continue
        method, _, target = call.partition(" ")
        what = next((w for m, w in STAGES if m in unquote(target)), "data")
        if (method, what) not in seen:
            out.append(k)
        seen.add((method, what))
    return out


STAGES = ((".commitstore.rec.", "record"), (".commitstore.new.", "pending"), ("/staged/", "staged"))
OPS_OF = {
    "s3": ("dir_new", "dir_overwrite", "delete_dir", "prune", "gc"),
    "gcs": ("put_new", "put_overwrite", "delete_file", "dir_new", "dir_overwrite"),
    "azure": ("put_new", "put_overwrite", "delete_file", "dir_new", "dir_overwrite"),
}
DEFAULT_FAULT = "500-from-here"
"""The default run's fault: every request from there on fails, the operation's own clean-up
included."""
DEFAULT = {
    ("s3", "dir_new"),
    ("s3", "delete_dir"),
    ("s3", "gc"),
    *(("gcs", op) for op in OPS_OF["gcs"]),
    ("azure", "put_overwrite"),
    ("azure", "dir_new"),
}
"""What the default run holds, at the landmarks under :data:`DEFAULT_FAULT` (GCS's file
overwrite at every request); the rest, at seconds a case, only under ``soak`` (a folder replace
on S3 and Azure also fails at each of its stages in ``test_object_replace.py``, through the
backend's methods)."""
CASES = [
    pytest.param((kind, op, fault, which), id=f"{kind}-{op}-{fault}-{which}", marks=marks)
    for kind, ops in OPS_OF.items()
    for op in ops
    for fault in FAULTS
    for which, marks in (
        ("all", _soak_unless((kind, op) == ("gcs", "put_overwrite") and fault == DEFAULT_FAULT)),
        *(
            (("landmarks", _soak_unless((kind, op) in DEFAULT)),)
            if (kind, op) != ("gcs", "put_overwrite") and fault == DEFAULT_FAULT
            else ()
        ),
    )
]


@pytest.mark.parametrize("spec", CASES)
def test_cloud_request_matrix(
    spec: tuple[str, str, str, str],
    request: pytest.FixtureRequest,
    proxies: dict[str, RequestProxy],
) -> None:
    """Each HTTP request of ``op`` in turn (``which``: all of them, or its :func:`landmarks`)
    gets a 500 (from it on, or that one only) or its connection dropped."""
    kind, op, fault, which = spec
    counted = Case(kind, request, proxies).run(op, None, 0)
    assert counted["outcome"] == "ok", counted
    calls: list[str] = counted["calls"]
    picked = list(range(1, len(calls) + 1)) if which == "all" else landmarks(calls)
    assert len(picked) >= 2, calls
    failures = []
    for k in picked:
        case = Case(kind, request, proxies)
        reply = case.run(op, FAULTS[fault], k)
        problems = check_case(case.door, case.open, CLOUD_OPS[op], reply, "request")
        if problems:
            failures.append(
                f"[{kind} {op} request {k} {calls[k - 1]!r} {fault}] {chain_of(reply)}: {problems}"
            )
    COUNTED[f"{kind} {op} {fault} {which}"] = len(picked)
    assert not failures, "\n".join(failures)
