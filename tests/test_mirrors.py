"""Mirrors: one primary and mirrors on other kinds of storage share the same integrity semantics.

Every ordered (primary, mirror) pair of local, bridge (FUSE), SMB (Samba), S3 (moto) and GCS
(fake-gcs-server) runs the mirror clauses; assertions read both sides through backdoors.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, MirrorError, open_store
from commitstore.testing import (
    Backdoor,
    GcsBackdoor,
    LocalBackdoor,
    S3Backdoor,
    StoreConformance,
    Target,
    record_path,
    xxh,
)

from .helpers.faultproxy import FaultProxy
from .helpers.fusemount import FaultMount
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.s3servers import BUCKET, MotoServer
from .helpers.samba import PASSWORD, SambaServer

MiB = 1024 * 1024
ROOT_DIR = Path(__file__).resolve().parent.parent
KINDS = ["local", "bridge", "smb", "s3", "gcs"]


@dataclass
class Side:
    url: str
    options: dict[str, Any]
    door: Backdoor

    def open(self, **kw: Any) -> CommitStore:
        return open_store(self.url, **self.options, **kw)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("mirror-servers")
    started: dict[str, Any] = {}
    try:
        started["fuse"] = FaultMount(base / "fuse")
        started["samba"] = SambaServer(base / "samba")
        started["moto"] = MotoServer(base / "moto")
        started["gcs"] = FakeGcs(base / "gcs")
        yield started
    finally:
        for server in started.values():
            server.stop()


def side(kind: str, servers: dict[str, Any], tmp: Path) -> Side:
    sub = f"{kind}{time.monotonic_ns()}"
    if kind == "local":
        return Side(str(tmp / sub), {}, LocalBackdoor(tmp / sub))
    if kind == "bridge":
        fuse: FaultMount = servers["fuse"]
        return Side(str(fuse.mnt / sub), {}, LocalBackdoor(fuse.backing / sub))
    if kind == "smb":
        samba: SambaServer = servers["samba"]
        return Side(samba.url(sub), {"password": PASSWORD}, LocalBackdoor(samba.share_dir / sub))
    if kind == "s3":
        moto: MotoServer = servers["moto"]
        return Side(moto.url(sub), moto.options(), S3Backdoor(moto.client(), BUCKET, sub))
    gcs: FakeGcs = servers["gcs"]
    return Side(gcs.url(sub), gcs.options(), GcsBackdoor(gcs.endpoint, GCS_BUCKET, sub))


PAIRS = [(p, m) for p in KINDS for m in KINDS if p != m] + [("local", "local")]


@pytest.mark.parametrize(("primary_kind", "mirror_kind"), PAIRS)
def test_mirror_clauses(
    primary_kind: str, mirror_kind: str, servers: dict[str, Any], tmp_path: Path
) -> None:
    p = side(primary_kind, servers, tmp_path)
    m = side(mirror_kind, servers, tmp_path)
    payloads = {f"ckpt/step_{i:04d}.pt": os.urandom(MiB + i) for i in (1, 2, 3)}
    with p.open(mirrors=[m.open()]) as store:
        for name, data in payloads.items():
            store.put_bytes(name, data)
        with store.stage_dir("hf/checkpoint-4") as d:
            (d / "model.bin").write_bytes(b"w" * 1000)
        store.flush()
        assert store.mirror_status()[0].failed == {}
        assert store.mirror_status()[0].missing == ()
        # Same bytes and the same record, byte for byte, on both sides.
        for name, data in payloads.items():
            assert m.door.read(name) == data
            assert m.door.read(record_path(name)) == p.door.read(record_path(name))
        assert m.door.read("hf/checkpoint-4/model.bin") == b"w" * 1000
        assert m.door.read(record_path("hf/checkpoint-4")) == p.door.read(
            record_path("hf/checkpoint-4")
        )
        assert m.open().verify().ok
        # A primary-side corruption is never copied to a mirror.
        bad = payloads["ckpt/step_0002.pt"]
        p.door.write("ckpt/step_0002.pt", bad[:-1] + bytes([bad[-1] ^ 1]))
        report = store.sync()
        assert "ckpt/step_0002.pt" in report.primary_bad
        assert m.door.read("ckpt/step_0002.pt") == bad
        # ...and the primary gets it back from the mirror.
        rec = store.restore("ckpt/step_0002.pt")
        assert rec.digest == xxh(bad)
        assert p.door.read("ckpt/step_0002.pt") == bad
        # latest(source="any") finds the newest whole artifact when the primary's is gone.
        p.door.remove("hf/checkpoint-4/model.bin")
        latest_any = store.latest(source="any")
        assert latest_any is not None
        assert latest_any.name == "hf/checkpoint-4"
        latest_primary = store.latest()
        assert latest_primary is not None
        assert latest_primary.name == "ckpt/step_0003.pt"


def test_rclone_check_finds_no_difference(tmp_path: Path) -> None:
    primary, mirror = tmp_path / "primary", tmp_path / "mirror"
    rclone = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
    with open_store(primary, mirrors=[str(mirror)]) as store:
        for i in range(4):
            store.put_bytes(f"step_{i}.pt", os.urandom(300_000))
        with store.stage_dir("folder_5") as d:
            (d / "x").write_bytes(b"x")
    check = [rclone, "check", "--config", "/dev/null", str(primary), str(mirror)]
    res = subprocess.run(check, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    # A store written without mirrors, mirrored later by the one-shot sync.
    (tmp_path / "late").mkdir()
    late = open_store(tmp_path / "late")
    late.put_bytes("step_9.pt", b"late")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "commitstore",
            "sync",
            str(tmp_path / "late"),
            str(mirror),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["mirrors"][0]["copied"] == ["step_9.pt"]
    assert "step_0.pt" in doc["mirrors"][0]["foreign"]  # other tools' files: reported, kept
    assert (mirror / "step_0.pt").exists()


@pytest.fixture
def bridge_mirror(servers: dict[str, Any], tmp_path: Path) -> Iterator[tuple[Side, FaultMount]]:
    fuse: FaultMount = servers["fuse"]
    fuse.clear()
    yield side("bridge", servers, tmp_path), fuse
    fuse.clear()


def test_incident_replayed_bridge_mirror_fails_at_73_percent(
    bridge_mirror: tuple[Side, FaultMount], tmp_path: Path
) -> None:
    m, fuse = bridge_mirror
    primary = tmp_path / "primary"
    size = 8 * MiB
    with open_store(primary, mirrors=[m.open()]) as store:
        store.put_bytes("step_0809.pt", os.urandom(size))
        store.flush()
        fuse.set(write_eio={"match": "step_0810", "after": int(0.73 * size)})
        data = os.urandom(size)
        store.put_bytes("step_0810.pt", data)  # best effort: the commit succeeds
        store.flush()
        state = store.mirror_status()[0]
        assert "step_0810.pt" in state.failed
        assert state.missing == ("step_0810.pt",)
        assert m.door.read("step_0810.pt") is None  # nothing under the final name
        assert m.open().verify().ok  # the mirror is clean: no truncated copy anywhere
        fuse.clear()
        report = store.sync()
        assert report.mirrors[0].copied == ("step_0810.pt",)
        assert m.door.read("step_0810.pt") == data
        # A mirror copy truncated behind commitstore's back: verify reports it, latest(any)
        # skips it, sync repairs it.
        os.truncate(fuse.mnt / m.url.rsplit("/", 1)[1] / "step_0810.pt", size // 2)
        assert m.open().verify("step_0810.pt").results[0].status == "size_mismatch"
        os.unlink(primary / "step_0810.pt")
        latest = store.latest(source="any")
        assert latest is not None
        assert latest.name == "step_0809.pt"
        store.restore("step_0809.pt")  # harmless: already whole
        report = store.sync()
        assert report.mirrors[0].repaired == ()  # the primary lost step_0810 too: nothing to copy
        store.put_bytes("step_0810.pt", data, overwrite=True)
        report = store.sync()
        assert "step_0810.pt" in report.mirrors[0].repaired + report.mirrors[0].ok
        assert m.open().verify().ok


def test_required_policy_raises_and_keeps_the_primary(
    bridge_mirror: tuple[Side, FaultMount], tmp_path: Path
) -> None:
    m, fuse = bridge_mirror
    fuse.set(write_eio={"match": "step_", "after": 1000})
    for mode in ("sync", "background"):
        root = tmp_path / mode
        store = open_store(root, mirrors=[m.open()], mirror_mode=mode, mirror_policy="required")
        if mode == "sync":
            with pytest.raises(MirrorError) as info:
                store.put_bytes("step_1.pt", os.urandom(100_000))
        else:
            store.put_bytes("step_1.pt", os.urandom(100_000))
            with pytest.raises(MirrorError) as info:
                store.flush()
        assert len(info.value.exceptions) == 1
        assert open_store(root).verify("step_1.pt").ok  # the artifact stays on the primary
        assert m.door.read("step_1.pt") is None
    best = open_store(tmp_path / "best", mirrors=[m.open()])
    best.put_bytes("step_1.pt", b"x" * 5000)  # best effort: no error
    best.flush()
    assert "step_1.pt" in best.mirror_status()[0].failed


def test_back_pressure_bounds_the_queue(
    bridge_mirror: tuple[Side, FaultMount], tmp_path: Path
) -> None:
    m, fuse = bridge_mirror
    fuse.set(write_delay={"match": "step_", "seconds": 0.01})
    store = open_store(tmp_path / "p", mirrors=[m.open()], mirror_queue=1)
    most = 0
    for i in range(6):
        store.put_bytes(f"step_{i}.pt", os.urandom(512 * 1024))
        most = max(most, len(store.mirror_status()[0].pending))
    assert most <= 2  # one queued + one in flight, never an unbounded backlog
    store.close()
    assert m.open().verify().ok
    assert len(m.open().list()) == 6


def test_sigkill_mid_replication_to_s3_and_smb(servers: dict[str, Any], tmp_path: Path) -> None:
    """A process SIGKILLed while its commit is being copied to an S3 and an SMB mirror leaves
    each mirror without the artifact or with it whole, and the next sync completes both. Both
    mirrors are reached through proxies that slow every connection, and the kill comes once one
    of them has carried a MiB of the copy: the copy is in flight when the process dies (a fixed
    sleep let a fast machine finish both copies first)."""
    s3m = side("s3", servers, tmp_path)
    smbm = side("smb", servers, tmp_path)
    moto: MotoServer = servers["moto"]
    samba: SambaServer = servers["samba"]
    s3p, smbp = FaultProxy(moto.port), FaultProxy(samba.port)
    primary = tmp_path / "primary"
    script = (
        "import os, sys\n"
        "from commitstore import open_store\n"
        "s3o = dict(endpoint_url=sys.argv[3], key=sys.argv[4], secret=sys.argv[5], "
        "single_put_max=5 * 1024 * 1024)\n"
        "smbo = "
        "dict(password=sys.argv[6])\n"
        "store = open_store(sys.argv[1], mirrors=[open_store(sys.argv[2], **s3o), "
        "open_store(sys.argv[7], **smbo)])\n"
        "store.put_bytes('step_0001.pt', os.urandom(64 * 1024 * 1024))\n"
        "print('committed', flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    o = s3m.options
    try:
        for p in (s3p, smbp):
            p.set(delay=0.02, faulty=None)  # each forwarded chunk waits: ~20 s for 64 MiB
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                script,
                str(primary),
                s3m.url,
                s3p.endpoint,
                o["key"],
                o["secret"],
                PASSWORD,
                smbm.url.replace(f":{samba.port}/", f":{smbp.port}/", 1),
            ],
            cwd=ROOT_DIR,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "committed"
        deadline = time.monotonic() + 60
        while max(s3p.received, smbp.received) < MiB and time.monotonic() < deadline:
            time.sleep(0.02)
        assert max(s3p.received, smbp.received) >= MiB  # a copy is under way
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        s3p.stop()
        smbp.stop()
    for mirror in (s3m, smbm):
        data = mirror.door.read("step_0001.pt")
        assert data is None or len(data) == 64 * MiB  # never a partial artifact
    store = open_store(primary, mirrors=[s3m.open(), smbm.open()])
    report = store.sync()
    assert report.ok
    assert any(m.copied for m in report.mirrors)  # the kill did interrupt a replication
    for mirror in (s3m, smbm):
        assert mirror.open().verify("step_0001.pt").ok
    store.close()


def test_incident_prune_46_keep_12_on_primary_and_bridge_mirror(
    bridge_mirror: tuple[Side, FaultMount], tmp_path: Path
) -> None:
    m, fuse = bridge_mirror
    fuse.set(mtime_zero={"match": "step_0020.pt"})  # this network filesystem answers mtime 0
    primary = tmp_path / "primary"
    store = open_store(primary, mirrors=[m.open()], mirror_mode="sync")
    for step in range(1, 47):
        store.put_bytes(f"step_{step:04d}.pt", os.urandom(10_000))
    old = time.time() - 3600
    sub = m.url.rsplit("/", 1)[1]
    for root in (primary, fuse.mnt / sub):
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                os.utime(os.path.join(dirpath, f), (old, old))
    time.sleep(1.2)  # the mount's attribute cache expires
    # A copy in flight on the mirror: another process committing step 47 there, held half-way
    # (its first bytes staged) until the prune is done.
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys\nfrom commitstore import open_store\n"
            "with open_store(sys.argv[1]).stage('step_0047.pt') as st:\n"
            "    st.write(os.urandom(65536))\n"
            "    print('writing', flush=True)\n"
            "    sys.stdin.readline()\n"
            "    for _ in range(39):\n        st.write(os.urandom(65536))\n",
            m.url,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdin is not None and writer.stdout is not None
    assert writer.stdout.readline().strip() == "writing"
    report = store.prune(keep_last=12)
    writer.stdin.write("go\n")
    writer.stdin.close()
    assert writer.wait(120) == 0  # the in-flight copy survived and committed
    primary_left = sorted(r.name for r in store.list())
    mirror_left = sorted(r.name for r in m.open().list())
    last12 = [f"step_{s:04d}.pt" for s in range(35, 47)]
    assert primary_left == last12
    assert report.targets[1].skipped["step_0020.pt"] == "unknown mtime"
    assert mirror_left == sorted([*last12, "step_0020.pt", "step_0047.pt"])
    assert m.open().verify().ok


def test_one_primary_with_every_kind_as_mirror(servers: dict[str, Any], tmp_path: Path) -> None:
    p = side("local", servers, tmp_path)
    mirrors = [side(kind, servers, tmp_path) for kind in ("bridge", "smb", "s3", "gcs")]
    data = os.urandom(3 * MiB)
    with p.open(mirrors=[m.open() for m in mirrors]) as store:
        store.put_bytes("step_0001.pt", data)
        with store.stage("step_0002.pt") as st:
            st.write(data[::-1])
        store.flush()
        states = store.mirror_status()
        assert [s.failed for s in states] == [{}] * 4
    for m in mirrors:
        assert m.door.read("step_0001.pt") == data
        assert m.door.read("step_0002.pt") == data[::-1]
        assert m.door.read(record_path("step_0002.pt")) == p.door.read(record_path("step_0002.pt"))
        assert m.open().verify().ok


ORDERED = [(p, m) for p in KINDS for m in KINDS if p != m]
CYCLE = [("local", "bridge"), ("bridge", "smb"), ("smb", "s3"), ("s3", "gcs"), ("gcs", "local")]
"""The pairs :class:`TestConformanceOnCycle` runs on in the default run: every kind once as the
primary and once as the mirror (the other pairs of :data:`ORDERED` under soak)."""


def _mirrored(pair: tuple[str, str], servers: dict[str, Any], tmp_path: Path) -> Iterator[Target]:
    primary_kind, mirror_kind = pair
    p = side(primary_kind, servers, tmp_path)
    m = side(mirror_kind, servers, tmp_path)

    def opened() -> CommitStore:
        return p.open(mirrors=[m.open()], mirror_mode="sync")

    store = opened()
    yield Target(store, p.door, opened)
    # Every commit the conformance suite made reached the mirror whole, with the same record.
    mirror = m.open()
    assert mirror.verify(level="size").ok
    for rec in store.list():
        if store.verify(rec.name).ok:
            assert m.door.read(record_path(rec.name)) == p.door.read(record_path(rec.name))


@pytest.fixture(params=ORDERED, ids=[f"{a}-{b}" for a, b in ORDERED])
def mirrored_target(
    request: pytest.FixtureRequest, servers: dict[str, Any], tmp_path: Path
) -> Iterator[Target]:
    yield from _mirrored(request.param, servers, tmp_path)


@pytest.fixture(
    params=[
        pytest.param(pair, marks=() if pair in CYCLE else (pytest.mark.soak,)) for pair in ORDERED
    ],
    ids=[f"{a}-{b}" for a, b in ORDERED],
)
def cycle_target(
    request: pytest.FixtureRequest, servers: dict[str, Any], tmp_path: Path
) -> Iterator[Target]:
    yield from _mirrored(request.param, servers, tmp_path)


class TestConformanceWithMirrors(StoreConformance):
    """The whole conformance suite on every ordered (primary, mirror) pair, but the tests of
    :class:`TestConformanceOnCycle`."""

    @pytest.fixture
    def target(self, mirrored_target: Target) -> Target:
        return mirrored_target

    test_state_machine_against_model = None  # type: ignore[assignment]
    test_any_truncation_detected = None  # type: ignore[assignment]
    test_any_bit_flip_detected = None  # type: ignore[assignment]
    test_invalid_names_rejected_before_io = None  # type: ignore[assignment]

    @pytest.mark.soak  # ~2 s per pair; each backend runs it in the default run without mirrors
    def test_folder_written_by_two_handles_commits_once(self, target: Target) -> None:
        super().test_folder_written_by_two_handles_commits_once(target)


class TestConformanceOnCycle:
    """The conformance suite's property-based tests (a model-checked random sequence of
    operations; any bit flip, any truncation caught: seconds per pair) and its invalid-name test
    (13 names, each rejected before any I/O: the mirror is never reached), on the :data:`CYCLE`
    pairs in the default run and on the other ordered pairs under soak. A bit flip, a truncation
    or a refused name concerns the primary alone, whatever the mirror; each backend runs all
    four without mirrors in the default run too."""

    @pytest.fixture
    def target(self, cycle_target: Target) -> Target:
        return cycle_target

    test_state_machine_against_model = StoreConformance.test_state_machine_against_model
    test_any_truncation_detected = StoreConformance.test_any_truncation_detected
    test_any_bit_flip_detected = StoreConformance.test_any_bit_flip_detected
    test_invalid_names_rejected_before_io = StoreConformance.test_invalid_names_rejected_before_io
