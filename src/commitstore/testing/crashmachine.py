"""A Hypothesis state machine over several processes: commits and overwrites (files and a
folder) run in forked writer processes that are SIGKILLed at a chosen step of the commit, beside
in-process commits, deletes, prunes, gc and bit flips through the backdoor; checked against a
model of which versions each name may verify as.

Invariants, after every step: every committed name verifies as one of its model versions (or is
one the machine damaged); a name the model says is committed is listed; and after ``prune`` and
``gc``, when an artifact verified before the call, ``latest(level="full")`` is not None and is one
of the model's versions. Runs on any :class:`Target` whose store a forked child can reopen.

The writer processes and their stop points are ``crashwriter.py``'s, what a killed and resumed
upload in parts needs of a backend ``crashuploads.py``'s. The rules stay on one class: they
share one model of the versions each name may be, and call each other (a killed overwrite is a
commit and a killed commit; a damage is followed by prune or scrub).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from commitstore import CommitStore, NameConflictError, NotFoundError, open_store
from commitstore.layout import resume_parts
from commitstore.maintenance.scrub import scrub
from commitstore.mirrors.sync import sync_mirrors
from commitstore.testing.backdoor import LocalBackdoor
from commitstore.testing.crashuploads import (
    MiB,
    count_chunk_bytes,
    gcs_changed_at,
    gcs_fresh,
    gcs_kill_point,
    resumes,
    source_size,
    wait_dead_uploads,
)
from commitstore.testing.crashwriter import (
    FOLDER,
    POINTS,
    Version,
    Writer,
    crash_commit,
    version_of,
    write_version,
)
from commitstore.testing.pausing import HOWS, PausingWriter, Plan, is_typed, staged_state
from commitstore.testing.target import Target, pending_paths, record_path, xxh

FILES = ("s_1", "s_2", "d/s_3")
DATA = st.binary(min_size=1, max_size=200)
UNPUBLISHED = ("writing", "before-pending", "before-data")
"""Points where nothing of the new version is published yet: the model stands."""
FIRST = ("before-record", "before-data", "before-cleanup", "before-pending", "writing", "mid-copy")
"""Where the first of two writers of one name stops: :data:`POINTS`, those between its
pending record and its record first (the few examples a default run draws reach them)."""
SECOND = ("before-data", "before-record", "finish", *(p for p in FIRST[2:]))
"""Where the second writer stops (``"finish"``: nowhere, it commits)."""
THEN = ("kill-both", "first-finishes", "second-finishes")
"""What follows once both writers stopped: both SIGKILLed, or one resumed to the end of its
commit and the other SIGKILLed."""

PARENT = "d"
"""The folder path of ``d/s_3``, never an artifact itself (rule ``parent_path``)."""


@contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="crashmachine-") as d:
        yield Path(d)


def read_version(store: CommitStore, name: str) -> Version:
    """What ``name`` reads as through the store (checked reads)."""
    if name != FOLDER:
        return store.read_bytes(name)
    with _scratch() as d:
        store.get_file(name, d / "out")
        files = sorted(p for p in (d / "out").rglob("*") if p.is_file())
        return tuple((str(p.relative_to(d / "out")), p.read_bytes()) for p in files)


def file_versions(door: Any, name: str) -> tuple[bytes | None, list[str]]:
    """The bytes stored under file artifact ``name`` and the digests of its record and of each
    of its pending records (``docs/format.md``), read through the backdoor."""
    digests = []
    for path in [record_path(name), *pending_paths(door, name)]:
        raw = door.read(path)
        doc = json.loads(raw) if raw else {}
        if isinstance(doc, dict) and doc.get("name") == name:
            digests.append(str(doc.get("digest")))
    return door.read(name), digests


RULES = (
    "commit",
    "killed_commit",
    "killed_overwrite",
    "killed_overwrite_then_gc",
    "damage_newest_then_prune",
    "delete",
    "parent_path",
    "flip",
    "prune",
    "gc",
    "two_writers",
    "pausing_writer",
    "scrub_repairs",
    "killed_put_file",
    "resume_put_file",
)
"""The machine's rules."""

OPT_IN = ("killed_put_file", "resume_put_file")
"""Rules drawn only when asked for (``put_files=True``, or named in ``only``): each sends a
source of a few parts (megabytes), so the default run and its derandomized examples stay as
they were."""


