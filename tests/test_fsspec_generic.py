"""The generic fsspec-checked strategy: chosen for schemes fsspec knows and commitstore has no
strategy for, or forced with ``strategy="fsspec"``; filesystems whose move is a copy are refused
unless asked for. The conformance suite runs on fsspec's local filesystem through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from commitstore import BackendUnavailableError, ConfigurationError, open_store
from commitstore.testing import LocalBackdoor, StoreConformance, Target


class TestGenericLocalConformance(StoreConformance):
    @pytest.fixture
    def target(self, tmp_path: Path) -> Target:
        root = tmp_path / "generic"

        store = open_store(f"file://{root}", strategy="fsspec")
        info = store.describe()
        assert info["strategy"] == "fsspec-checked" and info["move"] == "fsspec mv"
        assert info["capabilities"]["atomic_replace"] is False
        url = f"file://{root}"
        return Target(store, LocalBackdoor(root), lambda: open_store(url, strategy="fsspec"))


def test_scheme_known_to_fsspec_gets_the_generic_strategy() -> None:
    """ftp:// has no strategy of its own: the generic one is chosen (and reports the refused
    connection as unreachable, not as an unknown scheme)."""
    with pytest.raises(BackendUnavailableError):
        open_store("ftp://127.0.0.1:1/x")


def test_copy_moves_are_refused_unless_asked(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="allow_copy_move") as info:
        open_store("http://127.0.0.1:1/x")
    assert "\n" not in str(info.value)


def test_other_strategy_options_stay_the_backends(tmp_path: Path) -> None:
    """Only ``strategy="fsspec"`` is taken by the registry; the local factory's own values
    still reach it."""
    assert open_store(str(tmp_path), strategy="bridge").describe()["strategy"] == "bridge-checked"
    with pytest.raises(ConfigurationError, match="'auto', 'local' or 'bridge'"):
        open_store(str(tmp_path), strategy="nonsense")
    assert open_store(str(tmp_path)).describe()["strategy"] == "local-rename"


def test_unknown_scheme_still_refused() -> None:
    with pytest.raises(ConfigurationError, match="no commit strategy"):
        open_store("nosuch://x/y")
