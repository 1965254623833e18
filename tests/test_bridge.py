"""The bridge strategy on a real FUSE mount of the project's own fault-injecting filesystem.

Assertions read the backing folder directly: a backdoor under the FUSE layer.
"""

from __future__ import annotations

import errno
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commitstore import (
    AlreadyExistsError,
    CommitError,
    InsufficientSpaceError,
    open_store,
)
from commitstore.backends.rename.posix.mounts import mount_of, parse_mountinfo
from commitstore.testing import LocalBackdoor, StoreConformance, Target, record_path, xxh

from .helpers.fusemount import FaultMount

MiB = 1024 * 1024
ROOT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fault_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultMount]:
    m = FaultMount(tmp_path_factory.mktemp("faultfs"))
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="module")
def uncached_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultMount]:
    """A mount without attribute caching: the conformance suite damages files behind its back."""
    m = FaultMount(tmp_path_factory.mktemp("faultfs-uncached"), attr_timeout=0)
    try:
        yield m
    finally:
        m.stop()


def _target(mount: FaultMount) -> Iterator[Target]:
    mount.clear()
    sub = f"t{time.monotonic_ns()}"
    url = str(mount.mnt / sub)
    yield Target(open_store(url), LocalBackdoor(mount.backing / sub), lambda: open_store(url))
    mount.clear()


@pytest.fixture
def bridge(fault_mount: FaultMount) -> Iterator[Target]:
    yield from _target(fault_mount)


class TestBridgeConformance(StoreConformance):
    @pytest.fixture
    def target(self, uncached_mount: FaultMount) -> Iterator[Target]:
        for t in _target(uncached_mount):
            assert t.store.describe()["strategy"] == "bridge-checked"
            yield t


def _earlier(t: Target) -> None:
    t.store.put_bytes("step_0001.pt", b"old whole checkpoint" * 1000)


def _earlier_intact(t: Target) -> None:
    assert t.door.read("step_0001.pt") == b"old whole checkpoint" * 1000
    assert t.store.verify().ok
    latest = t.store.latest()
    assert latest is not None
    assert latest.name == "step_0001.pt"


def _nothing_published(t: Target, name: str) -> None:
    assert t.door.read(name) is None
    assert t.door.read(record_path(name)) is None
    assert [f for f in t.door.files() if ".commitstore.tmp." in f] == []


