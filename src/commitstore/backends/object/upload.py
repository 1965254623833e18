"""The one upload sink of the object stores, over a few primitives each store implements.

Bytes are held in memory up to the store's ``whole_max`` and then sent as one whole-object put;
past it they go as parts of an upload session (S3 multipart upload, GCS resumable upload, Azure
staged blocks), at most ``max_inflight`` at a time, each copied once into its own buffer. A full
part is sent only once at least one more byte follows it, so the last part (GCS's final request)
is never empty. Nothing is visible before the session's completion; after it the completion's
answer must attest the bytes sent (``Upload.attested``) or a fresh stat must show the size (and
the server's checksum, where the store has one) of what was sent, else the object is taken back,
only if it is still the version this writer made. Create-only uses the store's conditional write
exactly when ``capabilities.exclusive_create``; otherwise the core checks
absence under ``publish_lock()`` and the sink checks nothing itself. Every failure aborts the
session.

A sink offered a source that can give the bytes again (``reread_from``: a copy from a local file)
holds none of them, on a store whose server checks each body's MD5 (S3, Azure): every body is a
window over the source, its MD5 computed from the bytes written; what the window served is hashed
again and compared with what was written, so even a server that checks nothing cannot store a
source that changed in between (a part: nothing is completed; a whole-object put: it is taken
back).
Such a source that is a local file, sent in parts, is offered to the session to resume
(``Upload.resume``, ``resume.py``): a part the server already holds as exactly the bytes written
(its MD5 and length) is not sent again. A store that resumes without sending from the source
(GCS, ``resumes_uploads``) is offered the source's identity the same way; its bytes still go
through the sink's buffers, and its session skips the chunks its server holds (``gcs/resume.py``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
from collections import deque
from collections.abc import Callable
from typing import Any

from commitstore.backends.base import CommitInfo, FileSink, PutMode, Rereadable
from commitstore.backends.object.bodies import SourceWindow
from commitstore.backends.object.resume import source_identity
from commitstore.backends.object.session import ObjectStat, Store, Upload, Written, done
from commitstore.digest import Hasher
from commitstore.errors import CommitError
from commitstore.layout import Parts

__all__ = ["ObjectFileSink", "ObjectStat", "Store", "Upload", "Written", "done"]
"""The session's names are re-exported: the stores import them from here."""


