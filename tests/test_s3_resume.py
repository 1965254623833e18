"""S3 uploads of a local file that resume after the writer was SIGKILLed (moto, rclone serve s3).

A writer subprocess ``put_file``s a file through a slowed proxy, one part at a time; once the
backdoor lists enough parts the proxy stops forwarding and the writer is killed (no sleep is the
timing). Once its upload looks dead (its last activity older than the resume's live limit, read
through the backdoor), the next ``put_file`` goes through a proxy that counts the bytes sent.
A live writer (a subprocess paused between two parts, its upload's marker still rewritten) is
never joined nor aborted by another writer's ``put_file`` of its name. Assertions read the
bucket through the backdoor (boto3).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store
from commitstore.backends.object.resume import source_identity
from commitstore.backends.object.s3.upload import STALE_BEATS, upload_marker
from commitstore.layout import resume_parts
from commitstore.testing import S3Backdoor, Target, record_path

from .helpers import resumekill
from .helpers.faultproxy import FaultProxy
from .helpers.resumekill import NAME, kill_when_landed, random_file, read_state, writer
from .helpers.s3servers import BUCKET, S3Server

MiB = 1024 * 1024
SIZE = 30 * MiB
PART = 5 * MiB
PARTS = SIZE // PART
LANDED = 5  # the kill comes once 5 of the 6 parts landed (~83%)
OVERHEAD = 2 * MiB  # requests' headers, the state, the record, the pending records
HEARTBEAT = 0.5
"""Every writer's heartbeat here: a killed writer's upload looks dead a few seconds after."""
MTIME_RESOLUTION = 1.0


SMALL = {"part_size": PART, "single_put_max": PART, "heartbeat": HEARTBEAT}


def make_target(server: S3Server, endpoint: str | None = None) -> tuple[Target, dict[str, Any]]:
    prefix = f"t{time.monotonic_ns()}"
    opts: dict[str, Any] = {**server.options(), **SMALL}
    url = server.url(prefix)
    return (
        Target(
            open_store(url, **opts),
            S3Backdoor(server.client(), BUCKET, prefix),
            lambda: open_store(url, **opts),
        ),
        opts,
    )


@pytest.fixture(params=["moto", "rclone"])
def s3(request: pytest.FixtureRequest) -> tuple[S3Server, Target]:
    server: S3Server = request.getfixturevalue(request.param)
    return server, make_target(server)[0]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return random_file(tmp_path / "source.bin", SIZE)


def door(t: Target) -> S3Backdoor:
    assert isinstance(t.door, S3Backdoor)
    return t.door


def uploads(t: Target) -> list[dict[str, Any]]:
    return door(t).pending_uploads()


def states(t: Target) -> list[str]:
    return resumekill.states(door(t))


def parts_landed(t: Target) -> int:
    """The parts of the one pending upload (0 before it exists)."""
    ups = uploads(t)
    return door(t).parts_uploaded(str(ups[0]["Key"]), str(ups[0]["UploadId"])) if ups else 0


def kill_mid_upload(
    server: S3Server, t: Target, src: Path, *, heartbeat: float = HEARTBEAT, wait: bool = True
) -> dict[str, Any]:
    """Run a ``put_file`` writer of ``src`` as ``NAME`` (beating every ``heartbeat`` s) through
    a slowed proxy, one part at a time; once ``LANDED`` parts are on the server the proxy stops
    forwarding and the writer is SIGKILLed (and reaped). Returns the unfinished upload (nothing
    was published), once it looks dead by its age when ``wait``, at once otherwise."""
    slow = FaultProxy(server.port)
    slow.set(delay=0.005, faulty=None)
    options = {**SMALL, "max_inflight": 1, "heartbeat": heartbeat}
    env = {
        **server.env(),
        "AWS_ENDPOINT_URL": slow.endpoint,
        "WRITER_STORE_OPTIONS": json.dumps({**options, "endpoint_url": slow.endpoint}),
    }
    landed = kill_when_landed(
        t.store.url,
        src,
        env,
        slow=slow,
        landed=lambda: parts_landed(t),
        goal=LANDED,
        timeout=60,
        poll=0.02,
    )
    assert landed >= LANDED, f"only {landed} parts landed"
    assert door(t).read(NAME) is None
    assert door(t).read(record_path(NAME)) is None
    (up,) = uploads(t)
    assert door(t).parts_uploaded(str(up["Key"]), str(up["UploadId"])) < PARTS
    assert len(states(t)) == 1
    if wait:
        wait_dead(t, up)
    return up


def wait_dead(t: Target, up: dict[str, Any]) -> None:
    """Wait until the upload of a killed writer looks dead to a resuming writer (no activity
    for ``STALE_BEATS`` heartbeats plus the mtime resolution)."""
    door(t).wait_dead(str(up["Key"]), STALE_BEATS * HEARTBEAT + MTIME_RESOLUTION)


def put_counted(
    server: S3Server,
    t: Target,
    src: Path,
    *,
    keep: Sequence[dict[str, Any]] = (),
    heartbeat: float = HEARTBEAT,
) -> int:
    """``put_file`` of ``src`` as ``NAME`` in this process, through a proxy that counts the
    bytes sent; returns them. The commit is byte-identical to ``src`` and verifies in full; the
    uploads ``keep`` (none by default) are the only ones left pending, and no state is left."""
    proxy = FaultProxy(server.port)
    try:
        opts = {**server.options(), **SMALL, "heartbeat": heartbeat}
        store = open_store(t.store.url, **{**opts, "endpoint_url": proxy.endpoint})
        record = store.put_file(NAME, src, overwrite=True)
        assert record.size == SIZE
        sent = proxy.received
    finally:
        proxy.stop()
    assert door(t).read(NAME) == src.read_bytes()  # byte-identical to the source
    report = t.reopen().verify(NAME)
    assert report.ok, report
    assert sorted(u["UploadId"] for u in uploads(t)) == sorted(u["UploadId"] for u in keep)
    assert states(t) == []
    # no marker outlives its upload (a kept upload's marker may stay, with it)
    assert set(markers(t)) <= {"/".join(upload_marker(u["UploadId"])) for u in keep}
    return sent


def markers(t: Target) -> list[str]:
    """The writers' upload markers left in the bucket (backdoor)."""
    return sorted(f for f in door(t).files() if f.startswith(".commitstore/uploads/"))


