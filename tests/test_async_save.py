"""commitstore.torch.save_async and CommitStore.commit_async: the training loop waits only for a
snapshot. Snapshot isolation (in-place changes after the call are not committed), submission
order, bounded snapshots in flight, failures raised by the future and again by the next call until
observed, nothing shown before it landed, the exit flush (a real process that never closes its
store, with a mirror), and SIGKILLs of real processes during background writes, on a local store
and on S3 (moto), with automatic retention on: the previous step always verifies and is
``latest()``."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import commitstore.torch as cs_torch
from commitstore import (
    ConfigurationError,
    InvalidNameError,
    Retention,
    open_store,
)
from commitstore.digest import digest_bytes
from commitstore.testing.backdoor import LocalBackdoor, S3Backdoor

from .helpers.s3servers import BUCKET, MotoServer

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent


class Gate:
    """Pickled inside a saved object: blocks ``torch.save`` (on the worker thread) until opened,
    and says when pickling began."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __reduce__(self) -> tuple[Any, ...]:
        self.entered.set()
        assert self.release.wait(60), "the test never opened the gate"
        return (int, (7,))

    def __deepcopy__(self, memo: dict[int, Any]) -> Gate:
        return self  # the snapshot keeps the gate itself: the test drives it


class Counted:
    """Counts its snapshots (deep copies)."""

    taken = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> Counted:
        Counted.taken += 1
        return Counted()

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, (1,))


