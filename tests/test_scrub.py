"""Scrub: a rolling, budgeted full verification of the primary and every mirror, with repair.

Damage is made through backdoors (never through the API under test) on a local primary and two
mirrors on real servers (S3 on moto, SMB on Samba); concurrent writers are real processes.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, ConfigurationError, ScrubReport, open_store
from commitstore.cli import main as cli_main
from commitstore.testing import Backdoor, LocalBackdoor, S3Backdoor, record_path

from .helpers.s3servers import BUCKET, MotoServer
from .helpers.samba import PASSWORD, SambaServer

ROOT_DIR = Path(__file__).resolve().parent.parent
STATE = ".commitstore/scrub/state.json"


@dataclass
class Side:
    url: str
    options: dict[str, Any]
    door: Backdoor

    def open(self, **kw: Any) -> CommitStore:
        return open_store(self.url, **self.options, **kw)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("scrub-servers")
    started: dict[str, Any] = {}
    try:
        started["samba"] = SambaServer(base / "samba")
        started["moto"] = MotoServer(base / "moto")
        yield started
    finally:
        for server in started.values():
            server.stop()


def side(kind: str, servers: dict[str, Any], tmp: Path) -> Side:
    sub = f"{kind}{time.monotonic_ns()}"
    if kind == "local":
        return Side(str(tmp / sub), {}, LocalBackdoor(tmp / sub))
    if kind == "smb":
        samba: SambaServer = servers["samba"]
        return Side(samba.url(sub), {"password": PASSWORD}, LocalBackdoor(samba.share_dir / sub))
    moto: MotoServer = servers["moto"]
    return Side(moto.url(sub), moto.options(), S3Backdoor(moto.client(), BUCKET, sub))


def flip(door: Backdoor, rel: str, rng: random.Random) -> None:
    data = bytearray(door.read(rel) or b"")
    bit = rng.randrange(len(data) * 8)
    data[bit // 8] ^= 1 << (bit % 8)
    door.write(rel, bytes(data))


def truncate(door: Backdoor, rel: str, rng: random.Random) -> None:
    data = door.read(rel) or b""
    door.write(rel, data[: rng.randrange(len(data))])


def delete(door: Backdoor, rel: str, rng: random.Random) -> None:
    door.remove(rel)


DAMAGE: dict[str, Callable[[Backdoor, str, random.Random], None]] = {
    "flip": flip,
    "truncate": truncate,
    "delete": delete,
}


def payloads(n: int, seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"ckpt/step_{i:03d}.pt": rng.randbytes(rng.randrange(1, 40_000)) for i in range(n)}


def fill(store: CommitStore, data: dict[str, bytes]) -> None:
    for name, body in data.items():
        store.put_bytes(name, body)
    store.flush()


def whole_everywhere(sides: list[Side], data: dict[str, bytes], names: set[str]) -> None:
    for s in sides:
        with s.open() as store:
            for name in names:
                assert store.read_bytes(name) == data[name], (s.url, name)


@pytest.mark.parametrize("primary_kind", ["local", "s3", "smb"])
def test_random_damage_on_local_s3_and_smb_found_and_repaired_in_one_cycle(
    servers: dict[str, Any], tmp_path: Path, primary_kind: str
) -> None:
    """Bit flips, truncations and deletions of data (and, on mirrors, of records) at random
    across a primary and two mirrors, local, S3 (moto) and SMB (Samba) each in turn the
    primary: one unbudgeted run (a full cycle) finds every damaged copy, repairs every one that
    has a whole copy under the same record somewhere, and reports the others; a second run
    finds only those."""
    rng = random.Random(2711)
    primary = side(primary_kind, servers, tmp_path)
    mirrors = [side(k, servers, tmp_path) for k in ("local", "s3", "smb") if k != primary_kind]
    sides = [primary, *mirrors]
    data = payloads(24, 5)
    with primary.open(mirrors=[m.open() for m in mirrors], mirror_mode="sync") as store:
        fill(store, data)
    damaged: dict[str, set[int]] = {}
    names = sorted(data)
    for name in names[:-2]:
        hit = {i for i in range(3) if rng.random() < 0.4}
        for i in hit:
            kind = rng.choice([*DAMAGE, "record"] if i else list(DAMAGE))
            if kind == "record":
                sides[i].door.remove(record_path(name))
            else:
                DAMAGE[kind](sides[i].door, name, rng)
        if hit:
            damaged[name] = hit
    for i in range(3):  # every copy damaged: nothing to repair from
        DAMAGE[["flip", "truncate", "delete"][i]](sides[i].door, names[-1], rng)
    damaged[names[-1]] = {0, 1, 2}
    assert any(len(h) == 1 for h in damaged.values()) and any(0 in h for h in damaged.values())

    with primary.open(mirrors=[m.open() for m in mirrors]) as store:
        report = store.scrub()
    assert report.complete and not report.ok
    assert all(t.repaired for t in report.targets)  # every target got repairs
    for i, t in enumerate(report.targets):
        found = {n for n, h in damaged.items() if i in h}
        assert set(t.found) == found, t.url
        repairable = {n for n in found if len(damaged[n]) < 3}
        assert set(t.repaired) == repairable, t.url
        assert set(t.unrepaired) == found - repairable, t.url
    lost = {n for n, h in damaged.items() if len(h) == 3}
    whole_everywhere(sides, data, set(names) - lost)

    with primary.open(mirrors=[m.open() for m in mirrors]) as store:
        again = store.scrub()
    for t in again.targets:
        assert set(t.found) == lost, t.url
        assert t.coverage[1] == pytest.approx((len(names) - len(lost)) / len(names))


def test_primary_copy_restored_only_from_an_identical_record(tmp_path: Path) -> None:
    """A damaged primary copy is restored from the mirror whose record is byte-identical; a
    mirror holding another version (copies that disagree on the record) is never used, and
    the name is reported."""
    p, m1, m2 = (tmp_path / n for n in ("p", "m1", "m2"))
    with open_store(str(p), mirrors=[str(m1), str(m2)], mirror_mode="sync") as store:
        store.put_bytes("a.bin", b"A" * 5000)
        store.put_bytes("b.bin", b"B" * 5000)
    with open_store(str(m1)) as other:  # m1 holds another version of b.bin
        other.put_bytes("b.bin", b"other" * 100, overwrite=True)
    with open_store(str(m2)) as other:
        other.put_bytes("b.bin", b"other2" * 100, overwrite=True)
    flip(LocalBackdoor(p), "a.bin", random.Random(1))
    flip(LocalBackdoor(p), "b.bin", random.Random(1))
    LocalBackdoor(m1).remove("a.bin")  # m1's copy of a.bin is bad: m2's is the source
    with open_store(str(p), mirrors=[str(m1), str(m2)]) as store:
        report = store.scrub()
        assert report.targets[0].repaired == {"a.bin": str(m2)}
        assert "disagree" in report.targets[0].unrepaired["b.bin"]
        assert store.read_bytes("a.bin") == b"A" * 5000
    for root, body in ((m1, b"other" * 100), (m2, b"other2" * 100)):
        assert open_store(str(root)).read_bytes("b.bin") == body  # never overwritten


def test_budget_bytes_honoured_within_one_artifact_and_cycle_covers_every_copy(
    tmp_path: Path,
) -> None:
    """Each budgeted run reads less than the budget before its last copy; runs from fresh
    processes' views (each opens the stores anew: the state is on the targets) verify the copies
    least recently verified first, so ceil(total / budget) + 1 runs cover every copy, and a
    copy damaged after the first run is found within the cycle."""
    data = payloads(12, 9)
    p, m = tmp_path / "p", tmp_path / "m"
    with open_store(str(p), mirrors=[str(m)], mirror_mode="sync") as store:
        fill(store, data)
    total = 2 * sum(len(b) for b in data.values())
    budget = total // 5
    sizes = {(str(root), n): len(b) for n, b in data.items() for root in (p, m)}
    seen: list[set[tuple[str, str]]] = []
    damaged = ("p", sorted(data)[-1])
    for run in range(math.ceil(total / budget) + 1):
        with open_store(str(p), mirrors=[str(m)]) as store:
            report = store.scrub(budget_bytes=budget)
        copies = [(t.url, n) for t in report.targets for n in t.verified]
        read = sum(sizes[c] for c in copies)
        assert read == report.bytes_verified
        assert read - max(sizes[c] for c in copies) < budget  # within one artifact
        if run == 1:  # least recently verified first: nothing of the first run again
            assert not set(copies) & seen[0]
        seen.append(set(copies))
        if run == 0:
            flip(LocalBackdoor(p), damaged[1], random.Random(3))
        if damaged[1] in report.targets[0].found:
            assert report.targets[0].repaired == {damaged[1]: str(m)}
    assert set().union(*seen) == set(sizes)
    assert open_store(str(p)).verify().ok


def test_tiny_budgets_verify_exactly_one_copy_per_run(tmp_path: Path) -> None:
    """A budget spent by the first copy (or by listing, for seconds) still lets that one copy
    run, and stops before the next: every run makes progress, within one artifact."""
    with open_store(str(tmp_path / "s")) as store:
        fill(store, payloads(3, 1))
        for kw in ({"budget_bytes": 1}, {"budget_seconds": 1e-9}):
            report = store.scrub(**kw)
            assert len(report.targets[0].verified) == 1 and not report.complete


@pytest.mark.parametrize(
    "kw",
    [
        {"budget_bytes": 0},
        {"budget_bytes": -5},
        {"budget_bytes": True},
        {"budget_seconds": float("nan")},
        {"budget_seconds": "10"},
        {"repair": "yes"},
    ],
)
def test_bad_arguments_are_typed_errors_before_any_io(tmp_path: Path, kw: dict[str, Any]) -> None:
    store = open_store(str(tmp_path / "never"))
    with pytest.raises(ConfigurationError):
        store.scrub(**kw)
    assert not (tmp_path / "never").exists()


def _writer_hook(store: CommitStore, name: str, on: str, body: bytes, *, nth: int = 1) -> list[str]:
    """Make the ``nth`` read of ``name`` from ``store``'s storage commit ``body`` under ``name``
    on ``on`` from another process (a concurrent writer landing in the middle of a repair)."""
    backend = store._committer.backend
    real = backend.open_read
    fired: list[str] = []
    reads = [0]

    def open_read(parts: tuple[str, ...], *a: Any, **kw: Any) -> Any:
        reads[0] += "/".join(parts) == name
        if "/".join(parts) == name and reads[0] == nth:
            fired.append(name)
            code = (
                "import sys; from commitstore import open_store; "
                "open_store(sys.argv[1]).put_bytes(sys.argv[2], sys.argv[3].encode(), "
                "overwrite=True)"
            )
            subprocess.run(
                [sys.executable, "-c", code, on, name, body.decode()],
                check=True,
                env={**os.environ, "PYTHONPATH": str(ROOT_DIR / "src")},
            )
        return real(parts, *a, **kw)

    setattr(backend, "open_read", open_read)  # noqa: B010 - this instance only
    return fired


def test_writer_committing_during_a_primary_repair_is_never_reverted(tmp_path: Path) -> None:
    """The primary's copy is damaged; while scrub reads the mirror's copy to restore it, a
    writer process commits a new version on the primary. The new version stands: the repair's
    last check sees the record changed and publishes nothing."""
    p, m = tmp_path / "p", tmp_path / "m"
    with open_store(str(p), mirrors=[str(m)], mirror_mode="sync") as store:
        store.put_bytes("x.bin", b"old" * 4000)
    flip(LocalBackdoor(p), "x.bin", random.Random(7))
    mirror = open_store(str(m))
    store = open_store(str(p), mirrors=[mirror])
    fired = _writer_hook(mirror, "x.bin", str(p), b"new" * 10)
    report = store.scrub()
    assert fired
    assert "x.bin" in report.targets[0].superseded and not report.targets[0].repaired
    assert open_store(str(p)).read_bytes("x.bin") == b"new" * 10


def test_writer_committing_during_a_mirror_repair_is_never_reverted(tmp_path: Path) -> None:
    """The mirror's copy is damaged; while scrub reads the primary's copy to repair it, another
    writer commits a new version on the mirror: it is kept."""
    p, m = tmp_path / "p", tmp_path / "m"
    with open_store(str(p), mirrors=[str(m)], mirror_mode="sync") as store:
        store.put_bytes("x.bin", b"old" * 4000)
    truncate(LocalBackdoor(m), "x.bin", random.Random(7))
    store = open_store(str(p), mirrors=[str(m)])
    # the primary's own check reads it first; the repair's copy reads it second
    fired = _writer_hook(store, "x.bin", str(m), b"newer" * 10, nth=2)
    report = store.scrub()
    assert fired
    assert "x.bin" in report.targets[1].superseded and not report.targets[1].repaired
    assert open_store(str(m)).read_bytes("x.bin") == b"newer" * 10


def test_state_is_untrusted_and_survives_gc(tmp_path: Path) -> None:
    """Scrub state that is not JSON, or JSON of another shape, is no state (every copy is
    verified again, no error); gc never removes the state."""
    root = tmp_path / "s"
    door = LocalBackdoor(root)
    with open_store(str(root)) as store:
        fill(store, payloads(4, 2))
        for garbage in (b"\xff{not json", b"[]", json.dumps({"schema": 1}).encode(), b"{" * 5000):
            door.write(STATE, garbage)
            assert len(store.scrub(budget_bytes=10**9).targets[0].verified) == 4
        doc = json.loads(door.read(STATE) or b"")
        doc["verified"]["ckpt/step_000.pt"] = ["x", None, "y"]  # one bad entry: that one only
        doc["verified"]["../../etc"] = [1, "xxh3_128:00", 1]
        doc["verified"]["ckpt/step_001.pt"][2] = time.time() + 10**9  # far ahead: no state
        door.write(STATE, json.dumps(doc).encode())
        report = store.scrub(budget_bytes=1)
        assert report.targets[0].verified == ("ckpt/step_000.pt",)
        report = store.scrub(budget_bytes=1)
        assert report.targets[0].verified == ("ckpt/step_001.pt",)
        store.gc(min_age=0)
        assert door.read(STATE) is not None


def test_cli_scrub_exit_status_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p, m = tmp_path / "p", tmp_path / "m"
    with open_store(str(p), mirrors=[str(m)], mirror_mode="sync") as store:
        fill(store, payloads(3, 4))
    flip(LocalBackdoor(m), "ckpt/step_001.pt", random.Random(1))
    assert cli_main(["scrub", str(p), str(m), "--no-repair", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["targets"][1]["unrepaired"]) == ["ckpt/step_001.pt"]
    assert cli_main(["scrub", str(p), "--mirror", str(m)]) == 0  # --mirror names one too
    out = capsys.readouterr().out
    assert "repaired ckpt/step_001.pt (hash_mismatch" in out
    assert cli_main(["scrub", str(p), "--budget-bytes", "0"]) == 2


def test_report_type_is_exported() -> None:
    assert ScrubReport.__module__ == "commitstore.maintenance.scrub"


def test_benchmark_suite_runs_at_a_tiny_size(tmp_path: Path) -> None:
    """The scrub benchmark's pair (plain read vs scrub of the same copies) at a tiny size: both
    ops run in their worker processes and the scrub finds every copy whole."""
    from benchmarks import scrub as bench

    bench.prepare(tmp_path, 64 * 1024)
    for cold in (False, True):
        result = bench.measure(tmp_path, 2 * 64 * 1024, 1, cold=cold)
        assert (result["baseline"], result["ours"]) == ("read_copies", "scrub_copies")
        assert result["ratio"] > 0


def test_bad_records_and_foreign_copies(tmp_path: Path) -> None:
    """A mirror's unreadable record is a damaged copy, repaired from the primary; the primary's
    own unreadable record is reported (no record to compare copies with), never "repaired"; a
    damaged mirror copy of a name the primary does not hold is reported, never touched."""
    p, m = tmp_path / "p", tmp_path / "m"
    with open_store(str(p), mirrors=[str(m)], mirror_mode="sync") as store:
        fill(store, payloads(3, 8))
    with open_store(str(m)) as other:
        other.put_bytes("only-here.bin", b"x" * 3000)
    pdoor, mdoor = LocalBackdoor(p), LocalBackdoor(m)
    mdoor.write(record_path("ckpt/step_000.pt"), b"{not a record")
    pdoor.write(record_path("ckpt/step_001.pt"), b"\x00" * 10)
    truncate(mdoor, "only-here.bin", random.Random(2))
    with open_store(str(p), mirrors=[str(m)]) as store:
        report = store.scrub()
    primary, mirror = report.targets
    assert primary.found["ckpt/step_001.pt"].startswith("bad_record")
    assert "unreadable" in primary.unrepaired["ckpt/step_001.pt"]
    assert pdoor.read(record_path("ckpt/step_001.pt")) == b"\x00" * 10  # left as it is
    assert mirror.found["ckpt/step_000.pt"].startswith("bad_record")
    assert mirror.repaired == {"ckpt/step_000.pt": str(p)}
    assert "primary holds no copy" in mirror.unrepaired["only-here.bin"]
    assert open_store(str(m)).verify("ckpt/step_000.pt").ok
    assert not report.ok


def test_cli_progress_bar_and_budget_summary(tmp_path: Path) -> None:
    """``--progress`` draws the bytes read against the most the run reads (its budget here),
    ending at 100%; never with ``--json``. Runs as a real process, stderr as a user sees it."""
    p = tmp_path / "p"
    with open_store(str(p)) as store:
        for i in range(4):
            store.put_bytes(f"a{i}.bin", bytes([i]) * 4096)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "commitstore", *argv],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT_DIR / "src")},
            check=False,
        )

    done = run("scrub", str(p), "--budget-bytes", "8192", "--progress")
    assert done.returncode == 0, done.stderr
    assert "scrub [" in done.stderr and "100.0%" in done.stderr and "8.0 KiB" in done.stderr
    assert "2 of 4 copies verified (8192 bytes)" in done.stdout
    assert "budget spent" in done.stdout
    assert run("scrub", str(p), "--progress", "--json").stderr == ""


def test_mirror_copy_met_first_waits_for_the_primary_repair_in_the_same_run(
    tmp_path: Path,
) -> None:
    """When a mirror's damaged copy comes up before the primary's (its check is older) and the
    primary's copy turns out damaged too while it is copied, the primary is repaired first from
    the other mirror, then the copy is made: one run repairs both."""
    p, m1, m2 = (tmp_path / n for n in ("p", "m1", "m2"))
    with open_store(str(p), mirrors=[str(m1), str(m2)], mirror_mode="sync") as store:
        store.put_bytes("x.bin", b"x" * 9000)
        store.scrub()  # every copy checked once: state on each target
    later = json.loads(LocalBackdoor(p).read(STATE) or b"")
    later["verified"]["x.bin"][2] += 3600  # the primary's check is the newest
    LocalBackdoor(p).write(STATE, json.dumps(later).encode())
    flip(LocalBackdoor(p), "x.bin", random.Random(4))
    truncate(LocalBackdoor(m1), "x.bin", random.Random(4))
    with open_store(str(p), mirrors=[str(m1), str(m2)]) as store:
        report = store.scrub(budget_bytes=9000)  # one copy's worth: the first in order
        primary, first, _second = report.targets
        assert first.repaired == {"x.bin": str(p)}
        assert primary.repaired == {"x.bin": str(m2)}
        assert report.ok
        assert store.read_bytes("x.bin") == b"x" * 9000


def test_a_mirror_that_cannot_be_listed_is_reported_and_the_others_scrubbed(
    tmp_path: Path,
) -> None:
    """An S3 mirror whose endpoint accepts connections and never answers: the scrub reports
    it (``error``, not ok, exit 1) and still verifies the primary and the other mirror."""
    from .helpers.blackhole import Blackhole

    p, m = tmp_path / "p", tmp_path / "m"
    with open_store(str(p), mirrors=[str(m)], mirror_mode="sync") as store:
        fill(store, payloads(2, 6))
    with Blackhole() as hole:
        down = open_store(
            "s3://bucket/down",
            endpoint_url=hole.url,
            key="k",
            secret="s",
            connect_timeout=1,
            read_timeout=1,
            retries=1,
        )
        report = open_store(str(p), mirrors=[str(m), down]).scrub()
    primary, mirror, hung = report.targets
    assert len(primary.verified) == 2 and len(mirror.verified) == 2
    assert hung.error and not hung.verified and not report.ok