def test_resume_sends_only_the_missing_parts(s3: tuple[S3Server, Target], source: Path) -> None:
    server, t = s3
    kill_mid_upload(server, t, source)
    state = json.loads(door(t).read(states(t)[0]) or b"")
    assert state["key"].endswith(NAME) and state["part_size"] == PART
    sent = put_counted(server, t, source)
    assert sent <= SIZE // 4 + OVERHEAD, f"{sent} bytes sent to resume"


def test_a_restart_on_the_same_machine_resumes_at_once(
    s3: tuple[S3Server, Target], source: Path
) -> None:
    """Writers beating every 60 s: by age alone the killed writer's upload would look live for
    3 minutes and a writer restarted at once would start over. Its marker states its process,
    which is gone (killed and reaped), so the restarted writer resumes right away: it sends
    about the one missing part, and the killed writer's upload is not left behind."""
    server, t = s3
    up = kill_mid_upload(server, t, source, heartbeat=60.0, wait=False)
    marker = json.loads(door(t).read("/".join(upload_marker(str(up["UploadId"])))) or b"")
    assert marker["writer"]["pid"] != os.getpid()
    sent = put_counted(server, t, source, heartbeat=60.0)
    assert sent <= SIZE // 4 + OVERHEAD, f"{sent} bytes sent to resume"


def test_changed_source_starts_over(s3: tuple[S3Server, Target], source: Path) -> None:
    server, t = s3
    kill_mid_upload(server, t, source)
    data = bytearray(source.read_bytes())
    data[PART + 7] ^= 0xFF  # a byte in an uploaded part; the same size
    source.write_bytes(bytes(data))
    sent = put_counted(server, t, source)
    assert sent >= SIZE  # every part sent again
    assert door(t).read(NAME) == bytes(data)


