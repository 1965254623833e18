"""A local scan reads its records through one descriptor of the records folder (issue 15).

The cost is counted, not timed: every ``os.open`` of a scan goes through a counting wrapper, and
a scan of N records must open the records folder (and each folder in it) once, and each record
once, whatever N is. The safety of the old per-record read is kept and checked on a listing that
is stale by the time the records are read (the window a concurrent writer has): a record
replaced by a FIFO, a symlink or a symlinked folder is ``bad_record`` (never followed, never
blocking), one that grew past the bound is ``bad_record`` without being read whole, one deleted
is left out, an aside entry of a missing record is read in its place, and no descriptor leaks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitstore import CommitStore, open_store
from commitstore._scan import NOT_REGULAR, scan_records
from commitstore.backends.rename.posix.bridge import BridgeBackend
from commitstore.layout import META_DIR, RECORDS_DIR, aside_part
from commitstore.records import MAX_RECORD_BYTES, _parse_time
from commitstore.testing import record_path

from .helpers.blocking import mkfifo, returns

RECORDS = (META_DIR, RECORDS_DIR)


class OpenCounter:
    """Counts ``os.open`` calls by the name opened (the last path part)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real = os.open

        def counting(path: Any, *args: Any, **kwargs: Any) -> int:
            self.names.append(os.path.basename(os.fsdecode(path)))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", counting)

    def of(self, name: str) -> int:
        return self.names.count(name)


def _store(root: Path, n: int) -> CommitStore:
    store = open_store(root)
    for i in range(n):
        store.put_bytes(f"a/step_{i}.pt", b"a" * 10)
        store.put_bytes(f"b/step_{i}.pt", b"b" * 10)
    store.put_bytes("top.pt", b"t", step=0)
    return store


@pytest.mark.parametrize("n", [3, 12])
def test_a_scan_opens_each_folder_once_and_each_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    store = _store(tmp_path / "s", n)
    listing = store._backend.walk(RECORDS)
    opens = OpenCounter(monkeypatch)
    good, bad = scan_records(store._backend, listing)
    assert len(good) == 2 * n + 1 and not bad
    # the records folder and its two subfolders once each, each record once, nothing else
    assert opens.of(RECORDS_DIR) == 1
    assert opens.of("a") == 1 and opens.of("b") == 1
    assert len(opens.names) == 2 * n + 1 + 3 + 2  # + the root and .commitstore on the way


def test_latest_and_prune_open_the_records_folder_a_fixed_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = []
    for n in (2, 10):
        store = _store(tmp_path / f"s{n}", n)
        opens = OpenCounter(monkeypatch)
        assert store.latest(level="size") is not None
        latest_opens = opens.of(RECORDS_DIR)
        opens.names.clear()
        report = store.prune(keep_last=1, min_age=0, dry_run=True)
        assert len(report.deleted) == 2 * n
        counts.append((latest_opens, opens.of(RECORDS_DIR)))
        monkeypatch.undo()
    # one walk and one reader each (prune: one walk of the whole store); the full check of the
    # newest artifact before a delete reads its data, not the records folder
    assert counts[0] == counts[1] == (2, 2)


@pytest.fixture
def stale(tmp_path: Path) -> Iterator[tuple[CommitStore, Path, list[Any]]]:
    """A store of a/step_0..2, b/step_0..2 and top.pt, and a listing of its records folder
    taken now (the test then changes the folder before the scan reads it)."""
    store = _store(tmp_path / "s", 3)
    before = len(os.listdir("/proc/self/fd"))
    yield store, tmp_path / "s", store._backend.walk(RECORDS)
    assert len(os.listdir("/proc/self/fd")) <= before, "a descriptor leaked"


def _by_name(store: CommitStore, listing: list[Any]) -> tuple[set[str], dict[str, str]]:
    good, bad = scan_records(store._backend, listing)
    return {r.name for r in good}, {b.name: b.detail for b in bad}


def test_a_record_replaced_by_a_fifo_after_the_listing_is_bad_and_never_blocks(
    stale: tuple[CommitStore, Path, list[Any]], unblock_fifos: None
) -> None:
    store, root, listing = stale
    rec = root / record_path("a/step_1.pt")
    os.unlink(rec)
    mkfifo(rec)
    good, bad = returns(lambda: _by_name(store, listing))
    assert bad.keys() == {"a/step_1.pt"} and NOT_REGULAR in bad["a/step_1.pt"]
    assert "FIFO" in bad["a/step_1.pt"]
    assert len(good) == 6


def test_a_record_replaced_by_a_symlink_after_the_listing_is_bad_and_not_followed(
    stale: tuple[CommitStore, Path, list[Any]],
) -> None:
    store, root, listing = stale
    rec = root / record_path("a/step_1.pt")
    copy = root.parent / "copy.json"  # a valid record of that very name, outside the store
    copy.write_bytes(rec.read_bytes())
    os.unlink(rec)
    os.symlink(copy, rec)
    good, bad = _by_name(store, listing)
    assert bad.keys() == {"a/step_1.pt"} and "symlink" in bad["a/step_1.pt"]
    assert "a/step_1.pt" not in good and len(good) == 6


