"""The record cache (``commitstore._recordcache``) under hostile conditions, on moto and
fake-gcs: a commit SIGKILLed between publishing its record and noting it in the cache, a shard
hand-edited to lie with the right tag, a shard truncated mid-gzip; and on a local store (which
keeps no cache) special files planted where a shard would be. The cache may cost requests; it
never changes what a read hands out, which is checked against the record on storage."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, IntegrityError, open_store
from commitstore._recordcache import DIRECT_MAX, SCHEMA, shard_of
from commitstore.testing import GcsBackdoor, S3Backdoor, Target, record_path

from .helpers.blocking import mkfifo, returns
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.recordcache import CACHE, RECORDS, _count_fetches, _entries, _shards
from .helpers.s3servers import BUCKET

N = DIRECT_MAX + 4
"""Enough records that a scan uses the cache."""
ROOT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["moto", "gcs"])
def target(request: pytest.FixtureRequest) -> tuple[Target, dict[str, Any]]:
    """A fresh prefix on the server, and the options a child process opens it with."""
    prefix = f"rc{time.monotonic_ns()}"
    server = request.getfixturevalue(request.param)
    opts: dict[str, Any] = dict(server.options())
    url = server.url(prefix)
    door = (
        S3Backdoor(server.client(), BUCKET, prefix)
        if request.param == "moto"
        else GcsBackdoor(server.endpoint, GCS_BUCKET, prefix)
    )
    return Target(open_store(url, **opts), door, lambda: open_store(url, **opts)), opts


def _names(t: Target) -> list[str]:
    names = [f"c/step_{i:04d}.pt" for i in range(N)]
    for i, name in enumerate(names):
        t.store.put_bytes(name, bytes([i + 1]) * (i + 10))
    return names


def _key(name: str) -> str:
    return record_path(name)[len(RECORDS) :]


def _cached_keys(t: Target) -> set[str]:
    return {k for f in _shards(t) for k in _entries(t, f)}


def test_a_commit_killed_before_it_notes_the_cache_is_found_by_the_next_scan(
    target: tuple[Target, dict[str, Any]],
) -> None:
    t, opts = target
    _names(t)
    env = {**os.environ, "CACHEKILL_STORE_OPTIONS": json.dumps(opts)}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.cachekill", t.store.url, "c/killed.pt", "123"],
        cwd=ROOT_DIR,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "published"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert t.door.read(record_path("c/killed.pt")) is not None, "the listing shows its record"
    assert _key("c/killed.pt") not in _cached_keys(t), "and the cache lacks it"

    fresh = t.reopen()
    fetches = _count_fetches(fresh)
    got = {r.name: r for r in fresh.list()}
    assert got["c/killed.pt"].size == 123
    assert fetches[0] == 1, "only the record the cache lacked was fetched"
    assert fresh.read_bytes("c/killed.pt") == b"k" * 123
    assert _key("c/killed.pt") in _cached_keys(t), "the scan that fetched it cached it"


def _lie(t: Target, name: str, edit: Any) -> None:
    """Rewrite ``name``'s cache entry, keeping the tag the listing shows, to ``edit(text)``."""
    key = _key(name)
    shard = f"{CACHE}{shard_of(key):02x}.json.gz"
    entries = _entries(t, shard)
    tag, text = entries[key]
    entries[key] = [tag, edit(text)]
    body = {"schema": SCHEMA, "entries": entries}
    t.door.write(shard, gzip.compress(json.dumps(body).encode()))


def _flip_digest(text: str) -> str:
    """The same record text with one hex digit of its digest changed (same length)."""
    digest = json.loads(text)["digest"]
    other = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    assert text.count(digest) == 1
    return text.replace(digest, other)


def _grow(text: str) -> str:
    doc = json.loads(text)
    doc["size"] += 1000
    return json.dumps(doc)


def _reads(store: CommitStore, name: str, tmp: Path) -> list[bytes]:
    """Every way to get ``name``'s bytes."""
    with store.open(name) as f:
        opened = f.read()
    dest = tmp / "got"
    store.get_file(name, dest)
    return [store.read_bytes(name), opened, dest.read_bytes()]


def test_a_shard_lying_with_the_right_tag_never_changes_the_bytes_a_read_hands_out(
    target: tuple[Target, dict[str, Any]], tmp_path: Path
) -> None:
    t, _opts = target
    names = _names(t)
    truth = {r.name: r for r in t.reopen().list()}
    victim, data = names[-1], bytes([N]) * (N - 1 + 10)  # the newest: what latest() returns

    # another length than the record object the listing shows: never used
    _lie(t, victim, _grow)
    probe = t.reopen()
    fetches = _count_fetches(probe)
    assert {r.name: r for r in probe.list()}[victim] == truth[victim]
    assert fetches[0] == 1, "the entry whose length is not the listed size was fetched"

    # same length, another digest: a scan takes it on the tag's word; reads check the record
    _lie(t, victim, _flip_digest)
    probe = t.reopen()
    listed = {r.name: r for r in probe.list()}[victim]
    assert listed.digest != truth[victim].digest, "the tag vouches for the cached bytes"
    assert _reads(probe, victim, tmp_path) == [data] * 3, "reads verify against the record"
    assert probe.verify(victim).ok
    # a check that fails a cached record is made again with the record on storage: no false
    # alarm, and latest() does not skip the newest artifact
    assert probe.verify().ok, probe.verify()
    newest = probe.latest()
    assert newest is not None and newest == truth[victim]
    # and bytes that do not match the record on storage are refused whatever the cache says
    t.door.write(victim, bytes([9]) * len(data))  # now the data really is damaged
    for read in (lambda: probe.read_bytes(victim), lambda: _reads(probe, victim, tmp_path)):
        with pytest.raises(IntegrityError):
            read()


def test_a_shard_cut_mid_gzip_is_ignored_and_rewritten(
    target: tuple[Target, dict[str, Any]],
) -> None:
    t, _opts = target
    names = _names(t)
    shards = _shards(t)
    for f in shards:
        blob = t.door.read(f)
        assert blob is not None
        t.door.write(f, blob[: len(blob) // 2])
    probe = t.reopen()
    fetches = _count_fetches(probe)
    assert sorted(r.name for r in probe.list()) == names
    assert fetches[0] == N, "no entry of a cut shard was used"
    assert _cached_keys(t) == {_key(n) for n in names}, "the scan wrote whole shards back"


@pytest.mark.usefixtures("unblock_fifos")
def test_special_files_where_a_local_store_would_keep_a_cache_never_block(
    tmp_path: Path,
) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    names = [f"c/step_{i:04d}.pt" for i in range(N)]
    for name in names:
        store.put_bytes(name, b"x" * 5)
    cache = root / CACHE
    cache.mkdir(parents=True)
    outside = tmp_path / "outside.json.gz"
    outside.write_bytes(gzip.compress(b"{}"))
    mkfifo(cache / "00.json.gz")
    os.symlink(outside, cache / "01.json.gz")
    fresh = open_store(root)
    assert sorted(r.name for r in returns(fresh.list)) == names
    assert returns(fresh.verify).ok
    assert returns(lambda: fresh.gc(dry_run=True)).removed == ()
    assert returns(fresh.latest) is not None
    assert outside.read_bytes() == gzip.compress(b"{}"), "the link's target was left alone"
