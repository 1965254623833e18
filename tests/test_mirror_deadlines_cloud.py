"""Deadlines of GCS, Azure (and SMB) stores: an endpoint that accepts TCP and never answers
(``helpers.blackhole``) fails every request within the store's ``connect_timeout``,
``read_timeout`` and ``retries``, as a primary (always a typed error) and as a mirror (commits on
the primary return, ``mirror_status`` reports the mirror unreachable).

Without these deadlines a request to such an endpoint waited forever (gcsfs gives aiohttp no
timeout at all). The bound enforced here is an outer one, far above the deadlines configured
(1 s, one attempt): a call that has not returned by then is stuck, never a measure of speed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore.backends.object.azure.backend import sdk_deadlines
from commitstore.errors import BackendUnavailableError, ConfigurationError
from commitstore.mirrors import copy as copy_mod

from .helpers.blackhole import Blackhole, within
from .helpers.faultproxy import FaultProxy
from .helpers.samba import PASSWORD, SambaServer
from .helpers.samba import SHARE as SMB_SHARE
from .helpers.samba import USER as SMB_USER

BOUND = 120.0
"""Seconds within which every call here must return (the deadlines configured are 1 s)."""
TIMEOUTS: dict[str, Any] = {"connect_timeout": 1, "read_timeout": 1, "retries": 1}
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's published development key (any well-formed key reaches the endpoint)."""
KiB = 1024


def _within(fn: Callable[[], Any], bound: float = BOUND) -> Any:
    return within(fn, bound)


@pytest.fixture
def hole() -> Iterator[Blackhole]:
    with Blackhole() as h:
        yield h


def _gcs(hole: Blackhole, prefix: str, **extra: Any) -> CommitStore:
    opts = {"endpoint_url": hole.url, "token": "anon", "project": "test", **TIMEOUTS, **extra}
    return open_store(f"gs://bucket/{prefix}", chunk_size=256 * KiB, **opts)


def _azure_connection(hole: Blackhole) -> str:
    return (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={hole.url}/devstoreaccount1;"
    )


def _azure(hole: Blackhole, prefix: str, **extra: Any) -> CommitStore:
    opts = {"connection_string": _azure_connection(hole), **TIMEOUTS, **extra}
    return open_store(f"az://container/{prefix}", block_size=256 * KiB, **opts)


STORES: dict[str, Callable[..., CommitStore]] = {"gcs": _gcs, "azure": _azure}

OPS = [
    pytest.param(lambda s: s.put_bytes("a.pt", b"x" * 1000), id="put_small"),
    pytest.param(lambda s: s.put_bytes("b.pt", b"y" * (1 << 20)), id="put_chunked"),
    pytest.param(lambda s: s.list(), id="list"),
    pytest.param(lambda s: s.record("a.pt"), id="record"),
    pytest.param(lambda s: s.read_bytes("a.pt"), id="read"),
    pytest.param(lambda s: s.delete("a.pt"), id="delete"),
]


# -- a blackholed primary --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(STORES))
@pytest.mark.parametrize("op", OPS)
def test_a_blackholed_primary_fails_typed_within_its_deadline(
    hole: Blackhole, kind: str, op: Callable[[CommitStore], Any]
) -> None:
    store = STORES[kind](hole, "primary")
    with pytest.raises(BackendUnavailableError):
        _within(lambda: op(store))
    assert hole.accepted >= 1  # the requests did reach the endpoint


@pytest.mark.parametrize("kind", sorted(STORES))
def test_retries_are_attempts_in_all(hole: Blackhole, kind: str) -> None:
    """``retries=2``: the first request is sent twice, then the call fails (typed)."""
    store = STORES[kind](hole, "tries", retries=2)
    if kind == "azure":  # the SDK waits 15 s before a retry by default
        store = STORES[kind](
            hole, "tries", retries=2, client_options={"initial_backoff": 0.1, "increment_base": 1}
        )
    with pytest.raises(BackendUnavailableError):
        _within(store.list)
    assert hole.accepted == 2


