"""Two processes replacing one folder artifact on an object store at once, stepped exactly:
the interleaving the crash machine's two-writers rule found in its soak run (``two_writers`` on
``f/ckpt_4``: the first stopped at ``mid-copy``, the second ran to the end, the first was
resumed), and the one where both stop mid-copy and finish one after the other.

Writer A stages its whole new version and copies its first file over the final key, then
waits; writer B replaces the folder (its staged copy, its copies, its record); then A copies
the rest of its files and writes its record. Without a check that the final keys are still
its own, A left B's first file beside its others, deleted its staged copy, and neither record
nor pending record described the mix: no version of the name verified. A replace now lists
the final keys after its copies and copies again what another writer replaced, before its
staged copy goes. Run on both S3 implementations (tags are ETags), GCS (generations) and
Azure (ETags that change on every write)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from commitstore import open_store
from commitstore.testing import GcsBackdoor, S3Backdoor, Target
from commitstore.testing.crashmachine import read_version
from commitstore.testing.crashwriter import FOLDER, Writer, folder_files

from .helpers.azurite import Azurite, azure_backdoor
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.s3servers import BUCKET, S3Server
from .helpers.serverfixture import module_server

azurite = module_server(Azurite, "azurite")
KINDS = ["moto", "rclone", "gcs", "azure"]


def _target(kind: str, request: pytest.FixtureRequest) -> Target:
    prefix = f"tf{time.monotonic_ns()}"
    opts: dict[str, Any]
    door: Any
    if kind in ("moto", "rclone"):
        s3: S3Server = request.getfixturevalue(kind)
        url = s3.url(prefix)
        probe: Any = open_store(url, **s3.options())._committer.backend
        opts = {**s3.options(), "conditional_writes": probe.conditional_writes()}
        door = S3Backdoor(s3.client(), BUCKET, prefix)
    elif kind == "gcs":
        gcs: FakeGcs = request.getfixturevalue("gcs")
        url, opts = gcs.url(prefix), gcs.options()
        door = GcsBackdoor(gcs.endpoint, GCS_BUCKET, prefix)
    else:
        az: Azurite = request.getfixturevalue("azurite")
        url, opts = az.url(prefix), az.options()
        door = azure_backdoor(az, prefix)
    t = Target(open_store(url, **opts), door, lambda: open_store(url, **opts))
    with t.store.stage_dir(FOLDER) as d:
        for rel, body in folder_files(b"old"):
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)
    return t


def _settled(t: Target) -> None:
    fresh = t.reopen()
    assert fresh.verify(FOLDER, level="full").ok, "no version verifies"
    assert read_version(fresh, FOLDER) in (folder_files(b"AAAA"), folder_files(b"BB"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_replace_resumed_after_another_completed_leaves_a_version(
    kind: str, request: pytest.FixtureRequest
) -> None:
    t = _target(kind, request)
    a = Writer(t, FOLDER, b"AAAA", "mid-copy")
    b: Any = None
    try:
        assert a.state == "stopped"
        b = Writer(t, FOLDER, b"BB", "finish")
        assert b.state == "done"
        assert a.resume() == "done"
    finally:
        a.kill()
        if b is not None:
            b.kill()
    _settled(t)


@pytest.mark.parametrize("kind", KINDS)
def test_two_folder_replaces_both_stopped_mid_copy_leave_a_version(
    kind: str, request: pytest.FixtureRequest
) -> None:
    t = _target(kind, request)
    a = Writer(t, FOLDER, b"AAAA", "mid-copy")
    b: Any = None
    try:
        assert a.state == "stopped"
        b = Writer(t, FOLDER, b"BB", "mid-copy")
        assert b.state == "stopped"
        assert a.resume() == "done"
        assert b.resume() == "done"
    finally:
        a.kill()
        if b is not None:
            b.kill()
    _settled(t)
