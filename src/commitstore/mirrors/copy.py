"""Copy one committed artifact from one store to another through the target's own commit protocol.

The copy is streamed (constant memory), hashed on the way and compared with the source's record
before anything is published on the target: a source copy that does not match its record is never
copied. The target gets a byte-for-byte copy of the source's record.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from commitstore.backends.base import PutMode
from commitstore.digest import copy_hashed
from commitstore.errors import IntegrityError, NotFoundError
from commitstore.layout import record_parts, validate_name
from commitstore.records import Record, RecordFormatError, decode_record

if TYPE_CHECKING:
    import threading

    from commitstore._reads import Reads
    from commitstore.store import CommitStore


def raw_record(store: Reads, name: str) -> tuple[bytes, Record] | None:
    """The exact record bytes of ``name`` and their decoding; None if there is no record.

    Raises:
        IntegrityError: the record is unreadable (``bad_record``).
    """
    parts = validate_name(name)
    try:
        with store.backend.open_read(record_parts(parts)) as f:
            raw = f.read()
    except NotFoundError:
        return None
    try:
        rec = decode_record(raw)
    except RecordFormatError as exc:
        raise IntegrityError(f"{name}: bad record: {exc}", name=name, status="bad_record") from exc
    if rec.name != name:
        raise IntegrityError(f"{name}: record names {rec.name!r}", name=name, status="bad_record")
    return raw, rec


class SourceMismatch(IntegrityError):
    """The source's bytes do not match the source's own record: nothing was copied."""


def _mismatch(rec: Record, what: str, size: int, digest: str, src: Reads) -> IntegrityError:
    return SourceMismatch(
        f"{rec.name}{what} on {src.url} does not match its record ({size} bytes, {digest}); "
        "not copied",
        name=rec.name,
        status="size_mismatch" if size != rec.size else "hash_mismatch",
        actual_size=size,
        actual_digest=digest,
    )


def copy_artifact(
    src: CommitStore,
    dst: CommitStore,
    name: str,
    *,
    publish_slots: threading.Semaphore | None = None,
) -> Record:
    """Copy committed ``name`` from ``src`` to ``dst`` (replacing what ``dst`` has under it).

    ``publish_slots``: held while publishing (not while reading and staging), so a caller running
    more copies than slots stages the next artifact while others publish.

    Raises:
        NotFoundError: not committed on ``src``.
        IntegrityError: ``src``'s bytes do not match its record (nothing published on ``dst``).
        InsufficientSpaceError, CommitError, BackendUnavailableError: from ``dst``.
    """
    parts = validate_name(name)
    found = raw_record(src, name)
    if found is None:
        raise NotFoundError(f"{name} is not committed on {src.url}", name=name)
    raw, rec = found
    dst._check_free(parts, rec.size)
    if rec.kind == "file":
        sink = dst.backend.open_sink(parts, mode=PutMode.REPLACE)
        try:
            with src.backend.open_read(parts) as f:
                size, digest = copy_hashed(f, sink.write)
            if size != rec.size or digest != rec.digest:
                raise _mismatch(rec, "", size, digest, src)
        except BaseException:
            sink.abort()
            raise
        abort = sink.abort

        def publish_data() -> Record:
            dst._published(sink.publish(size=rec.size, digest=rec.digest), name)
            return rec

    else:
        dsink = dst.backend.open_dir_sink(parts, mode=PutMode.REPLACE)
        try:
            for entry in rec.files:
                out = dsink.local_path.joinpath(*entry.path.split("/"))
                out.parent.mkdir(parents=True, exist_ok=True)
                with (
                    src.backend.open_read((*parts, *entry.path.split("/"))) as f,
                    open(out, "wb") as o,
                ):
                    size, digest = copy_hashed(f, o.write)
                if size != entry.size or digest != entry.digest:
                    raise _mismatch(rec, f"/{entry.path}", size, digest, src)
        except BaseException:
            dsink.abort()
            raise
        abort = dsink.abort

        def publish_data() -> Record:
            info = dsink.publish()
            sent = sorted((f.path, f.size, f.digest) for f in rec.files)
            if sorted(info.files) != sent:
                raise IntegrityError(f"{name}: folder changed while copied", name=name)
            return rec

    started = False

    def publish() -> Record:
        nonlocal started
        started = True  # from here the sink cleans up after itself
        return publish_data()

    try:
        with publish_slots if publish_slots is not None else contextlib.nullcontext():
            return dst._commit(parts, True, publish, body=raw)
    except BaseException:
        if not started:  # the publish lock (or the wait for a slot) failed: nothing published
            abort()
        raise
