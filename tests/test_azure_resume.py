"""Azure uploads of a local file that resume after the writer was SIGKILLed (Azurite).

A writer subprocess ``put_file``s a file through a slowed proxy, one block at a time; once the
backdoor lists enough uncommitted blocks the proxy stops forwarding and the writer is killed (no
sleep is the timing). The next ``put_file`` goes through a proxy that counts the bytes sent.
Assertions read the container through the backdoor (azure-storage-blob).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store
from commitstore.backends.object.azure.resume import block_id
from commitstore.testing import AzureBackdoor, Target, record_path

from .helpers import resumekill
from .helpers.azurite import ACCOUNT, KEY, Azurite, azure_backdoor
from .helpers.faultproxy import FaultProxy
from .helpers.resumekill import NAME, kill_when_landed, random_file, read_state

MiB = 1024 * 1024
SIZE = 30 * MiB
BLOCK = 5 * MiB
BLOCKS = SIZE // BLOCK
LANDED = 5  # the kill comes once 5 of the 6 blocks landed (~83%)
OVERHEAD = 2 * MiB  # requests' headers, the state, the record, the pending records


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        server.stop()


def via(port: int) -> str:
    """The connection string of the emulator's account, reached through 127.0.0.1:``port``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};"
    )


@pytest.fixture
def t(azurite: Azurite) -> Target:
    prefix = f"t{time.monotonic_ns()}"
    opts: dict[str, Any] = {**azurite.options(), "block_size": BLOCK}
    url = azurite.url(prefix)
    return Target(
        open_store(url, **opts), azure_backdoor(azurite, prefix), lambda: open_store(url, **opts)
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return random_file(tmp_path / "source.bin", SIZE)


def door(t: Target) -> AzureBackdoor:
    assert isinstance(t.door, AzureBackdoor)
    return t.door


def staged(t: Target, name: str = NAME) -> list[tuple[str, int]]:
    """The uncommitted blocks of ``name`` on the server: (ID, size)."""
    from azure.core.exceptions import ResourceNotFoundError

    blob = door(t).container.get_blob_client(f"{door(t).prefix}/{name}")
    try:
        _committed, uncommitted = blob.get_block_list("uncommitted")
    except ResourceNotFoundError:  # no block staged yet
        return []
    return [(str(b.id), int(b.size)) for b in uncommitted]


def states(t: Target) -> list[str]:
    return resumekill.states(door(t))


def kill_mid_upload(azurite: Azurite, t: Target, src: Path) -> None:
    """Run a ``put_file`` writer of ``src`` as ``NAME`` through a slowed proxy, one block at a
    time; once ``LANDED`` blocks are on the server the proxy stops forwarding and the writer is
    SIGKILLed. Nothing is published; the state is on the target."""
    slow = FaultProxy(azurite.port)
    slow.set(delay=0.005, faulty=None)
    options = {"connection_string": via(slow.port), "block_size": BLOCK, "max_inflight": 1}
    env = {"WRITER_STORE_OPTIONS": json.dumps(options)}
    landed = kill_when_landed(
        t.store.url,
        src,
        env,
        slow=slow,
        landed=lambda: len(staged(t)),
        goal=LANDED,
        timeout=60,
        poll=0.02,
    )
    assert landed >= LANDED, f"only {landed} blocks landed"
    assert door(t).read(NAME) is None
    assert door(t).read(record_path(NAME)) is None
    assert len(staged(t)) < BLOCKS
    assert len(states(t)) == 1


def put_counted(azurite: Azurite, t: Target, src: Path, *, overwrite: bool = True) -> int:
    """``put_file`` of ``src`` as ``NAME`` in this process, through a proxy that counts the
    bytes sent; returns them. The commit is byte-identical to ``src`` and verifies in full, and
    no state is left."""
    proxy = FaultProxy(azurite.port)
    try:
        store = open_store(t.store.url, connection_string=via(proxy.port), block_size=BLOCK)
        record = store.put_file(NAME, src, overwrite=overwrite)
        assert record.size == SIZE
        sent = proxy.received
    finally:
        proxy.stop()
    assert door(t).read(NAME) == src.read_bytes()  # byte-identical to the source
    report = t.reopen().verify(NAME)
    assert report.ok, report
    assert states(t) == []
    return sent


@pytest.mark.parametrize("overwrite", [True, False], ids=["replace", "create-only"])
def test_resume_sends_only_the_missing_blocks(
    azurite: Azurite, t: Target, source: Path, overwrite: bool
) -> None:
    kill_mid_upload(azurite, t, source)
    state = json.loads(door(t).read(states(t)[0]) or b"")
    assert state["blob"].endswith(NAME) and state["block_size"] == BLOCK
    sent = put_counted(azurite, t, source, overwrite=overwrite)
    assert sent <= SIZE // 4 + OVERHEAD, f"{sent} bytes sent to resume"


def test_changed_source_starts_over(azurite: Azurite, t: Target, source: Path) -> None:
    kill_mid_upload(azurite, t, source)
    data = bytearray(source.read_bytes())
    data[BLOCK + 7] ^= 0xFF  # a byte in an uploaded block; the same size
    source.write_bytes(bytes(data))
    sent = put_counted(azurite, t, source)
    assert sent >= SIZE  # every block sent again
    assert door(t).read(NAME) == bytes(data)


def test_a_block_rewritten_in_place_is_sent_again(
    azurite: Azurite, t: Target, source: Path
) -> None:
    """The source rewritten in a staged block, away from its first and last MiB, its mtime
    kept: its identity (and the state) still match, but that block's bytes are no longer the
    ones the server holds under its ID, so it is staged again; the others are reused."""
    kill_mid_upload(azurite, t, source)
    stat = source.stat()
    with source.open("r+b") as f:
        f.seek(BLOCK + 7)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x5A]))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    sent = put_counted(azurite, t, source)
    assert 2 * BLOCK <= sent <= 2 * BLOCK + SIZE // 4 + OVERHEAD, sent