class ObjectFileSink(FileSink):
    """One object: held whole up to ``whole_max``, else sent in parts; the completion publishes.

    Buffers are ``BytesIO`` objects that own their bytes: S3 hands them to botocore as bodies
    (aiohttp sends them without another copy), GCS sends them through ``ViewReader``. Offered a
    source that can give the bytes again (:meth:`reread_from`), a sink on a store that checks
    each body's MD5 holds no bytes at all: each body is a :class:`SourceWindow` over the source,
    its MD5 computed from the bytes as they are written, and the object goes whole or in parts as
    the expected size says.
    """

    def __init__(self, backend: Store, parts: Parts, *, mode: PutMode) -> None:
        self._b = backend
        self._parts = parts
        self._mode = mode
        self._whole: io.BytesIO | None = io.BytesIO()  # None once the object goes in parts
        self._part: io.BytesIO | None = None
        self._part_len = 0
        # MD5s of the buffers being filled (only when the store asks for them).
        self._md5_on = backend.md5_bodies
        self._whole_md5 = hashlib.md5(usedforsecurity=False) if self._md5_on else None
        self._part_md5: Any = None
        self._up: Upload | None = None
        self._create_only = False
        self._finished = False  # completed: nothing left to abort
        self._inflight: deque[tuple[int, concurrent.futures.Future[Any], SourceWindow | None]]
        self._inflight = deque()
        # Offered a source (reread_from): the bytes stay there, only their MD5s are computed.
        self._source: Rereadable | None = None
        self._in_parts = False  # with a source: the expected size goes in parts
        self._start = 0  # with a source: where the part being hashed starts, its length
        self._filled = 0
        self._part_xxh = Hasher()  # and its digest, to check what its window served
        self._receipts: list[Any] = []
        self._sent = 0  # parts sent so far
        self._acked = 0  # bytes the store confirmed
        self._closed = False
        self.bytes_written = 0

    def _session(self) -> Upload:
        if self._up is None:
            # Decided once, on first need (the probe runs here, never for REPLACE).
            self._create_only = (
                self._mode is PutMode.CREATE and self._b.capabilities.exclusive_create
            )
            self._up = self._b.new_upload(self._parts, create_only=self._create_only)
        return self._up

    def reread_from(self, source: Rereadable, size: int) -> bool:
        if self.bytes_written or self._closed:
            return False
        if not (self._b.reread_bodies and self._md5_on):
            self._resume_only(source, size)
            return False
        self._source, self._whole = source, None
        self._in_parts = size > self._b.whole_max
        if self._in_parts:
            self._whole_md5 = None
            identity = source_identity(source, size)
            if identity is not None:
                try:
                    self._session().resume(identity, source)
                except BaseException:
                    self.abort()
                    raise
        return True

    def _resume_only(self, source: Rereadable, size: int) -> None:
        """A store that resumes uploads without sending bodies from the source (GCS:
        ``resumes_uploads``): the bytes still go through the sink's buffers, and the session
        only learns the source's identity, to find and check what an earlier attempt left."""
        if not getattr(self._b, "resumes_uploads", False) or size <= self._b.whole_max:
            return
        identity = source_identity(source, size)
        if identity is None:
            return
        try:
            self._session().resume(identity, source)
        except BaseException:
            self.abort()
            raise

    def write(self, data: memoryview) -> None:
        assert not self._closed, "write after publish/abort"
        self.bytes_written += data.nbytes
        try:
            if self._source is not None:
                self._hash_window(data)
                return
            if self._whole is None:
                self._fill(data)
                return
            self._whole.write(data)
            if self._whole.tell() <= self._b.whole_max:
                if self._whole_md5 is not None:
                    self._whole_md5.update(data)
                return  # may still be published with one whole-object put
            held, self._whole, self._whole_md5 = self._whole, None, None
            self._split(held)
        except BaseException:
            self.abort()
            raise

    def _split(self, held: io.BytesIO) -> None:
        """The held bytes become the first parts. Where they are at most two parts (GCS, Azure,
        and S3 with ``single_put_max`` near ``part_size``) the held buffer itself is the first
        part and only the rest is copied: the whole buffer is never held twice."""
        first, size = self._session().part_size, held.tell()
        if size - first > first:
            with held.getbuffer() as view:  # each part copied out of the held bytes
                self._fill(view)
            return
        rest = b""
        if size > first:
            with held.getbuffer() as view:
                rest = bytes(view[first:])
            held.truncate(first)
            held.seek(first)  # (truncate keeps the position)
        self._part, self._part_len = held, first
        if self._md5_on:
            with held.getbuffer() as view:
                self._part_md5 = hashlib.md5(view, usedforsecurity=False)
        self._fill(memoryview(rest))

    def _fill(self, data: memoryview) -> None:
        up = self._session()
        while data.nbytes:
            if self._part is not None and self._part.tell() >= self._part_len:
                self._send(final=False)  # full, and more bytes follow it
            if self._part is None:
                self._part, self._part_len = io.BytesIO(), up.part_size
                if self._md5_on:
                    self._part_md5 = hashlib.md5(usedforsecurity=False)
            room = self._part_len - self._part.tell()
            self._part.write(data[:room])
            if self._part_md5 is not None:
                self._part_md5.update(data[:room])
            data = data[room:]

    def _hash_window(self, data: memoryview) -> None:
        """With a source: the MD5 of each body, from the bytes written; a part is sent (from
        the source) once full and at least one more byte follows it."""
        if not self._in_parts:
            assert self._whole_md5 is not None
            self._whole_md5.update(data)
            return
        up = self._session()
        while data.nbytes:
            if self._part_md5 is not None and self._filled >= self._part_len:
                self._send(final=False)
            if self._part_md5 is None:
                self._part_len = up.part_size
                self._part_md5 = hashlib.md5(usedforsecurity=False)
                self._part_xxh = Hasher()
            take = data[: self._part_len - self._filled]
            self._part_md5.update(take)
            self._part_xxh.update(take)
            self._filled += take.nbytes
            data = data[take.nbytes :]

    def _send(self, *, final: bool) -> None:
        up = self._session()
        self._sent += 1
        if up.max_parts is not None and self._sent > up.max_parts:
            raise CommitError(f"{self._b.shown(self._parts)}: more than {up.max_parts} parts")
        md5 = None
        if self._part_md5 is not None:
            md5 = self._part_md5.digest()
            up.given_md5(self._sent, md5)
            self._part_md5 = None
        window = None
        if self._source is not None:
            length = self._filled
            receipt = None if md5 is None else up.reuse(self._sent, md5, length)
            if receipt is not None:  # the server holds these very bytes (a resumed upload)
                self._start, self._filled = self._start + length, 0
                self._inflight.append((length, done(receipt), None))
                while len(self._inflight) >= up.max_inflight:
                    self._reap()
                return
            window = SourceWindow(
                self._source,
                self._start,
                length,
                expected=self._part_xxh.digest(),
                shown=self._b.shown(self._parts),
            )
            self._start, self._filled = self._start + length, 0
            fut = up.send_window(self._sent, window, length, final=final)
        else:
            part, self._part = self._part, None
            assert part is not None
            length = part.tell()
            part.seek(0)
            fut = up.send_part(self._sent, part, length, final=final)
        self._inflight.append((length, fut, window))
        while len(self._inflight) >= up.max_inflight:
            self._reap()

    def _reap(self) -> None:
        length, fut, window = self._inflight.popleft()
        self._receipts.append(_result(fut, window))
        if window is not None and not window.intact():
            raise CommitError(
                f"{self._b.shown(self._parts)}: part {len(self._receipts)} was not sent as it was "
                "hashed (the source changed in between); nothing was published"
            )
        self._acked += length

    def _filling(self) -> bool:
        """A part holds bytes not sent yet."""
        if self._source is not None:
            return self._filled > 0
        return self._part is not None and self._part.tell() > 0

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert not self._closed, "publish after publish/abort"
        shown = self._b.shown(self._parts)
        try:
            if size != self.bytes_written:
                raise CommitError(f"{shown}: {self.bytes_written} bytes written, {size} expected")
            up = self._session()
            if self._source is not None and not self._in_parts:
                assert self._whole_md5 is not None
                window = SourceWindow(self._source, 0, size, expected=digest, shown=shown)
                up.given_md5(0, self._whole_md5.digest())
                written = _result(lambda: up.put_window(window, size), window)
                if not window.intact():  # a server that checks no Content-MD5 stored it
                    if written.tag is not None:
                        with contextlib.suppress(Exception):
                            self._b.delete_version(self._parts, written.tag)
                    raise CommitError(
                        f"{shown}: not sent as it was hashed (the source changed in between); "
                        "the object was taken back"
                    )
                self._acked = size
            elif self._whole is not None:
                body, self._whole = self._whole, None
                length = body.tell()
                body.seek(0)
                if self._whole_md5 is not None:
                    up.given_md5(0, self._whole_md5.digest())
                written = up.put_whole(body, length)
                self._acked = length
            else:
                if self._filling():
                    self._send(final=True)
                while self._inflight:
                    self._reap()
                if self._acked != size:
                    raise CommitError(f"{shown}: {self._acked} bytes in parts, {size} expected")
                written = up.complete(self._receipts)
            self._finished = True
            self._closed = True
            self._source = None
            tag = self._check(up, written, size, shown)
            best_effort = self._mode is PutMode.CREATE and not self._create_only
            return CommitInfo(
                size,
                notes=["store ignores conditional writes: create-only is best effort"]
                if best_effort
                else [],
                tag=tag,
            )
        except BaseException:
            self.abort()
            raise

    def _check(self, up: Upload, written: Written, size: int, shown: str) -> str | None:
        """A fresh stat must show what was sent (unless the completion's answer already shows
        it, :meth:`Upload.attested`; never for create-only, whose stat also detects a writer
        that replaced the object right after); a wrong object of ours is taken back. Returns
        the published version's tag: the completion's (None when the store gave none, or when
        the fresh stat shows another version)."""
        if not self._create_only and up.attested(written):
            return written.tag
        fresh = self._b.head(self._parts)
        ours = fresh is not None and written.tag is not None and fresh.tag == written.tag
        if self._create_only and fresh is not None and written.tag is not None and not ours:
            raise CommitError(
                f"{shown}: another writer replaced the object right after this upload "
                "completed (the store did not serialise the create-only condition)"
            )
        found = -1 if fresh is None else fresh.size
        sent_sum = up.checksum()
        stored_sum = (fresh.checksum if fresh is not None else None) or written.checksum
        if found == size and (sent_sum is None or stored_sum in (None, sent_sum)):
            return written.tag if ours else None  # never another writer's version's tag
        if ours and written.tag is not None:  # never another writer's version
            with contextlib.suppress(Exception):
                self._b.delete_version(self._parts, written.tag)
        sums = "" if sent_sum is None else f" (checksum {stored_sum} stored, {sent_sum} sent)"
        raise CommitError(
            f"{shown}: post-upload check failed: {found} bytes stored, {size} written{sums}"
        )

    def abort(self) -> None:
        self._closed = True
        self._whole = self._part = self._source = None
        self._whole_md5 = self._part_md5 = None
        while self._inflight:
            with contextlib.suppress(Exception):
                self._inflight.popleft()[1].result()
        if self._up is not None and not self._finished:
            up, self._up = self._up, None
            # A dead endpoint leaves the session; gc, a lifecycle rule or expiry ends it.
            with contextlib.suppress(Exception):
                up.abort()


def _result(
    call: concurrent.futures.Future[Any] | Callable[[], Any], window: SourceWindow | None
) -> Any:
    """The result of a request (a future, or a call made now); when it failed because reading
    its ``window`` body failed, that error (the HTTP client reports it as a lost connection)."""
    try:
        return call.result() if isinstance(call, concurrent.futures.Future) else call()
    except Exception:
        failure = getattr(window, "failure", None)
        if failure is not None:
            raise failure  # noqa: B904 (the transport error stays its context)
        raise
