"""pytest plugin: ready-made targets for the built-in backends.

Enable with ``pytest_plugins = ["commitstore.testing.plugin"]``.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from commitstore import open_store
from commitstore.testing.backdoor import FsspecBackdoor, LocalBackdoor
from commitstore.testing.target import Target


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "soak: long conformance runs, opt-in with COMMITSTORE_SOAK=1"
    )


@pytest.fixture
def local_target(tmp_path: Path) -> Target:
    """A store on a local folder, with an ``os`` backdoor."""
    root = tmp_path / "store"
    return Target(open_store(str(root)), LocalBackdoor(root), lambda: open_store(str(root)))


@pytest.fixture
def memory_target() -> Target:
    """A store on a fresh prefix of ``memory://``, with a raw fsspec backdoor."""
    root = f"/cs-{uuid.uuid4().hex}"
    url = f"memory://{root}"
    return Target(open_store(url), FsspecBackdoor("memory", root), lambda: open_store(url))
