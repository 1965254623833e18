"""Azure Blob strategy against Azurite on 127.0.0.1; the backdoor is azure-storage-blob."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from commitstore import open_store
from commitstore.testing import StoreConformance, Target, xxh

from .helpers.azurite import Azurite, azure_backdoor
from .helpers.faultproxy import (
    FaultProxy,
    check_persistent_fault,
    check_transient_fault,
    through_proxy,
)
from .helpers.recordcache import check_record_cache

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        server.stop()


def make_target(server: Azurite, **options: object) -> Target:
    prefix = f"t{time.monotonic_ns()}"
    opts = {**server.options(), "block_size": 1 * MiB, **options}
    url = server.url(prefix)
    return Target(
        open_store(url, **opts), azure_backdoor(server, prefix), lambda: open_store(url, **opts)
    )


class TestAzureConformance(StoreConformance):
    @pytest.fixture
    def target(self, azurite: Azurite) -> Target:
        return make_target(azurite)


def test_block_list_commit(azurite: Azurite) -> None:
    t = make_target(azurite)
    data = os.urandom(5 * MiB + 7)
    st = t.store.stage("big/step_0005.pt")
    for i in range(0, len(data), MiB // 2):
        st.write(data[i : i + MiB // 2])
        assert t.door.read("big/step_0005.pt") is None
    rec = st.commit()
    assert t.door.read("big/step_0005.pt") == data
    assert rec.digest == xxh(data)
    info = t.store.describe()
    assert info["strategy"] == "azure-blocklist"
    assert "AccountKey" not in str(info)
    assert "AccountKey" not in repr(t.store)


def test_sigkill_mid_upload_publishes_nothing(azurite: Azurite) -> None:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    t = make_target(azurite)
    t.store.put_bytes("step_0001.pt", b"whole")
    env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.helpers.writer",
            t.store.url,
            "step_0000.pt",
            "0",
            str(12 * MiB),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]  # the same child, not killed, commits
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.writer",
            t.store.url,
            "step_0002.pt",
            "1",
            str(96 * MiB),
        ],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    blob = azure_backdoor(azurite, t.store.url.rsplit("/", 1)[1]).container.get_blob_client(
        t.store.url.rsplit("/", 1)[1] + "/step_0002.pt"
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # mid-upload: blocks staged, none committed yet
        try:
            _committed, uncommitted = blob.get_block_list("uncommitted")
        except Exception:  # the blob does not exist until its first block is staged
            uncommitted = []
        if uncommitted:
            break
        time.sleep(0.01)
    else:
        proc.kill()
        pytest.fail("no block was staged within 30 s: the writer was never caught mid-upload")
    assert proc.poll() is None, "the writer finished before it could be killed mid-upload"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert t.door.read("step_0002.pt") is None  # staged blocks are never visible
    assert [f for f in t.door.files() if "step_0002" in f] == []
    latest = t.reopen().latest()
    assert latest is not None
    assert latest.name == "step_0001.pt"


def test_record_cache_replaces_one_get_per_record(azurite: Azurite) -> None:
    check_record_cache(make_target(azurite))


@pytest.fixture
def proxied(azurite: Azurite) -> Iterator[tuple[Target, FaultProxy]]:
    """A store whose every request goes through our TCP fault proxy (blocks of 1 MiB)."""
    prefix = f"p{time.monotonic_ns()}"

    def target(proxy: FaultProxy) -> Target:
        via = azurite.connection_string.replace(
            f"127.0.0.1:{azurite.port}", f"127.0.0.1:{proxy.port}"
        )
        opts: dict[str, Any] = {
            "connection_string": via,
            "block_size": 1 * MiB,
            # The SDK's retries, quicker than its defaults (15 s, 18 s, 24 s ... between tries):
            # 0.2 s before each (its backoff is initial_backoff + increment_base ** n).
            "client_options": {"retry_total": 3, "initial_backoff": 0.2, "increment_base": 0},
        }
        url = azurite.url(prefix)
        return Target(
            open_store(url, **opts),
            azure_backdoor(azurite, prefix),
            lambda: open_store(url, **opts),
        )

    with through_proxy(azurite.port, target) as pair:
        yield pair


@pytest.mark.parametrize("fault", ["cut_after", "reset_after"])
def test_transient_network_faults_are_retried(
    proxied: tuple[Target, FaultProxy], fault: str
) -> None:
    check_transient_fault(*proxied, fault, size=9 * MiB, at=512 * 1024)


def test_persistent_network_fault_is_unavailable_and_publishes_nothing(
    proxied: tuple[Target, FaultProxy],
) -> None:
    check_persistent_fault(*proxied, size=5 * MiB, at=256 * 1024)


def test_reads_are_pinned_to_the_version_opened(azurite: Azurite) -> None:
    """A blob replaced between two range reads (the 8 MiB read buffer refills by range) raises
    IntegrityError: never the other version's bytes after the ones already read, and never,
    after a verified open, bytes that were not the ones checked."""
    from commitstore import IntegrityError

    t = make_target(azurite)
    size = 10 * MiB  # more than one 8 MiB buffered read
    old, new = b"o" * size, b"n" * size
    for verify in ("none", "full"):
        name = f"pin-{verify}.bin"
        t.store.put_bytes(name, old)
        f = t.store.open(name, verify=verify)
        first = f.read(MiB)
        assert first == old[:MiB]
        t.door.write(name, new)  # same size, another version, behind the reader's back
        assert t.door.read(name) == new
        with pytest.raises(IntegrityError) as info:
            rest = f.read()
            assert rest == old[MiB:], "mixed versions"  # only reached without pinning
        assert info.value.status == "hash_mismatch" and "replaced" in str(info.value)
        f.close()
