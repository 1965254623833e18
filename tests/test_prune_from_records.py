"""A prune planned from the records' listing alone (``Capabilities.plans_from_records``, object
stores) plans exactly what a plan that lists every data file plans, and looks at data only
where the plan depends on it.

The equivalence is checked on random stores (a primary and a mirror, artifacts on either or
both, each copy whole, truncated, missing or bit-rotted, files and folders, aliases, random
policies), the same two targets planned both ways. On moto, the requests: one listing of the
records, never of the data, and one HEAD per artifact the plan depends on; an artifact whose
commit is in flight (its pending record listed) has its data checked, so a dry run reports it
as the real run would treat it; and a real prune deletes what the plan said, nothing it kept.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from commitstore import CommitStore, open_store
from commitstore import _verify as _check
from commitstore.layout import intent_parts
from commitstore.maintenance import prune as prune_mod
from commitstore.maintenance.retention import Retention
from commitstore.testing import S3Backdoor

from .helpers.s3servers import BUCKET, MotoServer

DAMAGE = ["whole", "whole", "whole", "truncated", "missing", "rotted"]

artifact = st.fixed_dictionaries(
    {
        "folder": st.booleans(),
        "on_a": st.sampled_from([*DAMAGE, None]),
        "on_b": st.sampled_from([*DAMAGE, None]),
    }
)
policy = st.builds(
    Retention,
    keep_last=st.one_of(st.none(), st.integers(0, 6)),
    keep_every=st.one_of(st.none(), st.integers(1, 5)),
    keep=st.lists(st.sampled_from([f"a{i:02d}" for i in range(12)]), max_size=2).map(tuple),
    min_age=st.just(0),
)


def _damage(root: Path, name: str, how: str) -> None:
    target = root / name
    files = sorted(p for p in target.rglob("*") if p.is_file()) if target.is_dir() else [target]
    victim = files[-1]
    if how == "truncated":
        victim.write_bytes(victim.read_bytes()[:-1])
    elif how == "missing":
        victim.unlink()
    elif how == "rotted":
        data = bytearray(victim.read_bytes())
        data[0] ^= 0x40
        victim.write_bytes(bytes(data))


def _put(store: CommitStore, root: Path, i: int, spec: dict[str, Any], how: str) -> None:
    name = f"a{i:02d}"
    body = bytes([i]) * (64 + i)
    if spec["folder"]:
        with store.stage_dir(name, step=i) as d:
            (d / "model.bin").write_bytes(body)
            (d / "opt.bin").write_bytes(body[::-1])
    else:
        store.put_bytes(name, body, step=i)
    _damage(root, name, how)


def _prune(targets: list[Any], pol: Retention, *, from_records: bool, dry_run: bool) -> Any:
    for t in targets:  # local stores: their capabilities are a class attribute
        caps = t.backend.capabilities
        t.backend.capabilities = dataclasses.replace(caps, plans_from_records=from_records)
    try:
        now = time.time() + 1e6 if dry_run else None
        report = prune_mod.prune(targets, pol, pending={}, dry_run=dry_run, now=now)
    finally:
        for t in targets:
            del t.backend.capabilities
    return [(t.deleted, t.kept, t.skipped) for t in report.targets]


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and "cache" not in p.parts and not p.name.startswith(".commitstore.lock")
    }


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arts=st.lists(artifact, min_size=1, max_size=12),
    alias=st.sampled_from([None, "whole", "missing"]),
    pol=policy,
)
@example(  # nothing to delete, so nothing hashed: only the guard's own check finds the newest bad
    arts=[
        {"folder": False, "on_a": "whole", "on_b": None},
        {"folder": False, "on_a": "truncated", "on_b": None},
    ],
    alias=None,
    pol=Retention(keep=("a00",), min_age=0),
)
def test_a_prune_planned_from_the_records_does_what_one_from_every_data_file_does(
    arts: list[dict[str, Any]], alias: str | None, pol: Retention
) -> None:
    """The same primary and mirror, copied, pruned both ways: the same reports and the same
    files left. The dry runs' plans are the same too, except that a record whose data is
    missing has no data mtime: checking every data file skips it as "unknown mtime" at once;
    from the records, unless the plan checked its data, it is planned by its record's time and
    skipped by the delete's re-check (so the real runs agree). A plan checks an artifact's
    data at most once per target, an alias's never."""
    with tempfile.TemporaryDirectory() as tmp:
        roots = (Path(tmp) / "a", Path(tmp) / "b")
        for r in roots:  # a target may get no write (opening a store creates nothing)
            r.mkdir()
        stores = [open_store(r) for r in roots]
        for i, spec in enumerate(arts):
            for store, root, how in zip(stores, roots, (spec["on_a"], spec["on_b"]), strict=True):
                if how is not None:
                    _put(store, root, i, spec, how)
        if alias is not None:
            stores[0].put_bytes("last.ckpt", b"alias", alias=True)
            _damage(roots[0], "last.ckpt", alias)
        copies = [Path(tmp) / "a2", Path(tmp) / "b2"]
        for src, dst in zip(roots, copies, strict=True):
            shutil.copytree(src, dst)
        targets = [s._committer for s in stores]
        twins = [open_store(r)._committer for r in copies]
        checks: Counter[tuple[int, str]] = Counter()
        real_check = prune_mod._check_data

        def counted(store: Any, item: prune_mod.Listed) -> prune_mod.Listed:
            checks[(id(store), item.record.name)] += 1
            return real_check(store, item)

        eager_plan = _prune(targets, pol, from_records=False, dry_run=True)
        prune_mod._check_data = counted
        try:
            lazy_plan = _prune(targets, pol, from_records=True, dry_run=True)
            assert all(n == 1 for n in checks.values()), checks
            assert not any(name == "last.ckpt" for _t, name in checks)
            lazy = _prune(twins, pol, from_records=True, dry_run=False)
        finally:
            prune_mod._check_data = real_check
        eager = _prune(targets, pol, from_records=False, dry_run=False)
        assert lazy == eager
        for src, dst in zip(roots, copies, strict=True):
            assert _tree(src) == _tree(dst)
        for (e_del, e_kept, e_skip), (l_del, l_kept, l_skip), root in zip(
            eager_plan, lazy_plan, roots, strict=True
        ):
            unknown = {n for n, why in e_skip.items() if why == "unknown mtime"}
            assert all(not (root / n).exists() or (root / n).is_dir() for n in unknown)
            moved = set(l_del) - set(e_del)  # those not checked: planned by the record
            assert l_kept == e_kept
            assert set(e_del) <= set(l_del) and moved <= unknown
            assert l_skip == {n: why for n, why in e_skip.items() if n not in moved}


