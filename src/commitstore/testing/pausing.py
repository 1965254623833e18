"""A pausing writer: a forked process that stages an artifact (a file through ``stage``, a
folder through ``stage_dir`` or ``begin_folder``), stops half way for as long as the caller
likes (longer than gc's ``min_age``), then either resumes and commits or is SIGKILLed.

What the caller checks around it (``tests/test_pausing_writers.py``, the crash machine's
``pausing_writer`` rule): gc, run while the writer pauses, removes nothing the live writer
staged (:func:`staged_state`, read through the backdoor); a resumed writer publishes exactly
what it wrote, or fails with a typed error (a :class:`commitstore.CommitStoreError`) and
publishes nothing, when its staging was taken from under it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import commitstore
from commitstore import CommitStore, CommitStoreError
from commitstore.testing.backdoor import Backdoor
from commitstore.testing.target import Target, record_path

HOWS = ("stage", "stage_dir", "begin_folder")
"""How the writer stages: one file through ``stage``, a folder through ``stage_dir``, a folder
through ``begin_folder`` (one file finished and one open during the pause)."""

Version = bytes | tuple[tuple[str, bytes], ...]
"""A file's bytes, or a folder's sorted (path, bytes) pairs."""


@dataclass(frozen=True)
class Plan:
    """What the writer stages: ``head`` before the pause, ``tail`` after it. A file is
    ``head + tail``; a folder is ``a.bin`` (``head``) and ``sub/b.bin`` (``tail``), of which the
    first half is written before the pause (``begin_folder``: that file is open during it)."""

    name: str
    how: str
    head: bytes
    tail: bytes
    overwrite: bool = True

    def version(self) -> Version:
        """What the name must read as once the writer's commit returned."""
        if self.how == "stage":
            return self.head + self.tail
        return (("a.bin", self.head), ("sub/b.bin", self.tail))


def _staged_first(store: CommitStore, plan: Plan) -> tuple[str, Callable[[], None]]:
    """In the child: stage the first part of ``plan``; return the local folder the writer
    fills (``stage_dir``; ``begin_folder`` where it has one; else empty) and what finishes and
    commits it."""
    half = len(plan.tail) // 2
    if plan.how == "stage":
        st = store.stage(plan.name, overwrite=plan.overwrite)
        st.write(plan.head)

        def finish_file() -> None:
            st.write(plan.tail)
            st.commit()

        return "", finish_file
    if plan.how == "stage_dir":
        ctx = store.stage_dir(plan.name, overwrite=plan.overwrite)
        d = ctx.__enter__()
        (d / "a.bin").write_bytes(plan.head)
        (d / "sub").mkdir()
        with open(d / "sub" / "b.bin", "wb") as out:
            out.write(plan.tail[:half])

        def finish_dir() -> None:
            try:  # a caller that finds its folder gone makes it again (copytree does)
                (d / "sub").mkdir(parents=True, exist_ok=True)
                with open(d / "sub" / "b.bin", "ab") as more:
                    more.write(plan.tail[half:])
            except BaseException as exc:
                if not ctx.__exit__(type(exc), exc, exc.__traceback__):
                    raise
                return
            ctx.__exit__(None, None, None)

        return str(d), finish_dir
    assert plan.how == "begin_folder", plan.how
    fw = store.begin_folder(plan.name, overwrite=plan.overwrite)
    first = fw.write_bytes("a.bin", plan.head)
    f = fw.open_file("sub/b.bin")
    f.write(plan.tail[:half])

    def finish_folder() -> None:
        f.write(plan.tail[half:])
        fw.commit([first, f.finish()])

    area = fw.local_area()
    return ("" if area is None else str(area)), finish_folder


class PausingWriter:
    """A forked writer of ``plan`` on ``target`` (the child opens the store anew), paused once
    its first part is staged: :meth:`resume` lets it commit, :meth:`kill` SIGKILLs it."""

    def __init__(self, target: Target, plan: Plan) -> None:
        self.plan = plan
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.close(go_w)
                os.close(out_r)
                _child(target, plan, go_r, out_w)
            finally:
                os._exit(0)
        os.close(go_r)
        os.close(out_w)
        self.pid, self._go, self._out = pid, go_w, out_r
        self._answer = os.fdopen(out_r, "rb")
        line = self._answer.readline().decode().rstrip("\n")
        if not line.startswith("paused "):
            self.kill()
            raise AssertionError(f"the writer of {plan.name} failed before its pause: {line!r}")
        self.local_path = line[len("paused ") :]
        """The local folder the writer fills (``stage_dir``; ``begin_folder`` on storage with
        staging names), else empty."""

    def resume(self) -> str | None:
        """Let the writer finish and commit; None if it committed, else the exception it
        raised, as ``"<type name>: <message>"`` (:func:`is_typed` tells commitstore's own)."""
        os.write(self._go, b"c")
        line = self._answer.readline().decode().strip()
        self._reap()
        assert line, "the resumed writer died without an answer"
        return None if line == "ok" else line

    def kill(self) -> None:
        """SIGKILL the writer where it pauses (nothing once it was reaped)."""
        if not self.pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self.pid:
            os.waitpid(self.pid, 0)
            self.pid = 0
            self._answer.close()
            os.close(self._go)


def _child(target: Target, plan: Plan, go: int, out: int) -> None:  # pragma: no cover
    try:
        store = target.reopen()
        local, finish = _staged_first(store, plan)
    except BaseException as exc:
        os.write(out, f"failed {type(exc).__name__}: {exc}\n".encode())
        return
    os.write(out, f"paused {local}\n".encode())
    if os.read(go, 1) != b"c":
        return
    try:
        finish()
    except BaseException as exc:
        shown = " ".join(str(exc).split())[:2000]
        os.write(out, f"{type(exc).__name__}: {shown}\n".encode())
        return
    os.write(out, b"ok\n")


def is_typed(error: str) -> bool:
    """True if ``error`` (a name :meth:`PausingWriter.resume` returned) is commitstore's own
    error type, or a subclass of it."""
    found: Any = getattr(commitstore, error.split(":", 1)[0], None)
    return isinstance(found, type) and issubclass(found, CommitStoreError)


BOOKKEEPING = (
    ".commitstore/uploads/",
    ".commitstore/folders/",
    ".commitstore/pending/",
    ".commitstore/staged/",
)


def staged_state(door: Backdoor, name: str) -> set[str]:
    """Every file on the storage that a writer of ``name`` may have staged and not published:
    staging files and folders (local stores, SMB, bridges; not an upload's proof of life, which
    its writer removes as the upload ends: a live upload gc aborted fails the writer's commit),
    folder-write markers, pending records, staged folder copies (object stores), and the files
    under ``name`` itself when no record claims it (a ``begin_folder`` on an object store
    uploads to the final keys). Read through the backdoor."""
    unrecorded = door.read(record_path(name)) is None
    out = set()
    for f in door.files():
        parts = f.split("/")
        if f.startswith(".commitstore/uploads/"):
            continue  # an upload's proof of life: its writer removes it once the upload ends
        if (
            any(p.startswith(".commitstore.tmp.") for p in parts)
            or f.startswith(BOOKKEEPING)
            or ".commitstore.new." in parts[-1]
            or (unrecorded and f.startswith(name + "/"))
        ):
            out.add(f)
    return out
