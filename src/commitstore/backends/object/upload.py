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
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import hashlib
import io
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from commitstore.backends.base import Capabilities, CommitInfo, FileSink, PutMode
from commitstore.errors import CommitError
from commitstore.layout import Parts


@dataclass(frozen=True, slots=True)
class ObjectStat:
    """One object as the store reports it (a fresh stat or a listing entry)."""

    key: str
    size: int
    mtime: float | None
    tag: str | None
    """ETag (S3, Azure) or generation (GCS): changes whenever the object is replaced."""
    checksum: str | None = None
    """The server's checksum of the content, in the encoding :meth:`Upload.checksum` uses."""


@dataclass(frozen=True, slots=True)
class Written:
    """What the store answered to the completion (or whole-object put)."""

    tag: str | None
    checksum: str | None = None


class Upload(abc.ABC):
    """One object's upload session: created without I/O, started by its first part."""

    part_size: int
    """Bytes of the next part (read before each part is filled: it may grow)."""
    max_inflight: int = 1
    """Parts in flight at once; 1 sends them one after the other, in order."""
    max_parts: int | None = None

    @abc.abstractmethod
    def send_part(
        self, number: int, body: io.BytesIO, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        """Send part ``number`` (from 1): ``body``, ``length`` bytes, positioned at 0 (the sink
        never touches it again; the session keeps it as long as the request needs it). ``final``:
        the last part. The future's result is the part's receipt for :meth:`complete`; its
        exception, a translated error."""

    @abc.abstractmethod
    def complete(self, receipts: list[Any]) -> Written:
        """The commit: make the parts (receipts in part order) the object, in one step."""

    @abc.abstractmethod
    def put_whole(self, body: io.BytesIO, length: int) -> Written:
        """The commit of a small object: ``body`` (``length`` bytes, at 0) in one request."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop the session if it was started (may raise; the sink ignores errors)."""

    def given_md5(self, number: int, md5: bytes) -> None:
        """The MD5 of the body of part ``number`` (0: the whole object), computed by the sink
        while it filled the body, given just before :meth:`send_part` (:meth:`put_whole`) when
        the store asks for them (``Store.md5_bodies``). Default: ignored."""
        del number, md5

    def checksum(self) -> str | None:
        """The checksum of every byte sent, to compare with :attr:`ObjectStat.checksum`."""
        return None

    def attested(self, written: Written) -> bool:
        """True when the store's answer to the completion (or whole-object put) itself shows the
        object is exactly the bytes sent, so no fresh stat is needed (S3: an ETag derived from
        the bodies' server-checked MD5s). False (the default) means: stat to find out."""
        return False


def done(result: Any) -> concurrent.futures.Future[Any]:
    """A future already holding ``result`` (for a part sent synchronously)."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.set_result(result)
    return fut


class Store(Protocol):
    """What the sink needs of its backend (an :class:`ObjectBackend`)."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def whole_max(self) -> int: ...

    @property
    def md5_bodies(self) -> bool:
        """True when each body's MD5 is needed (S3's Content-MD5): the sink computes it while
        the body fills, so the send starts the moment the body is complete."""
        ...

    def shown(self, parts: Parts) -> str: ...

    def head(self, parts: Parts) -> ObjectStat | None: ...

    def new_upload(self, parts: Parts, *, create_only: bool) -> Upload: ...

    def delete_version(self, parts: Parts, tag: str) -> None: ...


class ViewReader(io.RawIOBase):
    """A seekable, read-only file over a buffer the caller keeps unchanged until the request
    returns, used as a request body.

    aiohttp joins a ``bytes`` body with the request headers (one copy) and asyncio's transport
    keeps what the socket did not take yet (a second copy), so a 64 MiB chunk sent as ``bytes``
    costs three times its size. A file body is streamed in 64 KiB reads instead, and being
    seekable it can be sent again (gcsfs retries; aiohttp re-sends on a redirect status, and GCS
    answers every non-final chunk with 308).
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = self._view.nbytes if size is None or size < 0 else self._pos + size
        data = bytes(self._view[self._pos : end])
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class ObjectFileSink(FileSink):
    """One object: held whole up to ``whole_max``, else sent in parts; the completion publishes.

    Buffers are ``BytesIO`` objects that own their bytes: S3 hands them to botocore as bodies
    (aiohttp sends them without another copy), GCS sends them through :class:`ViewReader`.
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
        self._inflight: deque[tuple[int, concurrent.futures.Future[Any]]] = deque()
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

    def write(self, data: memoryview) -> None:
        assert not self._closed, "write after publish/abort"
        self.bytes_written += data.nbytes
        try:
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

    def _send(self, *, final: bool) -> None:
        up = self._session()
        part, self._part = self._part, None
        assert part is not None
        self._sent += 1
        if up.max_parts is not None and self._sent > up.max_parts:
            raise CommitError(f"{self._b.shown(self._parts)}: more than {up.max_parts} parts")
        length = part.tell()
        part.seek(0)
        if self._part_md5 is not None:
            up.given_md5(self._sent, self._part_md5.digest())
            self._part_md5 = None
        fut = up.send_part(self._sent, part, length, final=final)
        self._inflight.append((length, fut))
        while len(self._inflight) >= up.max_inflight:
            self._reap()

    def _reap(self) -> None:
        length, fut = self._inflight.popleft()
        self._receipts.append(fut.result())
        self._acked += length

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert not self._closed, "publish after publish/abort"
        shown = self._b.shown(self._parts)
        try:
            if size != self.bytes_written:
                raise CommitError(f"{shown}: {self.bytes_written} bytes written, {size} expected")
            up = self._session()
            if self._whole is not None:
                body, self._whole = self._whole, None
                length = body.tell()
                body.seek(0)
                if self._whole_md5 is not None:
                    up.given_md5(0, self._whole_md5.digest())
                written = up.put_whole(body, length)
                self._acked = length
            else:
                if self._part is not None and self._part.tell():
                    self._send(final=True)
                while self._inflight:
                    self._reap()
                if self._acked != size:
                    raise CommitError(f"{shown}: {self._acked} bytes in parts, {size} expected")
                written = up.complete(self._receipts)
            self._finished = True
            self._closed = True
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
        self._whole = self._part = None
        self._whole_md5 = self._part_md5 = None
        while self._inflight:
            with contextlib.suppress(Exception):
                self._inflight.popleft()[1].result()
        if self._up is not None and not self._finished:
            up, self._up = self._up, None
            # A dead endpoint leaves the session; gc, a lifecycle rule or expiry ends it.
            with contextlib.suppress(Exception):
                up.abort()
