"""The multi-process state machine (``commitstore.testing.crashmachine``) on local disk, a FUSE
bridge (the project's fault filesystem), Samba, S3 (moto and ``rclone serve s3``) and GCS
(fake-gcs-server): writers forked from the test process and SIGKILLed mid-commit or
mid-upload (then resumed), two writers of one name at once (S3), writers pausing past gc's
``min_age`` while gc runs, deletes, prunes, gc and bit flips, checked against a model. A few
examples per target in the default run, many more under soak."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitError, open_store
from commitstore.testing import GcsBackdoor, LocalBackdoor, S3Backdoor, Target, pending_paths
from commitstore.testing.crashmachine import run_crash_machine

from .helpers.fusemount import FaultMount
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.s3servers import BUCKET, S3Server
from .helpers.samba import PASSWORD, SambaServer
from .helpers.serverfixture import module_server

Factory = Callable[[], Target]


mount = module_server(FaultMount, "mount", attr_timeout=0)


samba = module_server(SambaServer, "samba")


def local_targets(base: Path) -> Factory:
    def make() -> Target:
        root = base / uuid.uuid4().hex[:12]
        return Target(open_store(root), LocalBackdoor(root), lambda: open_store(root))

    return make


def bridge_targets(mount: FaultMount) -> Factory:
    def make() -> Target:
        sub = f"m{uuid.uuid4().hex[:12]}"
        url = str(mount.mnt / sub)
        store = open_store(url)
        assert store.describe()["strategy"] == "bridge-checked"
        return Target(store, LocalBackdoor(mount.backing / sub), lambda: open_store(url))

    return make


def smb_targets(samba: SambaServer) -> Factory:
    def make() -> Target:
        sub = f"m{uuid.uuid4().hex[:12]}"
        url = samba.url(sub)
        return Target(
            open_store(url, password=PASSWORD),
            LocalBackdoor(samba.share_dir / sub),
            lambda: open_store(url, password=PASSWORD),
        )

    return make


HEARTBEAT = 0.1
"""Object-store writers' heartbeat here (pausing writers outlive gc's ``min_age`` by it)."""
PAUSE_MIN_AGE = {"local": 0.3, "bridge": 0.3, "smb": 0.3, "s3": 1.7, "rclone": 1.7}
"""gc's ``min_age`` while a writer pauses (rule ``pausing_writer``): on S3 the times are whole
seconds, so it exceeds the heartbeat by more than 1.5 s (``docs/guarantees.md``)."""


MiB = 1024 * 1024


def s3_targets(
    server: S3Server, *, heartbeat: float | None = HEARTBEAT, small_parts: bool = False
) -> Factory:
    """Fresh S3 stores on ``server``; writers beat every ``heartbeat`` seconds (None: the
    default, 60 s, so a paused writer's heartbeat never rewrites its pending record while the
    machine looks). ``small_parts``: files above 5 MiB go in parts of 5 MiB (S3's smallest),
    so a ``put_file`` of a few parts takes 11 MiB."""
    probe: Any = open_store(server.url("probe"), **server.options())._committer.backend
    conditional = probe.conditional_writes()  # moto honours them, rclone serve s3 does not

    def make() -> Target:
        prefix = f"m{time.monotonic_ns()}"
        url = server.url(prefix)
        opts = {**server.options(), "conditional_writes": conditional}
        if heartbeat is not None:
            opts["heartbeat"] = heartbeat
        if small_parts:
            opts.update(part_size=5 * MiB, single_put_max=5 * MiB)
        return Target(
            open_store(url, **opts),
            S3Backdoor(server.client(), BUCKET, prefix),
            lambda: open_store(url, **opts),
        )

    return make


def factory(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    if kind == "local":
        return local_targets(tmp_path)
    if kind == "bridge":
        return bridge_targets(request.getfixturevalue("mount"))
    if kind == "smb":
        return smb_targets(request.getfixturevalue("samba"))
    return s3_targets(request.getfixturevalue("moto" if kind == "s3" else kind))


KINDS = ["local", "bridge", "smb", "s3", "rclone"]
DEFAULT = {"local": (8, 10), "bridge": (3, 8), "smb": (2, 8), "s3": (3, 8), "rclone": (2, 8)}
"""(examples, steps) per target in the default run: a few seconds each."""
SOAK = {"local": (60, 20), "bridge": (30, 15), "smb": (30, 15), "s3": (12, 12), "rclone": (8, 12)}
"""(examples, steps) per target under soak (S3 on moto: about 25 ms a request)."""


@pytest.mark.parametrize("kind", KINDS)
def test_crash_machine(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    examples, steps = DEFAULT[kind]
    run_crash_machine(
        factory(kind, request, tmp_path),
        max_examples=examples,
        steps=steps,
        folder=True,  # on the bridge too: test_folder_overwrite_on_a_fuse_bridge
        pause_min_age=PAUSE_MIN_AGE[kind],
    )


@pytest.mark.soak
@pytest.mark.parametrize("kind", KINDS)
def test_crash_machine_soak(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    examples, steps = SOAK[kind]
    run_crash_machine(
        factory(kind, request, tmp_path),
        max_examples=examples,
        steps=steps,
        folder=True,
        pause_min_age=PAUSE_MIN_AGE[kind],
    )


def focused(kind: str, request: pytest.FixtureRequest, tmp_path: Path, *, rule: str) -> Factory:
    """Targets for a run of one rule: ``two_writers`` on S3 with the default heartbeat (a
    stopped writer's heartbeat would rewrite its pending record while the machine looks)."""
    if kind in ("s3", "rclone") and rule == "two_writers":
        return s3_targets(request.getfixturevalue("moto" if kind == "s3" else kind), heartbeat=None)
    return factory(kind, request, tmp_path)


FOCUSED = {"two_writers": (2, 4), "pausing_writer": (2, 3)}
"""(examples, steps) of a run of one rule in the default run (each step forks writers; a
pausing one outlives gc's ``min_age``, 2.7 s on S3); the planted bugs below are caught at these
sizes, and soak runs many more."""
FOCUSED_SOAK = {"two_writers": (25, 8), "pausing_writer": (10, 6)}
"""(examples, steps) of a run of one rule under soak."""


def run_focused(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, *, rule: str, shrink: bool = True
) -> None:
    soak = "soak" in request.keywords
    examples, steps = (FOCUSED_SOAK if soak else FOCUSED)[rule]
    run_crash_machine(
        focused(kind, request, tmp_path, rule=rule),
        max_examples=examples,
        steps=steps,
        pause_min_age=PAUSE_MIN_AGE[kind],
        only=(rule,),
        shrink=shrink,
    )


@pytest.mark.parametrize("kind", ["s3", "rclone"])
def test_two_writers_of_one_name_in_the_machine(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Rule ``two_writers`` alone (Hypothesis draws a subset of the rules for each example, so
    in the full machine's few examples it may not come up): two writer processes overwrite
    one name, stopped and SIGKILLed at drawn points, or one resumed to its end; the name
    verifies as the old version or one of theirs, before and after gc, judged through the
    backdoor."""
    run_focused(kind, request, tmp_path, rule="two_writers")


@pytest.mark.parametrize("kind", KINDS)
def test_pausing_writers_in_the_machine(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Rule ``pausing_writer`` alone (killed ones leave their staging to the next): gc, run
    while a writer pauses past ``min_age``, takes nothing it staged; resumed, it commits what
    it wrote."""
    run_focused(kind, request, tmp_path, rule="pausing_writer")


@pytest.mark.soak
@pytest.mark.parametrize(
    ("kind", "rule"),
    [("s3", "two_writers"), ("rclone", "two_writers")]
    + [(kind, "pausing_writer") for kind in KINDS],
)
def test_focused_machines_soak(
    kind: str, rule: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    run_focused(kind, request, tmp_path, rule=rule)


RESUMED = ("killed_put_file", "resume_put_file", "gc")

GCS_CHUNK = 256 * 1024
"""The GCS stores' chunk size in the resumed-uploads run (the smallest GCS takes): a
``put_file`` of 13 chunks is about 3 MiB."""


def run_resumed(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The run of rules :data:`RESUMED`; the first failing example is reported as found (each
    shrink step sends megabytes)."""
    if kind in ("s3", "rclone"):
        make = s3_targets(
            request.getfixturevalue("moto" if kind == "s3" else kind), small_parts=True
        )
    elif kind == "gcs":
        make = gcs_targets(request.getfixturevalue("gcs"), chunk_size=GCS_CHUNK)
    else:
        make = factory(kind, request, tmp_path)
    if "soak" in request.keywords:
        examples, steps = 12, 6
    else:  # on GCS: the fewest that reach a resume reusing chunks, and one that must not
        examples, steps = (3, 5) if kind == "gcs" else (4, 3)
    run_crash_machine(
        make, max_examples=examples, steps=steps, folder=False, only=RESUMED, shrink=False
    )


@pytest.mark.parametrize(
    "kind",
    [
        "s3",
        "rclone",
        "gcs",
        "local",
    ],
)
def test_resumed_uploads_in_the_machine(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Rules ``killed_put_file`` and ``resume_put_file`` (with gc): a ``put_file`` of three
    5 MiB-sized parts killed once a part landed (S3: the backdoor shows it) leaves the old
    version; the same ``put_file`` again (at once, after gc of the dead writer's state, or
    later; of the source as it was or rewritten in its middle with its mtime kept) commits the
    source's exact bytes. On GCS (fake-gcs-server, 256 KiB chunks) a ``put_file`` of 13
    chunks is killed once the resume state says 5 or 6 were acknowledged, or with a chunk in
    flight (which starts over), over an old version or a deleted name, with the same checks.
    On local disk the killed put_file only leaves the old version."""
    run_resumed(kind, request, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("kind", ["s3", "rclone", "gcs", "local"])
def test_resumed_uploads_in_the_machine_soak(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``test_resumed_uploads_in_the_machine`` with more and longer examples."""
    run_resumed(kind, request, tmp_path)


def test_the_resumed_uploads_machine_catches_a_wrong_part_reused(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The run of ``test_resumed_uploads_in_the_machine[s3]`` (same sizes, derandomized) fails
    when a resumed upload reuses every part the server holds without comparing its ETag and size
    with the bytes written now, nor checking them when the resume starts (planted in this
    process, where the machine resumes): the source rewritten in its middle, mtime kept, makes
    a held part no longer the source's."""
    from commitstore.backends.object.s3.upload import S3Upload

    def trusting(self: Any, number: int, md5: bytes, length: int) -> Any:
        if number not in self._held:
            return None
        self._given.pop(number, None)
        self._md5s[number] = md5
        self._done[number] = md5.hex()
        return {"PartNumber": number, "ETag": f'"{md5.hex()}"'}

    monkeypatch.setattr(S3Upload, "reuse", trusting)
    monkeypatch.setattr(S3Upload, "_all_match", staticmethod(lambda *_args: True))
    with pytest.raises((AssertionError, CommitError)):
        run_resumed("s3", request, tmp_path)


@pytest.mark.parametrize("bug", ["crc-list-trusted", "never-resumed"])
def test_the_resumed_uploads_machine_catches_a_gcs_resume_bug(
    bug: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The run of ``test_resumed_uploads_in_the_machine[gcs]`` (same sizes, derandomized) fails
    when (planted in this process, where the machine resumes) a resumed GCS upload trusts the
    CRC32C list of its state: the chunks below the offset neither checked against the source
    when the resume starts nor compared with the bytes written now (the source rewritten in
    its middle, mtime kept, makes a held chunk no longer the source's); or when no upload is
    ever resumed (every chunk is sent again)."""
    from commitstore.backends.object.gcs.upload import GcsUpload

    def trusting(self: Any, number: int, crc: str, length: int) -> int:
        if self._offset >= self._held:
            return 0
        skip = min(length, self._held - self._offset)
        self.reused_bytes += skip
        return int(skip)

    if bug == "crc-list-trusted":
        monkeypatch.setattr(GcsUpload, "_reused", trusting)
        monkeypatch.setattr(GcsUpload, "_all_match", lambda *_args: True)
    else:
        monkeypatch.setattr(GcsUpload, "_held_by", lambda *_args: -1)
    with pytest.raises((AssertionError, CommitError)):
        run_resumed("gcs", request, tmp_path)


def test_folder_overwrite_on_a_fuse_bridge(mount: FaultMount) -> None:
    t = bridge_targets(mount)()
    for data in (b"old", b"new"):
        with t.store.stage_dir("f/ckpt_4", overwrite=True) as d:
            (d / "a.bin").write_bytes(data)
    assert t.door.read("f/ckpt_4/a.bin") == b"new"


# -- the machine can fail: planted bugs, each caught at the default size -----------------------
def _no_newest_good_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """prune trusts sizes: a damaged newest artifact counts as the newest good one."""
    from commitstore.maintenance import prune

    monkeypatch.setattr(prune, "verify_newest", lambda store, listed: listed)


def _gc_drops_unfinished_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """gc takes the data of an unfinished commit (a pending record its record differs from)
    for garbage, and removes it before settling the pending record."""
    from commitstore._scan import read_record
    from commitstore.maintenance import gc
    from commitstore.records import decode_record

    settle = gc._settle

    def dropping(
        backend: Any, intent: tuple[str, ...], committed: Any, *, dry_run: bool
    ) -> str | None:
        pending = decode_record(backend.read_small(intent))
        parts = tuple(pending.name.split("/"))
        found = read_record(backend, parts)
        if pending.kind == "file" and (found is None or found.record != pending):
            backend.remove(parts)
        return settle(backend, intent, committed, dry_run=dry_run)

    monkeypatch.setattr(gc, "_settle", dropping)


def _record_before_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit writes the record first (instead of a pending record), then the data."""
    from commitstore import _commit
    from commitstore.backends import PutMode
    from commitstore.layout import record_parts
    from commitstore.records import encode_record

    commit = _commit.Committer.commit

    def record_first(
        self: Any, parts: Any, mode: Any, publish_data: Any, *, intent: Any = None, **kw: Any
    ) -> Any:
        if intent is None or {k for k, v in kw.items() if v is not None} - {"started"}:
            return commit(self, parts, mode, publish_data, intent=intent, **kw)
        with self.backend.publish_lock():
            _commit.put_small(
                self.backend, record_parts(parts), encode_record(intent), PutMode.REPLACE
            )
            return publish_data()[0]

    monkeypatch.setattr(_commit.Committer, "commit", record_first)


PLANTED = {
    "prune-without-newest-good-guard": (_no_newest_good_guard, "nothing verifies after maint"),
    "gc-drops-unfinished-data": (_gc_drops_unfinished_data, "does not verify|lost"),
    "record-before-data": (_record_before_data, "does not verify|lost"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_the_default_machine_catches(
    bug: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default-size local machine (derandomized: the same examples on every run) fails on
    each planted bug (the bug is installed in the test process, so forked writers have it)."""
    plant, message = PLANTED[bug]
    plant(monkeypatch)
    examples, steps = DEFAULT["local"]
    with pytest.raises(AssertionError, match=message):
        run_crash_machine(local_targets(tmp_path), max_examples=examples, steps=steps, shrink=False)


def _shared_pending_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every writer of a name writes its pending record to the same slot (one pending record
    per name on an object store: the second writer's can replace the first's after the
    first's data was published)."""
    from commitstore import _slots
    from commitstore.layout import slot_parts

    monkeypatch.setattr(_slots, "new_slot", lambda parts: slot_parts(parts, "0" * 16))


def _gc_ignores_live_local_writers(monkeypatch: pytest.MonkeyPatch) -> None:
    """gc does not see the lock a live local writer holds on its staging entry."""
    from commitstore.backends.rename.posix import _liveness

    monkeypatch.setattr(_liveness, "is_held", lambda folder, name: False)

    @contextlib.contextmanager
    def claimed(open_folder: Any, name: str) -> Iterator[str | None]:
        yield None

    monkeypatch.setattr(_liveness, "claimed", claimed)


def _object_writers_stop_beating(monkeypatch: pytest.MonkeyPatch) -> None:
    """Object-store writers rewrite their pending records and markers once an hour only."""
    from commitstore import _slots

    monkeypatch.setattr(_slots, "interval", lambda backend: 3600.0)


FOCUSED_PLANTED = {
    "two-writers-share-a-pending-slot": (_shared_pending_slot, "s3", "two_writers"),
    "gc-ignores-live-local-writers": (_gc_ignores_live_local_writers, "local", "pausing_writer"),
    "object-writers-stop-beating": (_object_writers_stop_beating, "s3", "pausing_writer"),
}


@pytest.mark.parametrize("bug", sorted(FOCUSED_PLANTED))
def test_the_focused_machines_catch(
    bug: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The runs of ``test_two_writers_of_one_name_in_the_machine`` and
    ``test_pausing_writers_in_the_machine`` (same sizes, derandomized) fail on a planted bug
    (installed in the test process: the forked writers have it too)."""
    plant, kind, rule = FOCUSED_PLANTED[bug]
    plant(monkeypatch)
    with pytest.raises(AssertionError, match=r"no version verifies|match neither|gc took"):
        run_focused(kind, request, tmp_path, rule=rule, shrink=False)


def _recorded_size(t: Target) -> int:
    """The size in the record of ``s_1``, read from the raw record file (not through the API)."""
    raw = t.door.read(".commitstore/records/.commitstore.rec.s_1.json")
    assert raw is not None
    return int(json.loads(raw)["size"])


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_pending_record_is_not_replaced_while_it_is_what_verifies(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Found by the local soak machine: a writer killed after its data step leaves the pending
    record that makes the new data verify; a second writer of the same name, killed before its
    own data step, must not leave data that neither record nor pending record describes. The
    second commit makes the first one's pending record the record before writing its own."""
    from commitstore.testing.crashwriter import crash_commit

    t = factory(kind, request, tmp_path)()
    t.store.put_bytes("s_1", b"\x00")
    assert crash_commit(t, "s_1", b"\x00\x00", "before-record")
    assert t.store.read_bytes("s_1") == b"\x00\x00"  # the pending record makes it the new one
    assert _recorded_size(t) == 1  # the record itself is still the old one
    assert crash_commit(t, "s_1", b"\x01", "before-data")
    assert t.door.read("s_1") == b"\x00\x00"  # the second writer published nothing
    if kind == "local":  # one pending slot, under the publish lock: made the record first
        assert _recorded_size(t) == 2  # the version that verifies has its record
    else:  # a slot per writer (no lock): the first writer's slot still describes the data
        sizes = [
            json.loads(t.door.read(p) or b"{}").get("size") for p in pending_paths(t.door, "s_1")
        ]
        assert _recorded_size(t) == 2 or 2 in sizes, sizes
    assert t.reopen().verify("s_1", level="full").ok


def gcs_targets(server: FakeGcs, *, chunk_size: int | None = None) -> Factory:
    """Fresh GCS stores on fake-gcs-server; ``chunk_size``: their chunk size (the default
    when None)."""
    opts = {**server.options(), **({} if chunk_size is None else {"chunk_size": chunk_size})}

    def make() -> Target:
        sub = f"m{time.monotonic_ns()}"
        url = server.url(sub)
        return Target(
            open_store(url, **opts),
            GcsBackdoor(server.endpoint, GCS_BUCKET, sub),
            lambda: open_store(url, **opts),
        )

    return make


@pytest.mark.parametrize("kind", ["local", "s3", "gcs"])
def test_scrub_in_the_machine(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Rule ``scrub_repairs`` alone: damage a copy on the store, on a local mirror of it or on
    both, scrub; one side's damage is repaired from the other, both sides' is reported, nothing
    else changes (local disk, S3 on moto, fake-gcs-server)."""
    make = (
        gcs_targets(request.getfixturevalue("gcs"))
        if kind == "gcs"
        else factory(kind, request, tmp_path)
    )
    run_crash_machine(make, max_examples=3, steps=4, folder=False, only=("scrub_repairs",))