def _garbage(state: dict[str, Any], t: Target) -> bytes:
    return b'{"schema": "commitstore.resume.azure/1", "blocks": [tr'


def _wrong_block_ids(state: dict[str, Any], t: Target) -> bytes:
    # well-formed IDs of the right part numbers, naming bytes of another MD5
    state["blocks"] = {n: block_id(int(n), b"\xff" * 16) for n in state["blocks"]}
    return json.dumps(state).encode()


def _foreign_block_ids(state: dict[str, Any], t: Target) -> bytes:
    # IDs listed under another part number's
    state["blocks"] = {str(int(n) + 1): ident for n, ident in state["blocks"].items()}
    return json.dumps(state).encode()


def _other_name(state: dict[str, Any], t: Target) -> bytes:
    # another name's state, whose blob holds the same first block's bytes
    other = f"{door(t).prefix}/other.pt"
    first = Path(state["__source"]).read_bytes()[:BLOCK]
    md5 = hashlib.md5(first, usedforsecurity=False).digest()
    blob = door(t).container.get_blob_client(other)
    blob.stage_block(block_id(1, md5), first, transactional_content_md5=md5)
    state.pop("__source")
    state["name"], state["blob"] = "other.pt", other
    state["blocks"] = {"1": block_id(1, md5)}
    return json.dumps(state).encode()


@pytest.mark.parametrize(
    "hostile",
    [_garbage, _wrong_block_ids, _foreign_block_ids, _other_name],
    ids=lambda f: f.__name__,
)
def test_hostile_state_never_commits_bad_bytes(
    azurite: Azurite, t: Target, source: Path, hostile: Any
) -> None:
    kill_mid_upload(azurite, t, source)
    where, state = read_state(door(t), source)
    door(t).write(where, hostile(state, t))
    sent = put_counted(azurite, t, source)
    if hostile is _wrong_block_ids:
        assert sent >= SIZE * (LANDED - 1) // BLOCKS  # the blocks it lists are sent again
    else:  # a state that does not parse, or another name's: every block is sent
        assert sent >= SIZE
    if hostile is _other_name:  # the other name's blob is never touched
        assert len(staged(t, "other.pt")) == 1
        assert door(t).read("other.pt") is None


def test_gc_removes_the_state(azurite: Azurite, t: Target, source: Path) -> None:
    """gc ages an Azure upload's state alone (its uncommitted blocks expire on the server)."""
    kill_mid_upload(azurite, t, source)
    assert t.reopen().gc().removed == ()  # younger than an hour
    assert len(states(t)) == 1
    report = t.reopen().gc(min_age=0)
    kinds = sorted(i.kind for i in report.removed if i.kind != "pending")
    assert kinds == ["resume"], report
    assert states(t) == []
    sent = put_counted(azurite, t, source)  # starts over cleanly
    assert sent >= SIZE


@pytest.mark.parametrize("fault", ["cut_after", "reset_after"])
def test_blocks_sent_from_the_file_are_retried(
    azurite: Azurite, t: Target, source: Path, fault: str
) -> None:
    """Two connections broken mid-block: the SDK sends those blocks again, read again from the
    file, and the commit is exactly the file's bytes."""
    proxy = FaultProxy(azurite.port)
    try:
        store = open_store(
            t.store.url,
            connection_string=via(proxy.port),
            block_size=BLOCK,
            client_options={"retry_total": 3, "initial_backoff": 0.2, "increment_base": 0},
        )
        proxy.set(**{fault: 2 * MiB}, faulty=2)
        store.put_file(NAME, source)
        assert proxy.faulted == 2
    finally:
        proxy.stop()
    assert door(t).read(NAME) == source.read_bytes()
    assert t.reopen().verify(NAME).ok
    assert states(t) == []


@pytest.mark.parametrize("whole", [False, True], ids=["blocks", "put-blob"])
def test_a_body_garbled_on_the_way_is_refused(
    azurite: Azurite, t: Target, source: Path, whole: bool
) -> None:
    """One bit flipped in transit (TCP did not catch it): the server refuses the body for its
    Content-MD5, and nothing is published (before, the blob was committed with the bad bytes
    and only a later verify found them)."""
    from commitstore import CommitStoreError

    size = BLOCK // 2 if whole else SIZE
    proxy = FaultProxy(azurite.port)
    try:
        store = open_store(
            t.store.url,
            connection_string=via(proxy.port),
            block_size=BLOCK,
            client_options={"retry_total": 0},
        )
        proxy.set(flip_every=BLOCK // 3, flips=1, faulty=None)
        with pytest.raises(CommitStoreError):
            store.put_bytes(NAME, source.read_bytes()[:size])
    finally:
        proxy.stop()
    assert door(t).read(NAME) is None
    assert door(t).read(record_path(NAME)) is None
