"""Writers that pause longer than gc's ``min_age`` while gc runs, on every backend the suite
has servers for: local disk, a FUSE bridge, Samba, S3 (moto and ``rclone serve s3``), GCS
(fake-gcs-server) and Azure (Azurite).

A forked writer (``commitstore.testing.pausing``) stages a file (``stage``) or a folder
(``stage_dir``, ``begin_folder``), pauses past ``min_age`` while gc runs several times (object
stores: heartbeats every 0.1 s, ``min_age`` 0.5 s), then resumes and commits: gc removed none
of what it had staged (judged through the backdoor) and the committed artifact is exactly what
it wrote. When its staging is removed by a hostile actor instead (not gc), the commit fails
with a typed error and publishes nothing: the name keeps its old version."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store
from commitstore.testing import GcsBackdoor, LocalBackdoor, S3Backdoor, Target, record_path
from commitstore.testing.pausing import HOWS, PausingWriter, Plan, Version, is_typed, staged_state

from .helpers.azurite import Azurite, azure_backdoor
from .helpers.fusemount import FaultMount
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.s3servers import BUCKET, S3Server
from .helpers.samba import PASSWORD, SambaServer
from .helpers.serverfixture import module_server

MIN_AGE = 0.5
"""gc's ``min_age`` here; object-store writers beat every :data:`HEARTBEAT` seconds."""
WHOLE_SECONDS = {"s3", "rclone", "azure"}
"""Stores whose modification times are whole seconds: a heartbeat written at 10.9 s shows 10 s.
gc allows for it (``Capabilities.mtime_resolution``), so the same ``min_age`` holds there."""
HEARTBEAT = 0.1
GC_RUNS = 3
"""gc runs during one pause, each after sleeping ``MIN_AGE``: the writer's staging is older
than ``min_age`` (by its first write) from the first run on."""
ROUNDS = 2
"""Pauses per backend and way of staging in the default run (more under soak)."""
SOAK_ROUNDS = 12
MiB = 1024 * 1024

KINDS = ["local", "bridge", "smb", "s3", "rclone", "gcs", "azure"]
OBJECT = {"s3", "rclone", "gcs", "azure"}

mount = module_server(FaultMount, "mount", attr_timeout=0)
samba = module_server(SambaServer, "samba")
azurite = module_server(Azurite, "azurite")


def make_target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """A fresh, empty store on ``kind``; object stores beat every ``HEARTBEAT`` seconds and
    upload a file in parts from its first bytes on (so a paused ``stage`` holds an upload)."""
    sub = f"p{uuid.uuid4().hex[:12]}"
    if kind == "local":
        root = tmp_path / sub
        return Target(open_store(root), LocalBackdoor(root), lambda: open_store(root))
    if kind == "bridge":
        mnt: FaultMount = request.getfixturevalue("mount")
        url = str(mnt.mnt / sub)
        return Target(open_store(url), LocalBackdoor(mnt.backing / sub), lambda: open_store(url))
    if kind == "smb":
        smb: SambaServer = request.getfixturevalue("samba")
        url = smb.url(sub)
        return Target(
            open_store(url, password=PASSWORD),
            LocalBackdoor(smb.share_dir / sub),
            lambda: open_store(url, password=PASSWORD),
        )
    opts: dict[str, Any]
    door: Any
    if kind in ("s3", "rclone"):
        s3: S3Server = request.getfixturevalue("moto" if kind == "s3" else kind)
        url = s3.url(sub)
        probe: Any = open_store(url, **s3.options())._committer.backend
        opts = {**s3.options(), "conditional_writes": probe.conditional_writes()}
        opts.update(single_put_max=0, part_size=5 * MiB)
        door = S3Backdoor(s3.client(), BUCKET, sub)
    elif kind == "gcs":
        gcs: FakeGcs = request.getfixturevalue("gcs")
        url, opts = gcs.url(sub), {**gcs.options(), "chunk_size": 256 * 1024}
        door = GcsBackdoor(gcs.endpoint, GCS_BUCKET, sub)
    else:
        az: Azurite = request.getfixturevalue("azurite")
        url, opts = az.url(sub), {**az.options(), "block_size": 256 * 1024}
        door = azure_backdoor(az, sub)
    opts["heartbeat"] = HEARTBEAT
    return Target(open_store(url, **opts), door, lambda: open_store(url, **opts))


def head_size(kind: str) -> int:
    """Bytes staged before the pause: past one part on object stores (S3's 5 MiB minimum)."""
    return {"s3": 5 * MiB + 1, "rclone": 5 * MiB + 1, "gcs": MiB, "azure": MiB}.get(kind, 4096)


def plan_for(kind: str, how: str, rnd: int) -> Plan:
    """Round ``rnd``'s plan: a name with an old version (``stage``, ``stage_dir``: overwritten)
    or a new one (``begin_folder``: object stores take new names only)."""
    head = bytes([rnd % 251]) * head_size(kind) + f"{how} {rnd} head".encode()
    tail = f"{how} round {rnd} tail ".encode() * 100
    return Plan(f"runs/{how}_{rnd}", how, head, tail, overwrite=how != "begin_folder")