def test_prune_on_moto_lists_the_records_only_and_heads_what_the_plan_needs(
    moto: MotoServer,
) -> None:
    """40 artifacts, keep 3 and every 10th: two listings (of the records, and of the writers'
    pending records, which name commits in flight), and a HEAD for each
    of the 3 + 3 the policy keeps (the newest is among them): no data listing, no other HEAD.
    A real prune then deletes exactly what the dry run said, and what it kept still verifies."""
    prefix = f"lazy{time.monotonic_ns()}"
    url = f"s3://{BUCKET}/{prefix}"
    store = open_store(url, **moto.options())
    for i in range(40):
        store.put_bytes(f"step_{i:03d}.pt", os.urandom(100), step=i)
    fresh = open_store(url, **moto.options())
    calls: Counter[str] = Counter()
    prefixes: list[str] = []
    backend: Any = fresh._backend
    real = backend.fs._call_s3
    lock = threading.Lock()

    async def counted(method: str, *a: Any, **k: Any) -> Any:
        with lock:
            calls[method] += 1
        if method == "list_objects_v2":
            prefixes.append(k["Prefix"])
        return await real(method, *a, **k)

    backend.fs._call_s3 = counted
    sync_call = backend.fs.call_s3

    def counted_sync(method: str, *a: Any, **k: Any) -> Any:
        with lock:
            calls[method] += 1
        return sync_call(method, *a, **k)

    backend.fs.call_s3 = counted_sync
    plan = fresh.prune(keep_last=3, keep_every=10, min_age=0, dry_run=True)
    kept = {f"step_{i:03d}.pt" for i in (0, 10, 20, 30, 37, 38, 39)}
    assert set(plan.kept) == kept
    assert len(plan.deleted) == 33
    assert prefixes == [f"{prefix}/.commitstore/records/", f"{prefix}/.commitstore/pending/"]
    # one HEAD per kept artifact (the newest among them), and those of the newest's full check
    newest = fresh.record("step_039.pt")
    planned, calls = dict(calls), Counter()
    assert _check.check(fresh._backend, newest, "full").status == "ok"
    assert planned["head_object"] == len(kept) + calls["head_object"], (planned, calls)
    report = fresh.prune(keep_last=3, keep_every=10, min_age=0)
    assert report.deleted == plan.deleted
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    left = {f for f in door.files() if not f.startswith(".commitstore/")}
    assert left == kept
    assert all(fresh.verify(name, level="full").ok for name in kept)