@pytest.mark.parametrize("kind", sorted(STORES))
def test_deadlines_are_checked_before_any_io(hole: Blackhole, kind: str) -> None:
    bad_values: list[dict[str, Any]] = [
        {"read_timeout": 0},
        {"connect_timeout": "1"},
        {"retries": 0},
        {"retries": 1.5},
        {"read_timeout": float("inf")},
        {"connect_timeout": -1},
    ]
    for bad in bad_values:
        with pytest.raises(ConfigurationError):
            STORES[kind](hole, "p", **bad)
    assert hole.accepted == 0


def test_azure_deadlines_given_twice_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="retries"):
        sdk_deadlines({"retries": 2}, {"retry_total": 4})
    # the SDK's keyword alone is the caller's; the store's defaults fill the rest
    got = sdk_deadlines({}, {"retry_total": 4})
    assert got == {"connection_timeout": 10.0, "read_timeout": 60.0, "retry_total": 4}
    assert sdk_deadlines({"retries": 3, "read_timeout": 5}, {})["retry_total"] == 2


# -- a blackholed mirror ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_blackholed_mirror_never_blocks_commits(
    tmp_path: Path, hole: Blackhole, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(copy_mod, "RETRIES", 1)  # one attempt per copy keeps the test short
    monkeypatch.setenv("COMMITSTORE_MIRROR_HANDOFF_SECONDS", "0.5")
    mirror = STORES[kind](hole, "mirror")
    store = open_store(tmp_path / "p", mirrors=[mirror], mirror_queue=1)
    names = [f"step_{i}.pt" for i in range(4)]
    for name in names:  # more than the queue holds: the commits hand copies off
        _within(partial(store.put_bytes, name, name.encode() * 100))
    assert [r.name for r in store.list()] == names  # every commit stands on the primary
    [state] = _within(store.mirror_status)
    assert state.reachable is False
    assert state.last_error is not None and "BackendUnavailableError" in state.last_error
    assert state.owed == len(names)
    _within(store.flush, bound=BOUND * len(names))
    [state] = _within(store.mirror_status)
    assert set(state.failed) == set(names)
    assert state.owed == len(names)  # failed copies are still owed (sync repairs)
    _within(store.close)
    assert hole.accepted >= len(names)


# -- a blackholed SMB server -----------------------------------------------------------------------
def test_a_blackholed_smb_server_fails_typed_within_its_timeout(hole: Blackhole) -> None:
    """SMB's ``timeout`` bounds the negotiate of each connection: a server that accepts and never
    answers is unreachable (``BackendUnavailableError``, after the bounded reconnects), not a
    ``CommitError`` about a generic SMB failure. Opening an SMB store connects, so that is where
    it fails."""
    url = f"smb://user@127.0.0.1:{hole.port}/share/p"
    with pytest.raises(BackendUnavailableError, match="unreachable"):
        _within(lambda: open_store(url, password="pw", timeout=1))
    assert hole.accepted >= 1


@pytest.fixture(scope="module")
def samba(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SambaServer]:
    server = SambaServer(tmp_path_factory.mktemp("samba"))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda s: s.put_bytes("b.pt", b"y" * 5000, overwrite=True), id="commit"),
        pytest.param(lambda s: s.read_bytes("a.pt"), id="read"),
        pytest.param(lambda s: s.list(), id="list"),
    ],
)
def test_an_smb_server_that_stops_answering_mid_session_fails_typed_within_its_timeout(
    samba: SambaServer, op: Callable[[CommitStore], Any]
) -> None:
    """A session already set up, then the server stops answering (a proxy that holds every
    byte from then on: a hung NAS): the connection's socket carries the store's ``timeout``, so
    the client's wait for an answer ends with it and the call raises BackendUnavailableError
    (within the bounded reconnects); what was committed before is still whole once the server
    answers again."""
    proxy = FaultProxy(samba.port)
    try:
        url = f"smb://{SMB_USER}@127.0.0.1:{proxy.port}/{SMB_SHARE}/h{time.monotonic_ns()}"
        store = open_store(url, password=PASSWORD, timeout=1)
        store.put_bytes("a.pt", b"x" * 5000)
        proxy.freeze()
        with pytest.raises(BackendUnavailableError, match="unreachable"):
            _within(lambda: op(store))
        proxy.thaw()
        fresh = open_store(url, password=PASSWORD, timeout=5)
        assert fresh.read_bytes("a.pt") == b"x" * 5000
        assert fresh.verify().ok
    finally:
        proxy.stop()
