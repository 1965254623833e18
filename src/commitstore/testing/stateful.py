"""A Hypothesis state machine: random commits, aborts, overwrites, deletes and on-disk damage,
checked against a dict model after every step. Runs on any :class:`Target`."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from commitstore import AlreadyExistsError, IntegrityError, NotFoundError
from commitstore.testing.target import Target

NAMES = st.sampled_from(["s_1", "s_2", "d/s_3", "d/s_10"])
DATA = st.binary(min_size=1, max_size=300)


def run_store_machine(target: Target, *, max_examples: int = 20) -> None:
    """Run the machine against ``target``; each example works under its own fresh prefix."""

    class StoreMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.prefix = f"m{uuid.uuid4().hex[:12]}/"
            self.store = target.reopen()
            self.model: dict[str, bytes] = {}
            self.damaged: set[str] = set()

        def full(self, name: str) -> str:
            return self.prefix + name

        @rule(name=NAMES, data=DATA, overwrite=st.booleans())
        def put(self, name: str, data: bytes, overwrite: bool) -> None:
            if name in self.model and not overwrite:
                with pytest.raises(AlreadyExistsError):
                    self.store.put_bytes(self.full(name), data, overwrite=overwrite)
                return
            self.store.put_bytes(self.full(name), data, overwrite=overwrite)
            self.model[name] = data
            self.damaged.discard(name)

        @rule(name=NAMES, data=DATA, fail=st.booleans())
        def stage_then_abort(self, name: str, data: bytes, fail: bool) -> None:
            st_ = self.store.stage(self.full(name), overwrite=True)
            st_.write(data)
            if fail:
                with pytest.raises(RuntimeError), st_:
                    raise RuntimeError("abort by exception")
            else:
                st_.abort()

        @rule(name=NAMES)
        def delete(self, name: str) -> None:
            if name in self.model:
                self.store.delete(self.full(name))
                del self.model[name]
                self.damaged.discard(name)
            else:
                with pytest.raises(NotFoundError):
                    self.store.delete(self.full(name))

        @rule(name=NAMES, pos=st.integers(0, 299))
        def damage(self, name: str, pos: int) -> None:
            if name not in self.model:
                return
            data = bytearray(self.model[name])
            data[pos % len(data)] ^= 0xFF
            target.door.write(self.full(name), bytes(data))
            self.damaged.add(name)

        def teardown(self) -> None:
            # Keep the store small for the next example: scans cost grow with its size.
            for name in list(self.model):
                self.store.delete(self.full(name))

        @invariant()
        def listing_matches_model(self) -> None:
            mine = [r for r in self.store.list() if r.name.startswith(self.prefix)]
            assert sorted(r.name for r in mine) == sorted(self.full(n) for n in self.model)
            steps = [r.step for r in mine if r.step is not None]
            assert steps == sorted(steps)

        @invariant()
        def reads_and_verify_match_model(self) -> None:
            for name, data in self.model.items():
                status = self.store.verify(self.full(name)).results[0].status
                if name in self.damaged:
                    assert status == "hash_mismatch"
                    with pytest.raises(IntegrityError):
                        self.store.read_bytes(self.full(name))
                else:
                    assert status == "ok"
                    assert self.store.read_bytes(self.full(name)) == data
            for name in {"s_1", "s_2", "d/s_3", "d/s_10"} - set(self.model):
                assert target.door.read(self.full(name)) is None

    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