def test_a_name_with_its_commit_in_flight_is_planned_from_its_data(moto: MotoServer) -> None:
    """An old artifact whose data was just replaced, its pending record beside its old record
    (as an overwrite leaves them before the new record is published): the plan checks its data,
    which is younger than ``min_age``, so a dry run keeps it, as the real run's re-check would.
    Once the pending record is gone, the plan goes by the record's time, and the real run's
    re-check of the data (fresh stats under the publish lock) still keeps it."""
    prefix = f"inflight{time.monotonic_ns()}"
    url = f"s3://{BUCKET}/{prefix}"
    store = open_store(url, **moto.options())
    for i in range(4):
        store.put_bytes(f"step_{i}.pt", bytes([i]) * 50, step=i)
    door = S3Backdoor(moto.client(), BUCKET, prefix)
    old_record = door.read(".commitstore/records/.commitstore.rec.step_0.pt.json")
    assert old_record is not None
    time.sleep(2.1)  # S3 keeps whole seconds: the data is >= 2 s younger than its record
    pending = "/".join(intent_parts(("step_0.pt",)))
    door.write(pending, old_record)
    door.write("step_0.pt", bytes([0]) * 50)
    now = time.time() + 1  # the records look >= 3 s old, the new data < 2 s
    policy = Retention(keep_last=1, min_age=2)

    def plan() -> prune_mod.PruneReport:
        fresh = open_store(url, **moto.options())
        return prune_mod.prune([fresh._committer], policy, pending={}, dry_run=True, now=now)

    first = plan()
    assert set(first.deleted) == {"step_1.pt", "step_2.pt"}, first
    assert first.skipped == {"step_0.pt": "younger than min_age"}, first
    door.remove(pending)
    assert set(plan().deleted) == {"step_0.pt", "step_1.pt", "step_2.pt"}
    fresh = open_store(url, **moto.options())
    real = prune_mod.prune(
        [fresh._committer],
        Retention(keep_last=1, min_age=600),
        pending={},
        dry_run=False,
        now=time.time() + 700,
    )
    assert real.skipped.get("step_0.pt", "").startswith("modified since the plan"), real
    assert door.read("step_0.pt") == bytes([0]) * 50
    assert fresh.verify("step_0.pt", level="full").ok


@pytest.mark.parametrize("policy_kw", [{"keep_last": 2}, {"keep_every": 5}], ids=["last", "every"])
def test_a_name_whose_records_differ_between_targets_is_placed_by_its_whole_copy(
    tmp_path: Path, policy_kw: dict[str, int]
) -> None:
    """The primary's ``A.pt`` (step 1) has lost its data; the mirror's ``A.pt`` is another,
    whole version (step 10 of 4). Checking every data file orders ``A.pt`` by the mirror's
    record, so the policy keeps it; planned from the records, the primary's copy must be
    checked too, or ``A.pt`` is placed by its stale record and the mirror's whole, verifying
    copy is deleted."""
    roots = (tmp_path / "p", tmp_path / "m")
    primary, mirror = (open_store(r) for r in roots)
    for i, name in enumerate(("A.pt", "B.pt", "C.pt"), start=1):
        primary.put_bytes(name, bytes([i]) * 100, step=i)
    for step, name in ((6, "Y.pt"), (7, "Z.pt"), (10, "A.pt"), (11, "W.pt")):
        mirror.put_bytes(name, bytes([step]) * 100, step=step)
    (roots[0] / "A.pt").unlink()
    copies = (tmp_path / "p2", tmp_path / "m2")
    for src, dst in zip(roots, copies, strict=True):
        shutil.copytree(src, dst)
    pol = Retention(min_age=0, **policy_kw)  # type: ignore[arg-type]
    eager = _prune([primary._committer, mirror._committer], pol, from_records=False, dry_run=False)
    twins = [open_store(r)._committer for r in copies]
    lazy = _prune(twins, pol, from_records=True, dry_run=False)
    assert lazy == eager
    assert "A.pt" in eager[1][1], eager  # kept on the mirror
    assert open_store(copies[1]).verify("A.pt", level="full").ok
