"""Writes through the one commit path: a staged file (:class:`Stage`) and a staged folder.

Both validate name, step and metadata before any I/O (``check_new``), hash every byte on its way
to the sink, and publish through ``Committer.commit`` with the new record as the pending record
(the versioned commit: old or new, never neither). ``after`` runs once the artifact is committed
(replication, automatic retention); it never turns a commit into a failure.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commitstore._commit import Committer, check_flag, check_new, make_record, mode_of
from commitstore._stage import Stage
from commitstore.backends import CommitInfo, FileSink
from commitstore.backends.localtree import hash_and_sync_tree
from commitstore.digest import copy_chunks, manifest_digest
from commitstore.errors import CommitError, NotFoundError, StorageError
from commitstore.records import FileRecord, Record

if TYPE_CHECKING:
    from typing_extensions import Buffer

After = Callable[[Record], None]
StageFn = Callable[..., Stage]
"""``CommitStore.stage``: the puts go through it, so replication and retention follow."""


def open_stage(
    committer: Committer,
    name: str,
    *,
    step: int | None,
    metadata: Mapping[str, Any] | None,
    overwrite: bool,
    alias: bool,
    after: After,
) -> Stage:
    """A :class:`Stage` of ``name`` (see ``CommitStore.stage``)."""
    parts, step, meta = check_new(name, step, metadata)
    check_flag(alias, "alias")
    mode = mode_of(overwrite)
    sink = committer.open_file(parts, mode)

    def finish(s: FileSink, size: int, digest: str) -> tuple[Record, CommitInfo]:
        record = make_record(name, step, meta, size=size, digest=digest, alias=alias)
        infos: list[CommitInfo] = []

        def publish_data() -> Record:
            infos.append(s.publish(size=size, digest=digest))
            committer.note(infos[0], name)
            return record

        return committer.commit(parts, mode, publish_data, intent=record), infos[0]

    return Stage(name, sink, finish, after=after)


@contextlib.contextmanager
def stage_dir(
    committer: Committer,
    name: str,
    *,
    step: int | None,
    metadata: Mapping[str, Any] | None,
    overwrite: bool,
    after: After,
) -> Iterator[Path]:
    """A local folder to fill, published whole on a clean exit (see ``CommitStore.stage_dir``)."""
    parts, step, meta = check_new(name, step, metadata)
    mode = mode_of(overwrite)
    sink = committer.open_dir(parts, mode)
    try:
        yield sink.local_path
    except BaseException:
        sink.abort()
        raise

    def dir_record(files: list[tuple[str, int, str]]) -> Record:
        entries = tuple(FileRecord(p, size, d) for p, size, d in files)
        return make_record(
            name,
            step,
            meta,
            size=sum(f.size for f in entries),
            digest=manifest_digest(files),
            files=entries,
            kind="dir",
        )

    try:
        # Hashed once before anything is published, so the record is known first (the
        # commit's pending record); the sink hashes again as it publishes.
        intent = dir_record(hash_and_sync_tree(sink.local_path))

        def publish_data() -> Record:
            info = sink.publish()
            committer.note(info, name)
            return (
                intent
                if sorted(info.files) == sorted((f.path, f.size, f.digest) for f in intent.files)
                else dir_record(info.files)
            )

        record = committer.commit(parts, mode, publish_data, intent=intent)
    except BaseException:
        sink.abort()
        raise
    after(record)


def put_bytes(
    committer: Committer, stage: StageFn, name: str, data: Buffer, kw: dict[str, Any]
) -> Record:
    """Commit ``data`` as ``name`` through ``stage``, after checking the free space."""
    parts, _, _ = check_new(name, kw.get("step"), kw.get("metadata"))
    committer.check_free(parts, memoryview(data).nbytes)
    with stage(name, **kw) as st:
        st.write(data)
    assert st.record is not None
    return st.record


def put_file(
    committer: Committer,
    stage: StageFn,
    name: str,
    local_path: str | os.PathLike[str],
    kw: dict[str, Any],
    *,
    progress: Callable[[int], None] | None,
) -> Record:
    """Commit a local file as ``name``, streamed with constant memory; the source must keep its
    size while it is copied (CommitError otherwise: nothing published)."""
    parts, _, _ = check_new(name, kw.get("step"), kw.get("metadata"))
    try:
        src = open(local_path, "rb")  # noqa: SIM115 - closed below, errors typed first
    except FileNotFoundError as exc:
        raise NotFoundError(f"{local_path}: no such local file") from exc
    except OSError as exc:
        raise StorageError(
            exc.errno or 0, f"{local_path}: cannot read: {exc.strerror}", path=str(local_path)
        ) from exc
    with src:
        size = os.fstat(src.fileno()).st_size
        committer.check_free(parts, size)
        with stage(name, **kw) as st:
            copy_chunks(src, st.write, progress=progress)
            if st.tell() != size:
                raise CommitError(f"{local_path}: changed size while it was copied")
    assert st.record is not None
    return st.record