def test_a_records_subfolder_replaced_by_a_symlink_is_bad_and_not_followed(
    stale: tuple[CommitStore, Path, list[Any]],
) -> None:
    store, root, listing = stale
    folder = root / META_DIR / RECORDS_DIR / "a"
    moved = root.parent / "moved-a"  # the same valid records, outside the store
    os.rename(folder, moved)
    os.symlink(moved, folder)
    good, bad = _by_name(store, listing)
    assert bad.keys() == {f"a/step_{i}.pt" for i in range(3)}
    assert all("symlink" in d for d in bad.values())
    assert good == {"b/step_0.pt", "b/step_1.pt", "b/step_2.pt", "top.pt"}


def test_a_record_that_grew_past_the_bound_is_bad_without_being_read_whole(
    stale: tuple[CommitStore, Path, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root, listing = stale
    rec = root / record_path("b/step_2.pt")
    os.truncate(rec, 4 * MAX_RECORD_BYTES)  # sparse: costs no disk
    read_bytes = []
    real = os.read

    def counting(fd: int, n: int) -> bytes:
        data = real(fd, n)
        read_bytes.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counting)
    good, bad = _by_name(store, listing)
    assert bad.keys() == {"b/step_2.pt"} and "more than" in bad["b/step_2.pt"]
    assert sum(read_bytes) <= MAX_RECORD_BYTES + 1 + 64 * 1024  # + the other records
    assert len(good) == 6


def test_a_record_or_folder_deleted_after_the_listing_is_left_out(
    stale: tuple[CommitStore, Path, list[Any]],
) -> None:
    store, root, listing = stale
    os.unlink(root / record_path("a/step_0.pt"))
    for leaf in os.listdir(root / META_DIR / RECORDS_DIR / "b"):
        os.unlink(root / META_DIR / RECORDS_DIR / "b" / leaf)
    os.rmdir(root / META_DIR / RECORDS_DIR / "b")
    good, bad = _by_name(store, listing)
    assert good == {"a/step_1.pt", "a/step_2.pt", "top.pt"} and not bad


def test_the_records_folder_deleted_after_the_listing_leaves_everything_out(
    stale: tuple[CommitStore, Path, list[Any]],
) -> None:
    store, root, listing = stale
    os.rename(root / META_DIR / RECORDS_DIR, root.parent / "gone")
    assert _by_name(store, listing) == (set(), {})


def test_an_aside_entry_of_a_missing_record_is_read_in_its_place(tmp_path: Path) -> None:
    store = _store(tmp_path / "s", 2)
    rec = tmp_path / "s" / record_path("a/step_1.pt")
    os.rename(rec, rec.with_name(aside_part(rec.name)))
    good, bad = scan_records(store._backend)
    assert "a/step_1.pt" in {r.name for r in good} and not bad
    assert len(good) == 5


def test_a_bridge_drops_the_cached_pages_of_each_record_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(tmp_path / "s", 2)
    bridge = BridgeBackend(tmp_path / "s", reason="test", mount=None)
    dropped: list[int] = []
    real = os.posix_fadvise

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            dropped.append(fd)
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", advise)
    good, bad = scan_records(bridge)
    assert len(good) == 5 and not bad
    assert len(dropped) == 5


def test_the_default_reader_is_a_loop_of_read_small_tagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"memory://{tmp_path.name}-scan")
    for i in range(4):
        store.put_bytes(f"m/step_{i}", b"x")
    reads: list[tuple[str, ...]] = []
    real = store._backend.read_small_tagged

    def counting(parts: tuple[str, ...]) -> tuple[bytes, str | None]:
        reads.append(parts)
        return real(parts)

    monkeypatch.setattr(store._backend, "read_small_tagged", counting)
    good, bad = scan_records(store._backend)
    assert len(good) == 4 and not bad
    assert sorted(reads) == [(*RECORDS, "m", f".commitstore.rec.step_{i}.json") for i in range(4)]


@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(timezone.utc)))
def test_created_is_parsed_as_strptime_parses_it(value: datetime) -> None:
    text = value.strftime(TIME_FORMAT)
    assert _parse_time(text) == _strptime(text) == value
    assert _parse_time(text).tzinfo == timezone.utc


_digits = st.text("0123456789", min_size=0, max_size=5)


@given(
    st.tuples(_digits, _digits, _digits, _digits, _digits, _digits, _digits),
    st.sampled_from(["T", "t", " "]),
    st.sampled_from(["Z", "z", ""]),
)
def test_created_accepts_and_refuses_what_strptime_does(
    fields: tuple[str, ...], sep: str, zone: str
) -> None:
    y, mo, d, h, mi, s, us = fields
    text = f"{y}-{mo}-{d}{sep}{h}:{mi}:{s}.{us}{zone}"
    try:
        expected: datetime | None = _strptime(text)
    except ValueError:
        expected = None
    try:
        got: datetime | None = _parse_time(text)
    except ValueError:
        got = None
    assert got == expected


TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _strptime(text: str) -> datetime:
    return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=timezone.utc)
