"""gc removes only what it can show a dead writer owns, by the exact file list a pending
record or marker names, never by prefix, never a file a committed record names, and never
anything a live writer holds, whatever its age (issue 22, findings 4, 5, 9, 10).

Every assertion on storage goes through the backdoor (``commitstore.testing``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store
from commitstore.digest import manifest_digest
from commitstore.records import FileRecord, Record, encode_record
from commitstore.testing import LocalBackdoor, S3Backdoor, record_path, xxh

from .helpers.s3servers import BUCKET, MotoServer

Opened = tuple[Any, Any, Callable[[], Any]]


def _local(tmp_path: Path) -> Opened:
    root = tmp_path / "store"
    return open_store(str(root)), LocalBackdoor(root), lambda: open_store(str(root))


def _s3(moto: MotoServer) -> Opened:
    prefix = f"g{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    return (
        open_store(url, **opts),
        S3Backdoor(moto.client(), BUCKET, prefix),
        lambda: open_store(url, **opts),
    )


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Opened:
    if request.param == "local":
        return _local(tmp_path)
    return _s3(request.getfixturevalue("moto"))


def pending_path(name: str) -> str:
    return record_path(name).replace("/.commitstore.rec.", "/.commitstore.new.")


def planted_folder_record(name: str, files: dict[str, bytes], *, wrong: bool) -> bytes:
    """A pending record of folder ``name`` listing ``files`` (digests spoiled if ``wrong``)."""
    entries = tuple(
        FileRecord(p, len(b), "xxh3_128:" + ("0" * 32 if wrong else xxh(b)[9:]))
        for p, b in sorted(files.items())
    )
    return encode_record(
        Record(
            name=name,
            step=None,
            size=sum(f.size for f in entries),
            digest=manifest_digest((f.path, f.size, f.digest) for f in entries),
            files=entries,
            created=datetime(2020, 1, 1, tzinfo=timezone.utc),
            metadata={},
            kind="dir",
        )
    )


# -- finding 5: a planted pending record is untrusted -----------------------------------------
@pytest.mark.parametrize("wrong", [True, False])
def test_planted_pending_record_never_removes_a_committed_artifact(
    target: Opened, wrong: bool
) -> None:
    store, door, reopen = target
    store.put_bytes("runs/a.pt", b"committed a" * 50)
    store.put_bytes("runs/b.pt", b"committed b" * 50)
    files = {"a.pt": b"committed a" * 50, "b.pt": b"committed b" * 50}
    door.write(pending_path("runs"), planted_folder_record("runs", files, wrong=wrong))

    report = reopen().gc(min_age=0)

    assert door.read("runs/a.pt") == b"committed a" * 50
    assert door.read("runs/b.pt") == b"committed b" * 50
    assert door.read(record_path("runs/a.pt")) is not None
    assert door.read(record_path("runs")) is None, "a folder record over committed artifacts"
    assert reopen().verify().ok
    assert not any(i.path.startswith("runs/") for i in report.removed)


def test_planted_pending_record_removes_only_unrecorded_files_it_names(target: Opened) -> None:
    """A new folder's upload that stopped part way is rolled back by the exact list its pending
    record names: a file it does not name, or one a committed record names, stays."""
    store, door, reopen = target
    store.put_bytes("runs/kept.pt", b"kept" * 10)
    door.write("runs/x.bin", b"x" * 30)  # uploaded by the stopped commit
    door.write("runs/other.bin", b"o" * 30)  # not named by its pending record
    listed = {"x.bin": b"x" * 30, "y.bin": b"y" * 30, "kept.pt": b"kept" * 10}
    door.write(pending_path("runs"), planted_folder_record("runs", listed, wrong=False))

    reopen().gc(min_age=0)

    assert door.read("runs/kept.pt") == b"kept" * 10
    assert door.read("runs/other.bin") == b"o" * 30
    assert reopen().verify("runs/kept.pt").ok


# -- finding 4: a dead multi-writer folder's marker -------------------------------------------
def test_dead_folder_write_never_takes_a_later_artifact_under_its_name(moto: MotoServer) -> None:
    store, door, reopen = _s3(moto)
    fw = store.begin_folder("runs")
    fw.write_bytes("shard-0.bin", b"s0" * 40)  # then every writer dies: no commit, no abort
    store.put_bytes("runs/step_10.pt", b"ten" * 40)

    reopen().gc(min_age=0)

    assert door.read("runs/step_10.pt") == b"ten" * 40
    assert reopen().verify("runs/step_10.pt").ok
    assert door.read("runs/shard-0.bin") is None, "the dead write's own file is removed"
    assert not [f for f in door.files() if f.startswith(".commitstore/folders/")]


def test_dead_folder_marker_from_an_older_version_removes_no_file(moto: MotoServer) -> None:
    """A marker without a file list (written before markers listed their files) removes no
    file: only the marker goes."""
    store, door, reopen = _s3(moto)
    store.put_bytes("runs/step_10.pt", b"ten" * 40)
    door.write("runs/orphan.bin", b"o" * 10)
    marker = json.dumps({"name": "runs", "id": "0123456789abcdef"}).encode()
    door.write(".commitstore/folders/0123456789abcdef.json", marker)

    reopen().gc(min_age=0)

    assert door.read("runs/step_10.pt") == b"ten" * 40
    assert door.read("runs/orphan.bin") == b"o" * 10
    assert door.read(".commitstore/folders/0123456789abcdef.json") is None
