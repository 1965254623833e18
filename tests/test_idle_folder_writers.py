"""A ``begin_folder`` writer on an object store that pauses between its files, with none open,
for longer than gc's ``min_age``: it is alive from ``begin_folder``/``join_folder`` until its
commit or abort (its marker is rewritten every ``heartbeat`` seconds all that time), so gc,
run several times during the pause, takes none of its files and the commit publishes both.

Before the writer's heartbeat covered the time between files, gc took the first file and its
marker once they were older than ``min_age``, and the commit failed (``a.bin: missing``).
Also: a dropped ``FolderWrite`` stops beating, so what it wrote is gc's once past ``min_age``;
a committed or aborted one brings no marker back."""

from __future__ import annotations

import gc as python_gc
import time
import uuid
from typing import Any

import pytest

from commitstore import CommitStore, open_store
from commitstore.testing import S3Backdoor

from .helpers.azurite import Azurite, azure_backdoor
from .helpers.s3servers import BUCKET, MotoServer
from .helpers.serverfixture import module_server

HEARTBEAT = 0.1
MIN_AGE = 2.0
"""S3 and Azure show modification times in whole seconds: ``min_age`` exceeds the heartbeat
by more than 1.5 s (``docs/guarantees.md``)."""
GC_RUNS = 3

azurite = module_server(Azurite, "azurite")


def make(kind: str, request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """(a function opening the same fresh store, its backdoor)."""
    sub = f"i{uuid.uuid4().hex[:12]}"
    if kind == "s3":
        moto: MotoServer = request.getfixturevalue("moto")
        url, opts = moto.url(sub), {**moto.options(), "heartbeat": HEARTBEAT}
        door: Any = S3Backdoor(moto.client(), BUCKET, sub)
    else:
        az: Azurite = request.getfixturevalue("azurite")
        url, opts = az.url(sub), {**az.options(), "heartbeat": HEARTBEAT}
        door = azure_backdoor(az, sub)

    def reopen() -> CommitStore:
        return open_store(url, **opts)

    return reopen, door


def bookkeeping(door: Any) -> set[str]:
    return {f for f in door.files() if f.startswith(".commitstore/folders/")}


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_an_idle_folder_writer_keeps_its_files_through_gc(
    kind: str, request: pytest.FixtureRequest
) -> None:
    reopen, door = make(kind, request)
    coordinator, other = reopen(), reopen()
    fw = coordinator.begin_folder("eval/step_1")
    joined = other.join_folder(fw.token)
    first = fw.write_bytes("a.bin", b"first file " * 100)
    second = joined.write_bytes("part/c.bin", b"joined writer " * 50)
    written = {f for f in door.files() if f.startswith("eval/step_1/")}
    assert written == {"eval/step_1/a.bin", "eval/step_1/part/c.bin"}
    for _ in range(GC_RUNS):  # no file open in either writer all this time
        time.sleep(MIN_AGE)
        reopen().gc(min_age=MIN_AGE)
        left = {f for f in door.files() if f.startswith("eval/step_1/")}
        assert written <= left, f"gc took {sorted(written - left)} from a live writer"
    third = fw.write_bytes("sub/b.bin", b"second file")
    record = fw.commit([first, second, third])
    assert [f.path for f in record.files] == ["a.bin", "part/c.bin", "sub/b.bin"]
    fresh = reopen()
    assert fresh.verify("eval/step_1", level="full").ok
    assert door.read("eval/step_1/a.bin") == b"first file " * 100
    assert door.read("eval/step_1/part/c.bin") == b"joined writer " * 50
    assert door.read("eval/step_1/sub/b.bin") == b"second file"
    time.sleep(3 * HEARTBEAT)  # the committed writer's beat stopped; the joined one lives on
    assert all(f.count("/") == 3 for f in bookkeeping(door)), bookkeeping(door)
    joined.abort()  # stops its beat; a no-op on the files: the folder has its record
    time.sleep(3 * HEARTBEAT)
    assert bookkeeping(door) == set()
    assert fresh.verify("eval/step_1", level="full").ok


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_a_dropped_or_aborted_folder_write_stops_beating(
    kind: str, request: pytest.FixtureRequest
) -> None:
    reopen, door = make(kind, request)
    store = reopen()
    aborted = store.begin_folder("eval/aborted")
    aborted.write_bytes("a.bin", b"x")
    aborted.abort()
    time.sleep(3 * HEARTBEAT)
    assert bookkeeping(door) == set(), "an aborted write's marker came back"
    dropped = store.begin_folder("eval/dropped")
    dropped.write_bytes("a.bin", b"y")
    del dropped
    python_gc.collect()
    time.sleep(3 * HEARTBEAT)
    time.sleep(MIN_AGE + 0.5)
    reopen().gc(min_age=MIN_AGE)
    assert "eval/dropped/a.bin" not in door.files(), "a dropped write is still beating"
    assert bookkeeping(door) == set()
