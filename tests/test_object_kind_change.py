"""A file commit over a folder artifact of the same name, on object stores.

A file object and the keys of a folder under one name are separate objects there: moto, GCS and
Azure took the file and kept the old folder's keys forever (no record claims them, gc never saw
them); ``rclone serve s3``, which keeps a real folder tree, refused the upload (an internal
error) and from then on listed a phantom object over the folder's files, so the committed folder
read as missing. Such a replace is now refused with NameConflictError before anything is sent
(``Capabilities.file_over_folder``), the folder verifies as before (read through the backdoor),
and deleting the folder first, then committing the file, works. On a local store the same
replace stays one versioned commit (the capability is true there)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from commitstore import NameConflictError, open_store
from commitstore.testing import GcsBackdoor, LocalBackdoor, S3Backdoor, record_path

from .helpers.azurite import Azurite, azure_backdoor
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.s3servers import BUCKET, S3Server
from .helpers.serverfixture import module_server

azurite = module_server(Azurite, "azurite")
FILES = {"a.bin": b"a" * 100, "sub/b.bin": b"b" * 50}


def _store(kind: str, request: pytest.FixtureRequest) -> tuple[Any, Any]:
    prefix = f"kc{time.monotonic_ns()}"
    if kind in ("moto", "rclone"):
        s3: S3Server = request.getfixturevalue(kind)
        return open_store(s3.url(prefix), **s3.options()), S3Backdoor(s3.client(), BUCKET, prefix)
    if kind == "gcs":
        gcs: FakeGcs = request.getfixturevalue("gcs")
        door = GcsBackdoor(gcs.endpoint, GCS_BUCKET, prefix)
        return open_store(gcs.url(prefix), **gcs.options()), door
    az: Azurite = request.getfixturevalue("azurite")
    return open_store(az.url(prefix), **az.options()), azure_backdoor(az, prefix)


def _commit_folder(store: Any) -> None:
    with store.stage_dir("ck") as d:
        for rel, body in FILES.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)


@pytest.mark.parametrize("kind", ["moto", "rclone", "gcs", "azure"])
def test_a_file_over_a_folder_is_refused_before_anything_is_sent(
    kind: str, request: pytest.FixtureRequest
) -> None:
    store, door = _store(kind, request)
    assert store.describe()["capabilities"]["file_over_folder"] is False
    _commit_folder(store)
    record = door.read(record_path("ck"))
    with pytest.raises(NameConflictError, match="delete ck first"):
        store.put_bytes("ck", b"now a file", overwrite=True)
    with pytest.raises(NameConflictError), store.stage("ck", overwrite=True) as f:
        f.write(b"now a file")
    assert door.read("ck") is None, "the file object was sent"
    for rel, body in FILES.items():
        assert door.read(f"ck/{rel}") == body
    assert door.read(record_path("ck")) == record
    assert store.verify("ck", level="full").ok
    store.delete("ck")
    assert store.put_bytes("ck", b"now a file").kind == "file"
    assert door.read("ck") == b"now a file"
    assert store.verify("ck", level="full").ok


def test_a_file_over_a_folder_stays_one_commit_on_a_local_store(tmp_path: Path) -> None:
    store, door = open_store(tmp_path / "s"), LocalBackdoor(tmp_path / "s")
    assert store.describe()["capabilities"]["file_over_folder"] is True
    _commit_folder(store)
    assert store.put_bytes("ck", b"now a file", overwrite=True).kind == "file"
    assert door.read("ck") == b"now a file"
    assert store.verify("ck", level="full").ok