def read_back(t: Target, plan: Plan) -> Version | None:
    """What the name holds, read through the backdoor (a folder: the files its record names)."""
    if plan.how == "stage":
        return t.door.read(plan.name)
    if t.door.read(record_path(plan.name)) is None:
        return None
    prefix = plan.name + "/"
    return tuple(
        (f[len(prefix) :], t.door.read(f) or b"")
        for f in sorted(t.door.files())
        if f.startswith(prefix)
    )


OLD = b"the old version"


def old_version(plan: Plan) -> Version:
    """What the name holds before the writer's commit (an old version of the same kind)."""
    return OLD if plan.how == "stage" else (("a.bin", OLD),)


def start(t: Target, plan: Plan) -> PausingWriter:
    if plan.how == "stage":
        t.store.put_bytes(plan.name, OLD)
    elif plan.overwrite:
        with t.store.stage_dir(plan.name) as d:
            (d / "a.bin").write_bytes(OLD)
    return PausingWriter(t, plan)


def check_committed(t: Target, plan: Plan) -> None:
    assert read_back(t, plan) == plan.version(), f"{plan.name}: not what the writer wrote"
    fresh = t.reopen()
    assert fresh.verify(plan.name, level="full").ok
    if plan.how == "stage":
        assert fresh.read_bytes(plan.name) == plan.version()


def pause_through_gc(kind: str, how: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    t = make_target(kind, request, tmp_path)
    min_age = MIN_AGE
    for rnd in range(ROUNDS if "soak" not in request.keywords else SOAK_ROUNDS):
        plan = plan_for(kind, how, rnd)
        writer = start(t, plan)
        try:
            staged = staged_state(t.door, plan.name)
            for _ in range(GC_RUNS):
                time.sleep(min_age)
                t.reopen().gc(min_age=min_age)
                left = staged_state(t.door, plan.name)
                assert staged <= left, f"round {rnd}: gc took {sorted(staged - left)}"
            if plan.overwrite:
                assert read_back(t, plan) == old_version(plan)
            error = writer.resume()
        finally:
            writer.kill()
        assert error is None, f"round {rnd}: the resumed writer raised {error}"
        check_committed(t, plan)
    t.reopen().gc(min_age=0)
    assert t.reopen().verify(level="full").ok


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_paused_writer_keeps_its_staging_through_gc_and_commits_what_it_wrote(
    kind: str, how: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    pause_through_gc(kind, how, request, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("kind", KINDS)
def test_paused_writers_soak(
    kind: str, how: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    pause_through_gc(kind, how, request, tmp_path)


# -- a hostile actor (not gc) removes the staging ---------------------------------------------
def remove_staging(kind: str, t: Target, writer: PausingWriter) -> list[str]:
    """Remove what ``writer`` staged, as another tool would: its local folder (``stage_dir``,
    and ``begin_folder`` where it stages locally), else its staging files, unfinished uploads,
    uploaded files and markers on the storage. What was removed."""
    if writer.local_path:
        shutil.rmtree(writer.local_path)
        return [writer.local_path]
    gone = []
    for f in sorted(staged_state(t.door, writer.plan.name)):
        if "/.commitstore/pending/" in f or f.startswith(".commitstore/pending/"):
            continue  # nobody committing: no pending record is this writer's
        t.door.remove(f)
        gone.append(f)
    if kind in ("s3", "rclone"):
        door: Any = t.door
        listed = door.client.list_multipart_uploads(Bucket=door.bucket, Prefix=door.prefix + "/")
        for up in listed.get("Uploads", []):
            try:
                door.client.abort_multipart_upload(
                    Bucket=door.bucket, Key=up["Key"], UploadId=up["UploadId"]
                )
            except door.client.exceptions.NoSuchUpload:
                # the writer's heartbeat (a small marker, sent in parts here) completed it
                # between the listing and the abort
                continue
            gone.append(f"upload {up['Key']}")
    return gone


HOSTILE = [
    (kind, how)
    for kind in KINDS
    for how in HOWS
    if not (how == "stage" and kind in ("gcs", "azure"))
    # GCS resumable sessions and Azure uncommitted blocks are not objects: nothing to remove
]


@pytest.mark.parametrize(("kind", "how"), HOSTILE)
def test_staging_removed_under_a_paused_writer_fails_its_commit_typed(
    kind: str, how: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    t = make_target(kind, request, tmp_path)
    plan = plan_for(kind, how, 0)
    writer = start(t, plan)
    try:
        gone = remove_staging(kind, t, writer)
        assert gone, "nothing staged to remove"
        error = writer.resume()
    finally:
        writer.kill()
    assert error is not None, f"committed after {gone} was removed"
    assert is_typed(error), f"untyped error {error}"
    fresh = t.reopen()
    if plan.overwrite:
        assert read_back(t, plan) == old_version(plan)
    else:
        assert t.door.read(record_path(plan.name)) is None
        assert plan.name not in {r.name for r in fresh.list()}
    assert fresh.verify(level="full").ok
