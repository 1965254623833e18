"""Forked writers of a store, each stopped for good at a chosen step of its commit until the test
resumes or SIGKILLs it (:class:`Writer`, :func:`crash_commit`), and the versions they commit.

The stop points (:data:`POINTS`, and for uploads in parts ``mid-upload`` and ``gcs-acked:N`` /
``gcs-in-flight:N``) are reached by wrapping, in the child only, the step of the commit path
right before which (or after which) the writer must stop: nothing of the parent changes.
Used by the crash machine (``crashmachine.py``) and by tests that need one writer stopped at
one point.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commitstore import CommitStore
from commitstore import _commit as commit_module
from commitstore.testing.target import Target

__all__ = [
    "FOLDER",
    "POINTS",
    "Version",
    "Writer",
    "crash_commit",
    "folder_files",
    "stop_at",
    "version_of",
    "write_version",
]

FOLDER = "f/ckpt_4"
"""The folder artifact the machine and its writers commit (:func:`folder_files`)."""
POINTS = ("writing", "before-pending", "before-data", "before-record", "before-cleanup", "mid-copy")
"""Where a writer is killed: while its bytes are staged; before its pending record is written;
after its pending record, before its data is published; after its data is published, before its
record; after its record, before the pending record is dropped (where the record is the pending
record renamed onto it: right after that rename and its sync); during the copies of an
object-store folder replace (other commits finish there)."""
Version = bytes | tuple[tuple[str, bytes], ...] | None
"""A file's bytes, a folder's (path, bytes) pairs, or None: not committed."""


def folder_files(data: bytes) -> tuple[tuple[str, bytes], ...]:
    """The folder version the machine commits for ``data``."""
    return (("a.bin", data), ("sub/b.bin", data[::-1] + b"!"))


def version_of(name: str, data: bytes) -> Version:
    return folder_files(data) if name == FOLDER else data


def write_version(store: CommitStore, name: str, data: bytes) -> None:
    """Commit ``data`` as ``name`` (a file, or for :data:`FOLDER` the folder of
    :func:`folder_files`), over what is there."""
    if name != FOLDER:
        store.put_bytes(name, data, overwrite=True)
        return
    with store.stage_dir(name, overwrite=True) as d:
        for rel, body in folder_files(data):
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(body)


def stop_at(point: str, store: CommitStore, signal_parent: Callable[[], None]) -> None:
    """In the child: make the commit stop for good (until SIGKILL) at ``point``."""
    backend: Any = store._committer.backend
    pending_written = [False]
    put_small = commit_module.put_small

    def counted_put(*args: Any, **kw: Any) -> Any:
        # the commit's own pending record, then its record (a record written before the pending
        # one, promoting an earlier commit's pending record, is not a stop point)
        parts = args[1] if len(args) > 1 else kw["parts"]
        is_pending = ".commitstore.new." in "/".join(parts)
        if (point == "before-pending" and is_pending) or (
            point == "before-record" and not is_pending and pending_written[0]
        ):
            signal_parent()
        pending_written[0] = pending_written[0] or is_pending
        return put_small(*args, **kw)

    commit_module.put_small = counted_put  # in the child only
    put_pending = backend.put_pending  # where the pending record is written in place

    def counted_pending(parts: tuple[str, ...], body: bytes) -> Any:
        if point == "before-pending":
            signal_parent()
        got = put_pending(parts, body)
        pending_written[0] = pending_written[0] or got is not None
        return got

    backend.put_pending = counted_pending
    if point in ("before-record", "before-cleanup"):
        # where the record is the pending record renamed onto it (local disks): before that
        # rename, or once it is done (nothing is left to clean up after it)
        publish_from = backend.publish_small_from

        def stopping_publish(src: tuple[str, ...], dst: tuple[str, ...], **kw: Any) -> Any:
            if point == "before-record" and pending_written[0]:
                signal_parent()
            got = publish_from(src, dst, **kw)
            if point == "before-cleanup" and got is not None:
                signal_parent()
            return got

        backend.publish_small_from = stopping_publish
    if point == "before-cleanup":
        remove = backend.remove_leftover  # how a commit drops its pending record

        def stopping_remove(parts: tuple[str, ...]) -> bool:
            if ".commitstore.new." in "/".join(parts):
                signal_parent()
            return bool(remove(parts))

        backend.remove_leftover = stopping_remove
    if point == "before-data":
        commit = commit_module.Committer.commit

        def stopping_commit(self: Any, parts: Any, mode: Any, publish_data: Any, **kw: Any) -> Any:
            def stopped() -> Any:
                signal_parent()
                return publish_data()

            return commit(self, parts, mode, stopped, **kw)

        commit_module.Committer.commit = stopping_commit  # type: ignore[method-assign]
    if point == "mid-upload":
        # a put_file sent in parts: once the first part the writer waits for has landed
        from commitstore.backends.object.upload import ObjectFileSink

        reap = ObjectFileSink._reap

        def stopping_reap(self: Any) -> None:
            reap(self)
            signal_parent()

        ObjectFileSink._reap = stopping_reap  # type: ignore[method-assign]
    if point.startswith(("gcs-acked:", "gcs-in-flight:")):
        _stop_gcs(point, backend, signal_parent)
    if point == "mid-copy" and hasattr(backend, "server_copy"):
        copy = backend.server_copy

        def stopping_copy(*args: Any, **kw: Any) -> Any:
            got = copy(*args, **kw)
            signal_parent()
            return got

        backend.server_copy = stopping_copy


def _stop_gcs(point: str, backend: Any, signal_parent: Callable[[], None]) -> None:
    """In the child, a GCS ``put_file`` in chunks: ``gcs-acked:N`` stops right after the
    resume state was written saying N chunks were acknowledged and none is in flight;
    ``gcs-in-flight:N`` right after chunk request N was answered, before anything else (the
    state still lists chunk N as in flight)."""
    what, _, at = point.partition(":")
    n = int(at)
    if what == "gcs-acked":
        upload_small = backend.upload_small

        def uploading(parts: Any, key: str, data: bytes, *, create_only: bool) -> Any:
            got = upload_small(parts, key, data, create_only=create_only)
            if tuple(parts[:2]) == (".commitstore", "resume"):
                state = json.loads(data)
                acked = state["gcs"]["sent"] // state["part_size"]
                if acked == len(state["gcs"]["crc32c"]) == n:
                    signal_parent()
            return got

        backend.upload_small = uploading
        return
    call, chunks = backend.call, [0]

    def calling(what_: str, parts: Any, method: str, path: str, *a: Any, **kw: Any) -> Any:
        crange = str((kw.get("headers") or {}).get("Content-Range", ""))
        got = call(what_, parts, method, path, *a, **kw)
        if method == "POST" and crange.startswith("bytes ") and not crange.startswith("bytes */"):
            chunks[0] += 1
            if chunks[0] == n:
                signal_parent()
        return got

    backend.call = calling


class Writer:
    """A forked writer that opens the store anew and commits ``data`` as ``name``, stopping
    once at ``point`` (``"finish"``: nowhere) until it is resumed or SIGKILLed. After
    construction :attr:`state` is ``"stopped"`` (at ``point``), ``"done"`` (committed: no such
    point on its way) or ``"failed"``. With ``source`` (a local file), it ``put_file``s that
    file instead of ``data``."""

    def __init__(
        self, target: Target, name: str, data: bytes, point: str, source: Path | None = None
    ) -> None:
        self.point = point
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.close(ready_r)
                os.close(go_w)
                stopped = [False]

                def signal_parent() -> None:
                    if stopped[0]:  # once: a rewrite of its record later is no stop point
                        return
                    stopped[0] = True
                    os.write(ready_w, b"k")
                    if os.read(go_r, 1) != b"c":
                        time.sleep(600)  # until SIGKILL

                store = target.reopen()
                if point == "writing":
                    st_ = store.stage(name, overwrite=True)
                    st_.write(data[: len(data) // 2 + 1])
                    signal_parent()
                stop_at(point, store, signal_parent)
                if source is not None:
                    store.put_file(name, source, overwrite=True)
                else:
                    write_version(store, name, data)
                os.write(ready_w, b"d")
            except BaseException:
                os.write(ready_w, b"e")
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(go_r)
        self.pid, self._ready, self._go = pid, ready_r, go_w
        self.state = self._next()

    def _next(self) -> str:
        got = os.read(self._ready, 1)
        return {b"k": "stopped", b"d": "done"}.get(got, "failed")

    def resume(self) -> str:
        """Let a stopped writer finish its commit; ``"done"`` or ``"failed"``."""
        assert self.state == "stopped", self.state
        os.write(self._go, b"c")
        self.state = self._next()
        return self.state

    def kill(self) -> None:
        """SIGKILL the writer (a finished one is only reaped)."""
        if not self.pid:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self._ready)
        os.close(self._go)
        self.pid = 0


def crash_commit(target: Target, name: str, data: bytes, point: str) -> bool:
    """Fork a writer that opens the store anew and commits ``data`` as ``name``; SIGKILL it at
    ``point``. True if it was killed there, False if it finished first (no such point)."""
    writer = Writer(target, name, data, point)
    writer.kill()
    assert writer.state != "failed", f"the writer failed before {point}"
    return writer.state == "stopped"