def _not_a_rule(method: Callable[..., None]) -> Callable[..., None]:
    """``method`` as a plain method: callable by the other rules, never drawn."""

    def plain(self: Any, *args: Any, **kw: Any) -> None:
        method(self, *args, **kw)

    return plain


def run_crash_machine(
    make_target: Callable[[], Target],
    *,
    max_examples: int = 3,
    steps: int = 8,
    folder: bool = True,
    shrink: bool = True,
    pause_min_age: float | None = None,
    only: Collection[str] | None = None,
    put_files: bool = False,
) -> None:
    """Run the machine; every example gets a fresh target (an empty store) from
    ``make_target`` and starts from a history of two committed files. ``folder=False`` leaves
    the folder artifact out (files only).

    On stores without a publish lock (object stores: a pending record per writer), rule
    ``two_writers`` runs two writer processes of one name at once. ``pause_min_age``: rule
    ``pausing_writer`` runs, gc taking that ``min_age`` while a writer pauses longer (it must
    exceed the targets' ``heartbeat`` by more than 1.5 s where the store's times are whole
    seconds: S3, Azure); None leaves the rule out. ``only``: the rules drawn (of
    :data:`RULES`; the default, all but :data:`OPT_IN`), so that a short run reaches the ones
    that matter to it. ``put_files``: the default set includes :data:`OPT_IN` (a ``put_file``
    of a few parts killed mid-upload, then resumed).

    Derandomized: the same code draws the same examples on every run, so a failure in CI is
    reproducible, and ``tests/test_crash_machine.py`` shows that the default sizes catch
    planted bugs. Besides the single operations, two rules chain the sequences that matter
    most (damage the newest verifying artifact, then prune; a writer killed mid-overwrite, then
    gc), so that a few short examples reach them. ``shrink=False`` reports the first failing
    example as found."""
    names = st.sampled_from([*FILES, FOLDER] if folder else list(FILES))

    class CrashMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.t = make_target()
            self.store = self.t.store
            self.model: dict[str, set[Version]] = {n: {None} for n in (*FILES, FOLDER)}
            self.damaged: set[str] = set()
            self.killed_puts: dict[str, Path] = {}  # name -> source of a put_file killed
            # name -> the bytes its GCS put_file again must send (a resume that reuses chunks)
            self.to_send: dict[str, int] = {}
            self._sources: Path | None = None

        def teardown(self) -> None:
            if self._sources is not None:
                shutil.rmtree(self._sources, ignore_errors=True)

        def new_source(self, seed: int) -> Path:
            if self._sources is None:
                self._sources = Path(tempfile.mkdtemp(prefix="crashmachine-src-"))
            size = source_size(self.store._committer.backend)
            path = self._sources / f"src-{seed}-{len(list(self._sources.iterdir()))}.bin"
            path.write_bytes(random.Random(seed).randbytes(size))
            return path

        @rule(
            name=st.sampled_from(FILES),
            old=DATA,
            seed=st.integers(0, 2**16),
            then=st.sampled_from(("resume", "gc-then-put", "later")),
            change=st.booleans(),
        )
        def killed_put_file(
            self, name: str, old: bytes, seed: int, then: str, change: bool
        ) -> None:
            """A writer ``put_file``s a source of a few parts over ``name`` and is SIGKILLed
            mid-upload: where the store resumes uploads (S3), once the backdoor shows a part of
            its upload landed and its resume state written; on GCS (chunks of ``chunk_size``)
            at :func:`gcs_kill_point` (chunks acknowledged, or one in flight), the backdoor
            showing the state says so, over an old version or (:func:`gcs_fresh`) a name
            deleted first; elsewhere before its data is published. The old version (or
            nothing) stands. Then (``then``) rule ``resume_put_file`` runs
            now, after gc, or later (other rules between); ``change``: the source is rewritten
            in its middle first, its mtime kept (the state still matches it), so a part the
            server holds is no longer the source's."""
            backend: Any = self.store._committer.backend
            gcs = bool(getattr(backend, "resumes_uploads", False))
            before: bytes | None = old
            if gcs and gcs_fresh(seed):
                with contextlib.suppress(NotFoundError):
                    self.store.delete(name)
                self.model[name] = {None}
                self.damaged.discard(name)
                before = None
            else:
                self.commit(name, old)
            source = self.new_source(seed)
            resumable = resumes(backend, source.stat().st_size)
            point = "mid-upload" if resumable else "before-data"
            point = gcs_kill_point(seed, int(backend.chunk_size)) if gcs else point
            writer = Writer(self.t, name, b"", point, source)
            try:
                assert writer.state == "stopped", f"the put_file writer: {writer.state}"
                if gcs:
                    self.check_gcs_state(name, point)
                elif resumable:
                    door: Any = self.t.door
                    key = f"{door.prefix}/{name}" if door.prefix else name
                    ups = [u for u in door.pending_uploads() if u["Key"] == key]
                    assert len(ups) == 1, ups
                    landed = door.parts_uploaded(key, str(ups[0]["UploadId"]))
                    assert landed >= 1, "no part landed before the kill"
                    assert door.read("/".join(resume_parts(tuple(name.split("/"))))) is not None
            finally:
                writer.kill()
            assert self.t.door.read(name) == before, f"{name}: a killed put_file published"
            self.killed_puts[name] = source
            self.to_send.pop(name, None)
            if gcs and before is None and not change and point.startswith("gcs-acked:"):
                acked = int(point.partition(":")[2]) * int(backend.chunk_size)
                self.to_send[name] = source.stat().st_size - acked
            if change:
                stat = source.stat()
                # in the first part (GCS: in a chunk held), not its first or last MiB
                at = gcs_changed_at(int(backend.chunk_size)) if gcs else stat.st_size // 2 - MiB
                with source.open("r+b") as f:
                    f.seek(at)
                    byte = f.read(1)
                    f.seek(-1, os.SEEK_CUR)
                    f.write(bytes([byte[0] ^ 0x5A]))
                os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            if then == "gc-then-put":
                self.gc()
                state = "/".join(resume_parts(tuple(name.split("/"))))
                assert self.t.door.read(state) is None, "gc left a dead writer's resume state"
            if then != "later":
                self.put_again(name)

        def check_gcs_state(self, name: str, point: str) -> None:
            """The stopped GCS writer's resume state, by the backdoor: ``gcs-acked:N``: N
            chunks acknowledged, none in flight; ``gcs-in-flight:N``: chunk N listed (in
            flight), N - 1 acknowledged."""
            what, _, at = point.partition(":")
            n = int(at)
            raw = self.t.door.read("/".join(resume_parts(tuple(name.split("/")))))
            assert raw is not None, f"{point}: no resume state"
            state = json.loads(raw)
            listed, acked = len(state["gcs"]["crc32c"]), state["gcs"]["sent"] // state["part_size"]
            want = (n, n) if what == "gcs-acked" else (n, n - 1)
            assert (listed, acked) == want, f"{point}: the state lists {listed}, acked {acked}"

        @precondition(lambda self: bool(self.killed_puts))
        @rule(pick=st.integers(0, 2))
        def resume_put_file(self, pick: int) -> None:
            """Resume one of the killed ``put_file`` writers (:meth:`put_again`)."""
            names = sorted(self.killed_puts)
            self.put_again(names[pick % len(names)])

        def put_again(self, name: str) -> None:
            """The same ``put_file`` of a killed writer's source, in this process, once the
            killed writer's upload looks dead (:func:`wait_dead_uploads`): it commits
            the source's exact bytes (the parts the server holds reused only when they are
            exactly those), and only now is that the model's version; no resume state is left
            for the name. On GCS, a writer killed over a deleted name once chunks were
            acknowledged, its source unchanged and its state not gc'd, is resumed: its chunk
            requests send only the bytes past those chunks."""
            source = self.killed_puts.pop(name)
            data = source.read_bytes()
            wait_dead_uploads(self.t, name)
            store = self.t.reopen()
            sent = count_chunk_bytes(store)
            store.put_file(name, source, overwrite=True)
            if name in self.to_send:
                want = self.to_send.pop(name)
                assert sent[0] == want, f"{name}: {sent[0]} bytes sent again, not {want}"
            self.model[name] = {data}
            self.damaged.discard(name)
            assert self.t.door.read(name) == data, f"{name}: committed bytes are not the source"
            assert self.t.reopen().verify(name, level="full").ok, f"{name}: does not verify"
            state = "/".join(resume_parts(tuple(name.split("/"))))
            assert self.t.door.read(state) is None, f"{name}: a resume state outlived its commit"

        def committed(self, name: str) -> bool:
            return self.t.door.read(record_path(name)) is not None

        def no_publish_lock(self) -> bool:
            return bool(self.store._committer.backend.writer_slots)

        @precondition(lambda self: self.no_publish_lock())
        @rule(
            name=names,
            old=DATA,
            first=DATA,
            second=DATA,
            at=st.sampled_from(FIRST),
            second_at=st.sampled_from(SECOND),
            then=st.sampled_from(THEN),
        )
        def two_writers(
            self,
            *,
            name: str,
            old: bytes,
            first: bytes,
            second: bytes,
            at: str,
            second_at: str,
            then: str,
        ) -> None:
            """Two writer processes overwrite one committed name: the first stops at ``at``,
            the second then runs to ``second_at``; both are SIGKILLed, or one is resumed to the
            end of its commit first. Then, and after gc, the name verifies as the old version
            or one of theirs, judged through the backdoor: never neither."""
            # three different versions, whatever was drawn: equal ones would hide a mix-up
            old, first, second = b"o" + old, b"1" + first, b"2" + second
            self.commit(name, old)
            versions = {version_of(name, d) for d in (old, first, second)}
            writers = [Writer(self.t, name, first, at)]
            try:
                writers.append(Writer(self.t, name, second, second_at))
                states = [w.state for w in writers]
                assert "failed" not in states, f"a writer failed: {states} ({at}, {second_at})"
                if then != "kill-both":
                    w = writers[THEN.index(then) - 1]
                    if w.state == "stopped":
                        assert w.resume() == "done", f"{then}: the resumed writer failed"
            finally:
                for w in writers:
                    w.kill()
            self.model[name] = versions
            self.damaged.discard(name)
            self.check_one_of(name, versions, settled=False)
            self.gc()
            self.check_one_of(name, versions, settled=True)

        def check_one_of(self, name: str, versions: set[Version], *, settled: bool) -> None:
            """``name`` verifies as one of ``versions``; a file artifact judged through the
            backdoor too: its bytes are one of them and match its record or a pending record
            (``settled``, after gc: the record itself, and no pending record is left)."""
            fresh = self.t.reopen()
            assert fresh.verify(name, level="full").ok, f"{name}: no version verifies"
            assert read_version(fresh, name) in versions, f"{name}: not a version written"
            if name == FOLDER:
                return
            data, digests = file_versions(self.t.door, name)
            assert data is not None and data in versions, f"{name}: stored bytes are none written"
            if settled:
                assert digests == [xxh(data)], f"{name}: after gc, {digests} for {xxh(data)}"
            else:
                assert xxh(data) in digests, f"{name}: the bytes match neither record"

        @precondition(lambda self: pause_min_age is not None)
        @rule(
            how=st.sampled_from(HOWS if folder else ("stage",)),
            file=st.sampled_from(FILES),
            data=DATA,
            resume=st.booleans(),
        )
        def pausing_writer(self, how: str, file: str, data: bytes, resume: bool) -> None:
            """A writer stages (a file, a ``stage_dir`` or ``begin_folder`` folder), pauses
            longer than ``pause_min_age`` while gc runs with that ``min_age``, then resumes or
            is SIGKILLed. gc removes nothing it staged (nor its pending state); resumed, it
            publishes exactly what it wrote, or fails typed and publishes nothing."""
            assert pause_min_age is not None
            name = file if how == "stage" else FOLDER
            overwrite = how != "begin_folder" or bool(self.store._committer.backend.staging_names)
            if not overwrite and self.committed(name):
                self.delete(name)  # object stores: a multi-writer folder takes new names only
            if not overwrite and any(f.startswith(name + "/") for f in self.t.door.files()):
                self.gc()  # a killed folder writer's files: begin_folder refuses a name holding any
            plan = Plan(name, how, data, data[::-1] + b"!", overwrite=overwrite)
            before = staged_state(self.t.door, name)  # dead writers' leftovers: gc's to take
            writer = PausingWriter(self.t, plan)
            error = None
            try:
                staged = staged_state(self.t.door, name) - before
                # what it staged is older than min_age now, as gc judges it (a store whose
                # times are whole seconds makes gc count every entry that much younger)
                lag = self.store._committer.backend.capabilities.mtime_resolution
                time.sleep(pause_min_age + lag)
                self.t.reopen().gc(min_age=pause_min_age)
                left = staged_state(self.t.door, name)
                assert staged <= left, f"gc took {sorted(staged - left)} from a live writer"
                self.committed_names_verify_as_a_model_version()
                if resume:
                    error = writer.resume()
            finally:
                writer.kill()
            if not resume:
                return  # nothing was published: the model stands
            if error is not None:
                assert is_typed(error), f"the resumed writer raised {error}"
                return
            self.model[name] = {plan.version()}
            self.damaged.discard(name)
            assert read_version(self.t.reopen(), name) == plan.version()

        def verifying(self) -> set[str]:
            return {r.name for r in self.store.list() if self.store.verify(r.name).ok}

        def check_latest(self, before: set[str]) -> None:
            if not before:
                return
            found = self.store.latest(level="full")
            assert found is not None, f"nothing verifies after maintenance; before: {before}"
            assert read_version(self.store, found.name) in self.model[found.name]

        @initialize(old=DATA, new=DATA)
        def history(self, old: bytes, new: bytes) -> None:
            self.commit(FILES[0], old)
            self.commit(FILES[1], new)

        @rule(name=names, data=DATA)
        def commit(self, name: str, data: bytes) -> None:
            write_version(self.store, name, data)
            self.model[name] = {version_of(name, data)}
            self.damaged.discard(name)

        @rule(name=names, data=DATA, point=st.sampled_from(POINTS))
        def killed_commit(self, name: str, data: bytes, point: str) -> None:
            had_record = self.committed(name)
            new = version_of(name, data)
            if not crash_commit(self.t, name, data, point):
                self.model[name] = {new}  # nothing to stop at: the commit finished
                self.damaged.discard(name)
            elif point in ("before-record", "mid-copy"):
                self.model[name] = {new} if had_record else {None, new}
                self.damaged.discard(name)
            elif point == "before-cleanup":
                self.model[name] = {new}
                self.damaged.discard(name)
            else:  # nothing was published: the model stands
                assert point in UNPUBLISHED, point

        @rule(name=names, old=DATA, data=DATA, point=st.sampled_from(POINTS))
        def killed_overwrite(self, name: str, old: bytes, data: bytes, point: str) -> None:
            self.commit(name, old)
            self.killed_commit(name, data, point)

        @rule(
            name=names,
            old=DATA,
            data=DATA,
            point=st.sampled_from(("before-data", "before-record", "before-cleanup", "mid-copy")),
        )
        def killed_overwrite_then_gc(self, name: str, old: bytes, data: bytes, point: str) -> None:
            """A writer killed inside the commit of an overwrite, then gc settles what it left."""
            self.killed_overwrite(name, old, data, point)
            self.gc()

        @rule(pos=st.integers(0, 199))
        def damage_newest_then_prune(self, pos: int) -> None:
            """Damage the newest artifact that verifies, then prune to one: the newest-good
            guard must keep the newest one that still verifies."""
            newest = self.store.latest(level="full")
            if newest is None:
                return
            if newest.name == FOLDER:
                self.flip_at(FOLDER + "/a.bin", FOLDER, pos)
            else:
                self.flip(newest.name, pos)
            self.prune(1)

        def flip_at(self, path: str, name: str, pos: int) -> None:
            data = self.t.door.read(path)
            if not data:
                return
            damaged = bytearray(data)
            damaged[pos % len(damaged)] ^= 0x10
            self.t.door.write(path, bytes(damaged))
            self.damaged.add(name)

        @rule(name=names)
        def delete(self, name: str) -> None:
            try:
                self.store.delete(name)
            except NotFoundError:
                assert None in self.model[name]
            self.model[name] = {None}
            self.damaged.discard(name)

        @rule(how=st.sampled_from(("delete", "file", "folder")), data=DATA)
        def parent_path(self, how: str, data: bytes) -> None:
            """``d`` is only the folder path of ``d/s_3``: while that is committed, deleting
            ``d`` or committing ``d`` over it (a file or a folder, ``overwrite=True``) is
            refused and changes nothing (the invariants check that ``d/s_3`` still verifies)."""
            if not self.committed("d/s_3"):
                return
            try:
                if how == "delete":
                    self.store.delete(PARENT)
                elif how == "file":
                    self.store.put_bytes(PARENT, data, overwrite=True)
                else:
                    with self.store.stage_dir(PARENT, overwrite=True) as d:
                        (d / "x.bin").write_bytes(data)
            except NameConflictError:
                return
            raise AssertionError(f"{how} of the folder path {PARENT} was not refused")

        @rule(name=st.sampled_from(FILES), pos=st.integers(0, 199))
        def flip(self, name: str, pos: int) -> None:
            (only,) = self.model[name] if len(self.model[name]) == 1 else (None,)
            if not isinstance(only, bytes):
                return
            damaged = bytearray(only)
            damaged[pos % len(damaged)] ^= 0x10
            self.t.door.write(name, bytes(damaged))
            self.damaged.add(name)

        @rule(
            name=st.sampled_from(FILES),
            pos=st.integers(0, 199),
            where=st.sampled_from(("primary", "mirror", "both")),
        )
        def scrub_repairs(self, name: str, pos: int, where: str) -> None:
            """Damage, scrub, repair: a fresh local mirror gets the store's copies (``sync``),
            a bit of ``name`` flips on the store, the mirror or both, then a scrub runs. A copy
            damaged on one side is repaired from the other (under the identical record), one
            damaged on both is reported and left as it is; every other name reads as before."""
            (only,) = self.model[name] if len(self.model[name]) == 1 else (None,)
            if not isinstance(only, bytes) or name in self.damaged or not self.verify_ok(name):
                return
            before = {n: read_version(self.store, n) for n in self.verifying()}
            with _scratch() as tmp:
                mirror = open_store(tmp / "mirror")
                sync_mirrors(self.store._committer, [mirror._committer], repair=True)
                mdoor = LocalBackdoor(tmp / "mirror")
                if mdoor.read(record_path(name)) != self.t.door.read(record_path(name)):
                    return  # the store's copy is a pending version: the mirror's record differs
                if where != "mirror":
                    self.flip(name, pos)
                if where != "primary":
                    damaged = bytearray(only)
                    damaged[pos % len(damaged)] ^= 0x10
                    mdoor.write(name, bytes(damaged))
                report = scrub(
                    self.store._committer,
                    [mirror._committer],
                    budget_bytes=None,
                    budget_seconds=None,
                    repair=True,
                )
                ours, theirs = report.targets
                assert (name in ours.found) == (where != "mirror"), ours
                assert (name in theirs.found) == (where != "primary"), theirs
                if where == "both":
                    assert name in ours.unrepaired and name in theirs.unrepaired, report
                    assert not self.verify_ok(name)
                else:
                    assert name in (ours if where == "primary" else theirs).repaired, report
                    assert self.store.read_bytes(name) == only
                    assert mirror.read_bytes(name) == only
                    self.damaged.discard(name)
            for other, version in before.items():
                if other != name:
                    assert read_version(self.store, other) == version, other

        def verify_ok(self, name: str) -> bool:
            return self.store.verify(name).ok

        @rule(keep=st.integers(1, 3))
        def prune(self, keep: int) -> None:
            before = self.verifying()
            report = self.store.prune(keep_last=keep, min_age=0)
            for name in report.deleted:
                self.model[name] = {None}
                self.damaged.discard(name)
            self.check_latest(before)

        @rule()
        def gc(self) -> None:
            before = self.verifying()
            self.store.gc(min_age=0)
            self.to_send.clear()  # the dead writers' resume states are gone: none resumes
            self.check_latest(before)
            listed = {r.name for r in self.store.list()}
            for name in self.model:  # gc settled every commit it could: collapse the model
                if name in listed and self.store.verify(name).ok:
                    got = read_version(self.store, name)
                    assert got in self.model[name]
                    self.model[name] = {got}
                elif name not in listed and not self.committed(name):
                    assert None in self.model[name]

        @invariant()
        def committed_names_verify_as_a_model_version(self) -> None:
            listed = {r.name for r in self.store.list()}
            for name, versions in self.model.items():
                if name not in listed:
                    assert None in versions or name in self.damaged, f"{name} lost: {versions}"
                    continue
                assert versions != {None}, f"{name} listed but deleted in the model"
                if self.store.verify(name).ok:
                    assert read_version(self.store, name) in versions
                else:
                    assert name in self.damaged, f"{name} does not verify"

    machine: type[RuleBasedStateMachine] = CrashMachine
    if only is None:
        only = [r for r in RULES if put_files or r not in OPT_IN]
    if set(only) != set(RULES):  # the other rules stay methods (rules call each other)
        unknown = set(only) - set(RULES)
        assert not unknown, f"no such rules: {sorted(unknown)}"
        machine = type(
            "CrashMachine",
            (CrashMachine,),
            {n: _not_a_rule(getattr(CrashMachine, n)) for n in RULES if n not in only},
        )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            derandomize=True,
            database=None,
            report_multiple_bugs=False,
            phases=tuple(p for p in Phase if shrink or p is not Phase.shrink),
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
