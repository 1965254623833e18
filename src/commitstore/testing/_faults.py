"""Conformance, part two: damage injected through the backdoor is always caught, a random
sequence of operations matches a model, and gc never touches committed artifacts."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitstore import IntegrityError

if TYPE_CHECKING:
    from commitstore.testing.target import Target


def _cheap(target: Target) -> bool:
    """A target whose operations cost microseconds: local disk or memory, no mirrors."""
    kind = type(target.store._backend).__name__
    return kind in ("LocalBackend", "MemoryBackend") and not target.store.mirrors


class FaultConformance:
    """Mixed into :class:`StoreConformance`; uses its ``target`` fixture."""

    # -- fault injection: any bit flip or truncation is caught --------------------------
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(data=st.binary(min_size=1, max_size=4096), where=st.floats(0, 1), bit=st.integers(0, 7))
    def test_any_bit_flip_detected(
        self, target: Target, data: bytes, where: float, bit: int
    ) -> None:
        name = f"flip/{xxhash.xxh64_hexdigest(data)}-{bit}-{where}"
        target.store.put_bytes(name, data, overwrite=True)
        pos = min(int(where * len(data)), len(data) - 1)
        damaged = bytearray(data)
        damaged[pos] ^= 1 << bit
        target.door.write(name, bytes(damaged))
        assert target.store.verify(name).results[0].status == "hash_mismatch"
        with pytest.raises(IntegrityError):
            target.store.read_bytes(name)

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(data=st.binary(min_size=1, max_size=4096), where=st.floats(0, 1))
    def test_any_truncation_detected(self, target: Target, data: bytes, where: float) -> None:
        name = f"trunc/{xxhash.xxh64_hexdigest(data)}-{where}"
        target.store.put_bytes(name, data, overwrite=True)
        cut = min(int(where * len(data)), len(data) - 1)
        target.door.write(name, data[:cut])
        for level in ("size", "full"):
            assert target.store.verify(name, level=level).results[0].status == "size_mismatch"
        latest = target.store.latest(level="size")
        assert latest is None or latest.name != name

    def test_state_machine_against_model(self, target: Target) -> None:
        """20 examples on a local disk or in memory; 5 over a network or with mirrors, where
        each example costs seconds (the soak variant runs 50 everywhere)."""
        from commitstore.testing.stateful import run_store_machine

        run_store_machine(target, max_examples=20 if _cheap(target) else 5)

    @pytest.mark.soak
    def test_state_machine_against_model_soak(self, target: Target) -> None:
        """Opt-in (``COMMITSTORE_SOAK=1``, set by ``nox -s soak``): 50 examples on any target."""
        if not os.environ.get("COMMITSTORE_SOAK"):
            pytest.skip("a soak run: set COMMITSTORE_SOAK=1")
        from commitstore.testing.stateful import run_store_machine

        run_store_machine(target, max_examples=50)

    def test_gc_never_touches_committed(self, target: Target) -> None:
        s = target.store
        s.put_bytes("keep/step_1", b"one" * 100)
        with s.stage_dir("keep/step_2") as d:
            (d / "w.bin").write_bytes(b"two")
        before = target.door.files()
        dry = s.gc(min_age=0, dry_run=True)
        assert dry.dry_run
        report = s.gc(min_age=0)
        assert [i.path for i in report.removed] == [i.path for i in dry.removed]
        assert all(".commitstore.tmp." in i.path or i.kind == "upload" for i in report.removed)
        assert [f for f in target.door.files() if ".commitstore.tmp." not in f] == [
            f for f in before if ".commitstore.tmp." not in f
        ]
        assert s.verify().ok
        assert s.gc(min_age=0).removed == ()  # idempotent