def _garbage(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    return b'{"schema": "commitstore.resume/1", "parts": [tr'


def _edited_parts(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    # a part it took left out, a part the server lacks put in
    listed = {n: md5 for n, md5 in state["parts"].items() if n != "1"}
    state["parts"] = {**listed, str(PARTS): "0" * 32}
    return json.dumps(state).encode()


def _out_of_range(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    state["parts"] = {**state["parts"], "10001": "1" * 32}
    return json.dumps(state).encode()


def _wrong_checksums(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    state["parts"] = dict.fromkeys(state["parts"], "f" * 32)
    return json.dumps(state).encode()


def _other_upload(state: dict[str, Any], server: S3Server, t: Target) -> bytes:
    # another name's upload holding the same first part's bytes
    key = f"{door(t).prefix}/other.pt"
    other = door(t).client.create_multipart_upload(Bucket=BUCKET, Key=key)
    body = Path(state["__source"]).read_bytes()[:PART]
    door(t).client.upload_part(
        Bucket=BUCKET, Key=key, UploadId=other["UploadId"], PartNumber=1, Body=body
    )
    state["upload_id"] = other["UploadId"]
    state.pop("__source")
    return json.dumps(state).encode()


@pytest.mark.parametrize(
    "hostile",
    [_garbage, _out_of_range, _edited_parts, _wrong_checksums, _other_upload],
    ids=lambda f: f.__name__,
)
def test_hostile_state_never_commits_bad_bytes(
    s3: tuple[S3Server, Target], source: Path, hostile: Any
) -> None:
    server, t = s3
    up = kill_mid_upload(server, t, source)
    where, state = read_state(door(t), source)
    door(t).write(where, hostile(state, server, t))
    other = [u for u in uploads(t) if u["UploadId"] != up["UploadId"]]
    if hostile is _other_upload:
        # the other name's upload is never used nor aborted
        client = door(t).client
        for u in other:
            assert door(t).parts_uploaded(str(u["Key"]), str(u["UploadId"])) == 1
        sent_other = put_counted(server, t, source, keep=[*other, up])
        assert sent_other >= SIZE
        for u in other:
            assert door(t).parts_uploaded(str(u["Key"]), str(u["UploadId"])) == 1
            client.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
        return
    # a state that does not parse names no upload: the killed one stays pending, for gc
    unknown = hostile in (_garbage, _out_of_range)
    sent = put_counted(server, t, source, keep=[up] if unknown else [])
    if hostile is _wrong_checksums:
        assert sent >= SIZE * (LANDED - 1) // PARTS  # the parts it lists are sent again
    if unknown:
        assert sent >= SIZE


def test_gc_removes_the_state_and_aborts_the_upload(
    s3: tuple[S3Server, Target], source: Path
) -> None:
    server, t = s3
    up = kill_mid_upload(server, t, source)
    assert t.reopen().gc().removed == ()  # younger than an hour
    assert len(states(t)) == 1
    report = t.reopen().gc(min_age=0)
    kinds = sorted(i.kind for i in report.removed if i.kind != "pending")
    assert kinds == ["resume", "upload"], report
    assert uploads(t) == []
    assert states(t) == []
    assert up["UploadId"] not in [u["UploadId"] for u in uploads(t)]
    sent = put_counted(server, t, source)  # starts over cleanly
    assert sent >= SIZE


PAUSE_AT = 3
"""A live writer pauses just before its third part: two parts landed, its state written."""


class LiveWriter:
    """A ``put_file`` writer subprocess of ``src`` as ``name``, paused just before part
    ``PAUSE_AT`` while its upload's marker keeps being rewritten every ``HEARTBEAT``: a live
    writer. :meth:`go` lets it finish; leaving the block SIGKILLs it if it still runs."""

    def __init__(
        self, server: S3Server, t: Target, name: str, src: Path, heartbeat: float = HEARTBEAT
    ) -> None:
        self.t = t
        options = {**SMALL, "max_inflight": 1, "heartbeat": heartbeat}
        env = {
            **server.env(),
            "WRITER_PAUSE_AT": str(PAUSE_AT),
            "WRITER_STORE_OPTIONS": json.dumps(options),
        }
        self.proc = writer(t.store.url, src, env, name=name, stdin=True)

    def __enter__(self) -> LiveWriter:
        try:
            assert self.line() == "ready"
            assert self.line() == "paused"
            (self.upload,) = uploads(self.t)
            assert self.parts() == PAUSE_AT - 1
            assert len(states(self.t)) == 1
        except BaseException:
            self.__exit__()
            raise
        return self

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def parts(self) -> int:
        up = self.upload
        return door(self.t).parts_uploaded(str(up["Key"]), str(up["UploadId"]))

    def pending(self) -> bool:
        return self.upload["UploadId"] in [u["UploadId"] for u in uploads(self.t)]

    def go(self) -> str:
        """Let the writer send its remaining parts and commit; its last line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        answer = self.line()
        self.proc.wait(60)
        return answer

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


@pytest.mark.parametrize("same", [True, False], ids=["same-source", "other-source"])
def test_a_live_writer_is_never_joined_nor_aborted(
    s3: tuple[S3Server, Target], source: Path, tmp_path: Path, same: bool
) -> None:
    """Writer A puts ``source`` and is live between two parts (its state names its upload,
    whose marker is fresh); writer B puts the same name, from the same file (same identity:
    it would have joined A's upload) or another (it would have aborted it). B commits its own
    upload and leaves A's untouched; A then commits; the name verifies as A's bytes, and
    neither an upload nor a state is left."""
    server, t = s3
    theirs = source if same else random_file(tmp_path / "b.bin", SIZE)
    with LiveWriter(server, t, NAME, source) as a:
        t.reopen().put_file(NAME, theirs, overwrite=True)
        assert door(t).read(NAME) == theirs.read_bytes()
        assert t.reopen().verify(NAME).ok
        assert a.pending(), "another writer completed or aborted the live writer's upload"
        assert a.parts() == PAUSE_AT - 1, "another writer sent parts into a live upload"
        assert a.go() == "done"
    assert door(t).read(NAME) == source.read_bytes()
    report = t.reopen().verify(NAME)
    assert report.ok, report
    assert uploads(t) == []
    assert states(t) == []


@pytest.mark.parametrize("same", [True, False], ids=["same-source", "other-source"])
def test_a_live_writer_of_a_longer_heartbeat_is_never_joined_nor_aborted(
    s3: tuple[S3Server, Target], source: Path, tmp_path: Path, same: bool
) -> None:
    """Writer A beats every 30 s (its marker says so); writer B, beating every 0.5 s, puts
    the same name once A's upload had no activity for longer than B's own limit (3 of B's
    heartbeats plus the mtime resolution), though well within A's. B judges A's upload by A's
    heartbeat: it commits its own upload and leaves A's untouched; A then commits."""
    server, t = s3
    theirs = source if same else random_file(tmp_path / "b.bin", SIZE)
    with LiveWriter(server, t, NAME, source, heartbeat=30.0) as a:
        wait_dead(t, a.upload)  # by B's heartbeat only
        t.reopen().put_file(NAME, theirs, overwrite=True)
        assert door(t).read(NAME) == theirs.read_bytes()
        assert a.pending(), "another writer completed or aborted the live writer's upload"
        assert a.parts() == PAUSE_AT - 1, "another writer sent parts into a live upload"
        assert a.go() == "done"
    assert door(t).read(NAME) == source.read_bytes()
    report = t.reopen().verify(NAME)
    assert report.ok, report
    assert uploads(t) == []
    assert states(t) == []


class _File:
    """A local file read by position (what ``put_file`` offers the sink)."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("rb")

    def fileno(self) -> int:
        return self._f.fileno()

    def pread(self, offset: int, n: int) -> bytes:
        return os.pread(self._f.fileno(), n, offset)

    def close(self) -> None:
        self._f.close()


def _state_naming(upload: dict[str, Any], name: str, key: str, src: Path) -> bytes:
    """A state of ``name`` (as a person could write it) naming ``upload``, with ``key`` and the
    identity of ``src``: were it trusted, ``src``'s writer would reuse (or abort) the upload."""
    f = _File(src)
    try:
        identity = source_identity(f, SIZE)
    finally:
        f.close()
    state = {
        "schema": "commitstore.resume/1",
        "name": name,
        "key": key,
        "upload_id": upload["UploadId"],
        "part_size": PART,
        "source": identity,
        "parts": {},
    }
    return json.dumps(state).encode()


@pytest.mark.parametrize("where", ["this-name", "other-name", "other-name-own-key"])
def test_a_hand_edited_state_never_touches_a_live_upload(
    s3: tuple[S3Server, Target], source: Path, tmp_path: Path, where: str
) -> None:
    """A state edited to name a live writer's upload: this name's (with the identity of a copy
    of the live writer's source: every part the server holds matches it), or another name's
    (naming the live upload's key, or its own key). The writer that finds it commits its own
    upload; the live one is neither joined nor aborted, and commits after."""
    server, t = s3
    copy = tmp_path / "copy.bin"
    copy.write_bytes(source.read_bytes())
    other = "run/other.pt"
    with LiveWriter(server, t, NAME, source) as a:
        live_key = str(a.upload["Key"])
        target = NAME if where == "this-name" else other
        key = live_key if where != "other-name-own-key" else f"{door(t).prefix}/{other}"
        state = _state_naming(a.upload, target, key, copy)
        door(t).write("/".join(resume_parts(tuple(target.split("/")))), state)
        t.reopen().put_file(target, copy, overwrite=True)
        assert door(t).read(target) == copy.read_bytes()
        assert a.pending(), "a hand-edited state had the live writer's upload completed or aborted"
        assert a.parts() == PAUSE_AT - 1, "a hand-edited state had parts sent into a live upload"
        assert a.go() == "done"
    assert door(t).read(NAME) == source.read_bytes()
    for name in {NAME, target}:
        report = t.reopen().verify(name)
        assert report.ok, report
    assert uploads(t) == []
    assert states(t) == []


@pytest.fixture(autouse=True)
def _no_leftovers(s3: tuple[S3Server, Target]) -> Iterator[None]:
    yield
    _, t = s3
    for u in uploads(t):
        door(t).client.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])


def test_gc_removes_a_marker_whose_upload_ended(s3: tuple[S3Server, Target]) -> None:
    """A writer killed between its upload's end and its marker's removal leaves a marker no
    upload lists: gc ages it like the rest (kept while younger than min_age) and removes it."""
    _server, t = s3
    t.store.put_bytes("a.bin", b"a")
    planted = "/".join(upload_marker("no-such-upload"))
    door(t).write(planted, b'{"heartbeat": 0.5}')
    t.reopen().gc()  # default min_age: a fresh marker stays
    assert markers(t) == [planted]
    t.reopen().gc(min_age=0)
    assert markers(t) == []
    assert door(t).read("a.bin") == b"a"
