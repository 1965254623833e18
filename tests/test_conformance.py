"""The conformance suite against the built-in backends."""

from __future__ import annotations

import pytest

from commitstore.testing import StoreConformance, Target


class TestLocal(StoreConformance):
    @pytest.fixture
    def target(self, local_target: Target) -> Target:
        return local_target


class TestMemory(StoreConformance):
    @pytest.fixture
    def target(self, memory_target: Target) -> Target:
        return memory_target