def test_a_tensor_changed_in_place_after_the_call_is_not_committed(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": 1}
    gate = Gate()
    fut = cs_torch.save_async({**state, "gate": gate}, store, "step_1.pt", step=1)
    gate.entered.wait(30)  # the background write has the snapshot and is pickling it
    state["w"].add_(1000.0)  # the next optimizer step, in place
    state["w"][0] = -1.0
    gate.release.set()
    rec = fut.result(timeout=60)
    assert rec.step == 1
    loaded = cs_torch.load(store, "step_1.pt", weights_only=False)
    assert torch.equal(loaded["w"], torch.arange(1000, dtype=torch.float32))
    store.close()


def test_views_keep_sharing_their_storage_in_the_snapshot(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    base = torch.arange(16, dtype=torch.float32)
    obj = {"a": base, "v": base[4:8]}
    cs_torch.save_async(obj, store, "v.pt").result(timeout=60)
    base.zero_()
    loaded = cs_torch.load(store, "v.pt")
    assert torch.equal(loaded["v"], torch.arange(4, 8, dtype=torch.float32))
    loaded["a"][5] = 99.0  # still one storage, as torch.save of the original would give
    assert loaded["v"][1] == 99.0
    store.close()


def test_commits_land_in_submission_order(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", async_inflight=3)
    futures = [
        cs_torch.save_async({"i": torch.tensor([i])}, store, "last.pt", step=i, overwrite=True)
        for i in range(8)
    ]
    records = [f.result(timeout=60) for f in futures]
    assert [r.step for r in records] == list(range(8))
    assert [r.created for r in records] == sorted(r.created for r in records)
    assert store.record("last.pt").step == 7
    assert cs_torch.load(store, "last.pt")["i"].item() == 7
    store.close()


def test_bad_arguments_raise_before_the_snapshot(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    Counted.taken = 0
    with pytest.raises(InvalidNameError):
        cs_torch.save_async({"c": Counted()}, store, "../up.pt")
    with pytest.raises(ConfigurationError):
        cs_torch.save_async({"c": Counted()}, store, "a.pt", step=-1)
    with pytest.raises(ConfigurationError):
        cs_torch.save_async({"c": Counted()}, store, "a.pt", overwrite="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        open_store(tmp_path / "s", async_inflight=0)
    assert Counted.taken == 0
    assert not (tmp_path / "s").exists()  # nothing was written either
    store.close()


def test_at_most_async_inflight_snapshots_exist(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", async_inflight=1)
    gate = Gate()
    first = cs_torch.save_async({"g": gate}, store, "a.pt")
    assert gate.entered.wait(30)
    Counted.taken = 0
    second: list[Any] = []
    caller = threading.Thread(
        target=lambda: second.append(cs_torch.save_async({"c": Counted()}, store, "b.pt"))
    )
    caller.start()
    caller.join(1.0)
    # the first commit still runs: the second call waits for its slot, snapshot not taken
    assert caller.is_alive() and Counted.taken == 0
    assert [r.name for r in store.list()] == []  # nothing in flight is listed
    gate.release.set()
    caller.join(60)
    assert not caller.is_alive() and Counted.taken == 1
    assert first.result(timeout=60).name == "a.pt"
    assert second[0].result(timeout=60).name == "b.pt"
    store.flush()
    assert store._engine().high_water == 1
    store.close()


def test_two_slots_take_the_second_snapshot_at_once(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", async_inflight=2)
    gate = Gate()
    first = cs_torch.save_async({"g": gate}, store, "a.pt")
    assert gate.entered.wait(30)
    Counted.taken = 0
    second = cs_torch.save_async({"c": Counted()}, store, "b.pt")  # returns while a.pt runs
    assert Counted.taken == 1 and not first.done()
    gate.release.set()
    assert second.result(timeout=60).name == "b.pt"
    assert store._engine().high_water == 2
    store.close()


def test_an_unobserved_failure_is_raised_by_the_next_call(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    bad = cs_torch.save_async({"f": lambda: 1}, store, "bad.pt")  # torch.save cannot pickle it
    while not bad.done():  # done() does not observe the outcome
        time.sleep(0.01)
    with pytest.raises(ConfigurationError, match=r"bad\.pt"):
        cs_torch.save_async({"x": torch.zeros(1)}, store, "next.pt")
    # raised once: the next call goes through
    cs_torch.save_async({"x": torch.zeros(1)}, store, "next.pt").result(timeout=60)
    assert [r.name for r in store.list()] == ["next.pt"]
    assert not (tmp_path / "s" / "bad.pt").exists()
    # flush and close raise it too
    cs_torch.save_async({"f": lambda: 1}, store, "bad2.pt")
    with pytest.raises(ConfigurationError, match=r"bad2\.pt"):
        store.flush()
    cs_torch.save_async({"f": lambda: 1}, store, "bad3.pt")
    with pytest.raises(ConfigurationError, match=r"bad3\.pt"):
        store.close()


def test_an_observed_failure_is_not_raised_again(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    bad = cs_torch.save_async({"f": lambda: 1}, store, "bad.pt")
    assert isinstance(bad.exception(timeout=60), ConfigurationError)
    cs_torch.save_async({"x": torch.zeros(1)}, store, "ok.pt").result(timeout=60)
    store.flush()
    store.close()


def test_retention_runs_only_after_the_new_commit_landed(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", retention=Retention(keep_last=1, min_age=0))
    cs_torch.save_async({"i": torch.tensor([0])}, store, "step_0.pt").result(timeout=60)
    gate = Gate()
    fut = cs_torch.save_async({"g": gate}, store, "step_1.pt")
    assert gate.entered.wait(30)
    assert [r.name for r in store.list()] == ["step_0.pt"]  # kept while step_1 is in flight
    latest = store.latest()
    assert latest is not None and latest.name == "step_0.pt"
    gate.release.set()
    fut.result(timeout=60)
    store.flush()
    assert [r.name for r in store.list()] == ["step_1.pt"]
    store.close()


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


EXIT_SCRIPT = """
import sys, time, torch, commitstore.torch as cs
from commitstore import open_store

class Slow:  # pickling takes a while, on the worker thread: commits are still running at exit
    def __deepcopy__(self, memo):
        return self
    def __reduce__(self):
        time.sleep(0.5)
        return (int, (1,))

store = open_store(sys.argv[1], mirrors=[sys.argv[2]], async_inflight=3)
for i in range(3):
    obj = {"w": torch.full((200_000,), float(i)), "slow": Slow()}
    cs.save_async(obj, store, f"step_{i}.pt", step=i)
print("queued", flush=True)
# no flush, no close: the interpreter exits with commits in flight
"""


def test_a_script_that_never_closes_its_store_lands_every_commit_and_copy(tmp_path: Path) -> None:
    primary, mirror = tmp_path / "p", tmp_path / "m"
    proc = _run(EXIT_SCRIPT, str(primary), str(mirror))
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert b"did not land" not in err and b"did not reach" not in err, err.decode()
    for root in (primary, mirror):
        door = LocalBackdoor(root)
        for i in range(3):
            data = door.read(f"step_{i}.pt")
            assert data is not None, (root, i)
            rec = open_store(root).record(f"step_{i}.pt")
            assert rec.digest == digest_bytes(data) and rec.step == i


KILL_SCRIPT = """
import sys, json, torch, commitstore.torch as cs
from commitstore import open_store, Retention
opts = json.loads(sys.argv[2])
store = open_store(sys.argv[1], retention=Retention(keep_last=1, min_age=0), **opts)
step = int(sys.argv[3])
while True:
    cs.save_async({"w": torch.full((300_000,), float(step))}, store, f"step_{step}.pt", step=step)
    print(step, flush=True)
    step += 1
"""


def _kill_rounds(url: str, opts: str, door_read: Any, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    step = 0
    for _ in range(rounds):
        proc = _run(KILL_SCRIPT, url, opts, str(step))
        assert proc.stdout is not None
        started = proc.stdout.readline()  # the first snapshot was taken
        assert started, proc.stderr.read() if proc.stderr else b""
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        store = open_store(url, **json.loads(opts))
        latest = store.latest()
        assert latest is not None and latest.step is not None
        data = door_read(latest.name)
        assert data is not None and digest_bytes(data) == latest.digest
        loaded = cs_torch.load(store, latest.name)
        assert loaded["w"][0].item() == float(latest.step)
        assert store.verify().ok
        step = latest.step + 1


def test_sigkill_during_background_writes_leaves_the_previous_step_local(tmp_path: Path) -> None:
    root = tmp_path / "s"
    cs_torch.save({"w": torch.full((300_000,), 0.0)}, open_store(root), "step_0.pt", step=0)
    _kill_rounds(str(root), "{}", LocalBackdoor(root).read, rounds=6, seed=1)


def test_sigkill_during_background_writes_leaves_the_previous_step_s3(
    moto: MotoServer,
) -> None:
    prefix = f"async{time.monotonic_ns()}"
    url, opts = moto.url(prefix), moto.options()
    store = open_store(url, **opts)
    cs_torch.save({"w": torch.full((300_000,), 0.0)}, store, "step_0.pt", step=0)
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    _kill_rounds(url, json.dumps(opts), door.read, rounds=4, seed=2)


def test_commits_that_miss_the_exit_bound_are_named_and_nothing_half_is_left(
    tmp_path: Path,
) -> None:
    primary, mirror = tmp_path / "p", tmp_path / "m"
    proc = _run(
        EXIT_SCRIPT, str(primary), str(mirror), env={"COMMITSTORE_EXIT_FLUSH_SECONDS": "0.2"}
    )
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    text = err.decode()
    assert "asynchronous commits that did not land before exit" in text
    assert "step_2.pt (still writing)" in text
    store = open_store(primary)
    assert store.verify().ok  # whatever landed is whole; the rest has no public name
    assert "step_2.pt" not in [r.name for r in store.list()]


def test_reused_snapshot_buffers_never_mix_two_steps(tmp_path: Path) -> None:
    """Buffers are reused across saves (no fresh allocation per save), yet each commit holds the
    state as it was at its own call, with two commits in flight and the state changed between."""
    store = open_store(tmp_path / "s", async_inflight=2)
    w = torch.zeros(50_000)
    futures = []
    gates = [Gate() for _ in range(6)]
    for step, gate in enumerate(gates):
        w.fill_(float(step))
        futures.append(cs_torch.save_async({"w": w, "g": gate}, store, f"s{step}.pt", step=step))
        if step >= 1:  # two in flight: open the older one's gate
            gates[step - 1].release.set()
    gates[-1].release.set()
    for step, fut in enumerate(futures):
        assert fut.result(timeout=60).step == step
        loaded = cs_torch.load(store, f"s{step}.pt", weights_only=False)
        assert torch.equal(loaded["w"], torch.full((50_000,), float(step))), step
    from commitstore.torch import _pools

    pool = _pools[store]
    assert 1 <= len(pool._free) <= 2  # at most async_inflight sets, reused
    ptrs = {b.tensors[0].data_ptr() for b in pool._free}
    cs_torch.save_async({"w": w}, store, "again.pt").result(timeout=60)
    assert {b.tensors[0].data_ptr() for b in pool._free} == ptrs  # no new buffer was made
    store.close()


LARGE = 3 * 1024 * 1024
"""Bytes of each tensor below (several pages, beyond the allocator's small-object pools)."""


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.bfloat16, torch.float64, torch.int8, torch.bool, torch.complex64],
)
def test_large_snapshots_of_every_dtype_are_whole_isolated_and_reused(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    """Large tensors of every kind: what is committed is each tensor as it
    was at the call (changed in place right after, twice, with the buffers reused by the second
    save), of the same dtype and shape, and the buffer set is reused, not made again."""
    store = open_store(tmp_path / "s")
    count = LARGE // torch.empty((), dtype=dtype).element_size()
    g = torch.Generator().manual_seed(1)
    w = (torch.rand(count, generator=g) * 100).to(dtype).reshape(4, -1)
    states = []
    for step in range(2):
        states.append(w.clone())
        fut = cs_torch.save_async({"w": w}, store, f"s{step}.pt")
        w.add_(1) if dtype != torch.bool else w.logical_not_()  # the next step, in place
        assert fut.result(timeout=60).size > LARGE
    for step, expected in enumerate(states):
        loaded = cs_torch.load(store, f"s{step}.pt")
        assert loaded["w"].dtype == dtype and loaded["w"].shape == expected.shape
        assert torch.equal(loaded["w"], expected), step
    from commitstore.torch import _pools

    (buffers,) = _pools[store]._free
    ptr = buffers.tensors[0].data_ptr()
    cs_torch.save_async({"w": w}, store, "again.pt").result(timeout=60)
    assert _pools[store]._free[0].tensors[0].data_ptr() == ptr
    store.close()