def _write(t: Target, name: str, size: int) -> None:
    with t.store.stage(name) as st:
        for _ in range(size // MiB):
            st.write(b"\xab" * MiB)


def test_describe_detects_fuse_mount(bridge: Target) -> None:
    info = bridge.store.describe()
    assert info["mount"]["fstype"] == "fuse.commitstore-faultfs"
    assert "network/FUSE mount" in info["reason"]
    assert info["checks"]["readback"] is True
    forced = open_store(bridge.store.url, strategy="local").describe()
    assert forced["strategy"] == "local-rename"


def test_eio_at_73_percent_of_a_copy(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    fault_mount.set(write_eio={"match": "step_0002", "after": int(0.73 * 16 * MiB)})
    with pytest.raises(CommitError):
        _write(bridge, "step_0002.pt", 16 * MiB)
    _nothing_published(bridge, "step_0002.pt")
    _earlier_intact(bridge)


def test_short_write_reported_as_success(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    fault_mount.set(short_write={"match": "step_0002", "after": 11 * MiB})
    with pytest.raises(CommitError) as info:
        _write(bridge, "step_0002.pt", 16 * MiB)
    assert str(11 * MiB) in str(info.value)
    assert str(16 * MiB) in str(info.value)
    _nothing_published(bridge, "step_0002.pt")
    _earlier_intact(bridge)


def test_silent_corruption_caught_by_readback(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    fault_mount.set(flip_write={"match": "step_0002", "at": 5 * MiB + 3})
    with pytest.raises(CommitError, match="read-back digest"):
        _write(bridge, "step_0002.pt", 8 * MiB)
    _nothing_published(bridge, "step_0002.pt")
    _earlier_intact(bridge)


def test_enospc_mid_write(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    fault_mount.set(write_enospc={"match": "step_0002", "after": 3 * MiB})
    with pytest.raises(InsufficientSpaceError) as info:
        _write(bridge, "step_0002.pt", 8 * MiB)
    assert info.value.errno == errno.ENOSPC
    _nothing_published(bridge, "step_0002.pt")
    _earlier_intact(bridge)


def test_fsync_eio_is_fatal(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    fault_mount.set(fsync_eio={"match": "step_0002"})
    with pytest.raises(CommitError):
        _write(bridge, "step_0002.pt", 2 * MiB)
    _nothing_published(bridge, "step_0002.pt")
    _earlier_intact(bridge)


def test_rename_eacces_clears_after_two_tries(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    # the data rename (its destination), not the pending record's rename before it
    fault_mount.set(rename_errno={"match": "/step_0002.pt", "errno": "EACCES", "times": 2})
    st = bridge.store.stage("step_0002.pt", overwrite=True)
    st.write(b"new" * 1000)
    rec = st.commit()
    assert "rename succeeded after 3 attempts" in st.notes
    assert bridge.door.read("step_0002.pt") == b"new" * 1000
    assert rec.digest == xxh(b"new" * 1000)
    events = [e for e in fault_mount.events() if e["path"].endswith("/step_0002.pt")]
    assert [e["op"] for e in events] == ["rename_refused", "rename_refused", "rename"]
    # Never a copy fallback: the final name was never created or linked directly.
    assert not any(e["op"] in ("create", "link") for e in events)


def test_rename_refused_for_good_publishes_nothing(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    fault_mount.set(rename_errno={"match": "step_0002", "errno": "EACCES", "times": 1000})
    with pytest.raises(CommitError):
        bridge.store.put_bytes("step_0002.pt", b"x" * 1000, overwrite=True)
    _nothing_published(bridge, "step_0002.pt")
    _earlier_intact(bridge)


def test_dir_fsync_eio_commits_with_durability_unconfirmed(
    bridge: Target, fault_mount: FaultMount, caplog: pytest.LogCaptureFixture
) -> None:
    _earlier(bridge)
    fault_mount.set(fsyncdir_eio={})
    with caplog.at_level(logging.WARNING, logger="commitstore"):
        st = bridge.store.stage("step_0002.pt")
        st.write(b"y" * 1000)
        st.commit()
    assert st.durable is False
    assert any("durability unconfirmed" in n for n in st.notes)
    assert "durability unconfirmed" in caplog.text
    assert bridge.door.read("step_0002.pt") == b"y" * 1000
    assert bridge.store.verify().ok


def test_mtime_zero_is_unknown(bridge: Target, fault_mount: FaultMount) -> None:
    fault_mount.set(mtime_zero={"match": "step_0001"})
    _earlier(bridge)
    info = bridge.store._backend.stat(("step_0001.pt",))
    assert info is not None
    assert info.mtime is None
    assert bridge.store.verify().ok


def test_no_hard_links_still_exclusive(bridge: Target, fault_mount: FaultMount) -> None:
    """Without hard links (EPERM, as on 9p/drvfs) two writers racing for one name: both have
    staged their bytes before either commits (a barrier), exactly one wins, the other gets
    AlreadyExistsError, and the name holds the winner's bytes and record."""
    fault_mount.set(link_eperm={})
    payloads = [b"first" * 100_000, b"second" * 100_000]
    barrier = threading.Barrier(2)
    outcomes: dict[int, str] = {}
    staged: list[int] = []

    def writer(i: int) -> None:
        st = bridge.reopen().stage("step_0005.pt")
        st.write(payloads[i])
        staged.append(i)
        barrier.wait(30)
        assert len(staged) == 2  # both staged before either commits: the commits overlap
        try:
            st.commit()
            outcomes[i] = "won"
        except AlreadyExistsError:
            outcomes[i] = "lost"

    threads = [threading.Thread(target=writer, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes.values()) == ["lost", "won"], outcomes
    winner = next(i for i, o in outcomes.items() if o == "won")
    assert bridge.door.read("step_0005.pt") == payloads[winner]
    doc = json.loads(bridge.door.read(record_path("step_0005.pt")) or b"")
    assert doc["digest"] == xxh(payloads[winner])
    assert not any(e["op"] == "link" and "step_0005" in e["path"] for e in fault_mount.events())


def test_bridge_declares_create_only_per_mount(bridge: Target, tmp_path: Path) -> None:
    """On a FUSE mount (another side may write) create-only is not declared: the core checks
    absence under the lock; forced onto a local filesystem the bridge declares it."""
    caps = bridge.store.describe()["capabilities"]
    assert caps["exclusive_create"] is False
    assert bridge.store._backend.capabilities.exclusive_create is False
    local = open_store(tmp_path / "local-bridge", strategy="bridge")
    assert local.describe()["strategy"] == "bridge-checked"
    assert local.describe()["capabilities"]["exclusive_create"] is True


def test_sigkill_during_bridge_write(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    fault_mount.set(write_delay={"match": "step_0009", "seconds": 0.002})
    root = bridge.store.url
    for trial in range(3):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.writer",
                root,
                "step_0009.pt",
                str(trial),
                str(48 * MiB),
            ],
            cwd=ROOT_DIR,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3 + 0.2 * trial)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert bridge.door.read("step_0009.pt") is None
        leftovers = [f for f in bridge.door.files() if "step_0009" in f]
        assert leftovers
        assert all(".commitstore.tmp." in f for f in leftovers)
    _earlier_intact(bridge)


def test_gc_keeps_orphans_of_unknown_age(bridge: Target, fault_mount: FaultMount) -> None:
    _earlier(bridge)
    st = bridge.store.stage("step_0003.pt")
    st.write(b"x" * 5 * MiB)  # a live writer's staging file (it holds its lock)...
    orphan = ".commitstore.tmp.0123456789abcdef0123456789abcdef.step_0002.pt"
    bridge.door.write(orphan, b"y" * MiB)  # ...and a dead writer's, which no one holds
    fault_mount.set(mtime_zero={"match": ".commitstore.tmp."})
    time.sleep(1.2)  # let the mount's attribute cache expire
    report = bridge.store.gc(min_age=0)
    assert report.removed == ()
    reasons = {i.path.rsplit("/", 1)[-1]: i.reason for i in report.kept}
    assert reasons.pop(orphan) == "unknown mtime"
    assert list(reasons.values()) == ["held by a live writer"]
    fault_mount.clear()
    st.commit()  # ...which survived and commits
    assert bridge.store.verify().ok


def test_mountinfo_parsing() -> None:
    text = "\n".join(
        [
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
            "40 22 0:40 / /mnt/c rw,noatime - 9p drvfs rw,aname=drvfs;path=C:\\",
            "41 22 0:41 / /mnt/nas\\040share rw - cifs //nas/share rw",
            "42 22 0:42 / /mnt/nfs rw - nfs4 srv:/x rw",
            "43 22 0:43 / /home/u/remote rw - fuse.sshfs u@h: rw",
            "44 22 0:44 / /mnt/d rw - drvfs D: rw",
        ]
    )
    mounts = {m.mount_point: m for m in parse_mountinfo(text)}
    assert mounts["/mnt/nas share"].fstype == "cifs"
    for mp in ("/mnt/c", "/mnt/nas share", "/mnt/nfs", "/home/u/remote", "/mnt/d"):
        assert mounts[mp].is_bridge, mp
    assert not mounts["/"].is_bridge
    found = mount_of("/mnt/c/runs/x/not-yet-created", text)
    assert found is not None
    assert found.fstype == "9p"
    assert mount_of("/mnt/cx/y", text) == mounts["/"]
