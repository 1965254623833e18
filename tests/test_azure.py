"""Azure Blob strategy against Azurite on 127.0.0.1; the backdoor is azure-storage-blob."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from commitstore import open_store
from commitstore.testing import StoreConformance, Target, xxh

from .helpers.azurite import AzureBackdoor, Azurite

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
        open_store(url, **opts), AzureBackdoor(server, prefix), lambda: open_store(url, **opts)
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


def test_exception_mid_stage_leaves_nothing(azurite: Azurite) -> None:
    t = make_target(azurite)
    with pytest.raises(RuntimeError), t.store.stage("step_0006.pt") as st:
        st.write(os.urandom(3 * MiB))
        raise RuntimeError("crash mid-save")
    assert t.door.files() == []
