"""The S3 upload behind a commit: one PutObject up to ``single_put_max``, else a multipart upload
whose ``CompleteMultipartUpload`` publishes. Every body carries a Content-MD5 (see ``S3Backend``).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import io
from collections import deque
from typing import TYPE_CHECKING, Any

from commitstore.backends.base import CommitInfo, FileSink
from commitstore.backends.object._s3errors import translate
from commitstore.errors import AlreadyExistsError, CommitError, CommitStoreError, NotFoundError
from commitstore.layout import Parts

if TYPE_CHECKING:
    from commitstore.backends.object.s3 import S3Backend

MAX_PARTS = 10_000


class S3FileSink(FileSink):
    """One object, uploaded in parts; ``CompleteMultipartUpload`` (or one PutObject) publishes."""

    def __init__(self, backend: S3Backend, parts: Parts, *, overwrite: bool) -> None:
        self._b = backend
        self._parts = parts
        self._key = backend.key(parts)
        self._overwrite = overwrite
        self._buf = io.BytesIO()
        self._part_size = backend.part_size
        self._upload_id: str | None = None
        self._done_parts: list[dict[str, Any]] = []
        self._inflight: deque[tuple[int, int, concurrent.futures.Future[Any]]] = deque()
        # Bytes are held in BytesIO objects that own their buffer and are handed to botocore as
        # the body: aiohttp sends them without another copy (a BytesIO made from ``bytes``
        # shares them and copies them all when aiohttp takes its buffer).
        self._md5: Any = _md5()  # of the single-PutObject body; None once multipart
        self._uploaded = 0
        self._closed = False
        self.bytes_written = 0

    def write(self, data: memoryview) -> None:
        assert not self._closed, "write after publish/abort"
        self.bytes_written += data.nbytes
        try:
            if self._md5 is None:
                self._fill(data)
                return
            self._buf.write(data)
            self._md5.update(data)
            if self._buf.tell() <= self._b.single_put_max:
                return  # may still be published with one PutObject
            # Too big for one PutObject: a multipart upload, whose first parts are these bytes.
            self._md5 = None
            held, self._buf = self._buf, io.BytesIO()
            with held.getbuffer() as view:
                self._fill(view)
        except BaseException:
            self.abort()
            raise

    def _fill(self, data: memoryview) -> None:
        """Append to the current part (copied once, into the part's own buffer); start the upload
        of every part that fills up."""
        while data.nbytes:
            room = self._part_size - self._buf.tell()
            self._buf.write(data[:room])
            data = data[room:]
            if self._buf.tell() >= self._part_size:
                part, self._buf = self._buf, io.BytesIO()
                length = part.tell()
                part.seek(0)
                self._submit(part, length)

    def _submit(self, chunk: io.BytesIO, length: int) -> None:
        if self._upload_id is None:
            created = self._b.call(
                "starting the upload of", self._parts, "create_multipart_upload", Key=self._key
            )
            self._upload_id = created["UploadId"]
        number = len(self._done_parts) + len(self._inflight) + 1
        if number > MAX_PARTS:
            raise CommitError(f"{self._b.shown(self._parts)}: more than {MAX_PARTS} parts")
        fut = self._b.submit_body(
            "upload_part", chunk, Key=self._key, UploadId=self._upload_id, PartNumber=number
        )
        self._inflight.append((number, length, fut))
        if number % 1000 == 0:
            self._part_size *= 2  # stays under 10,000 parts for any object up to ~16 TiB
        while len(self._inflight) >= self._b.max_inflight:
            self._reap()

    def _reap(self) -> None:
        number, size, fut = self._inflight.popleft()
        try:
            result = fut.result()
        except Exception as exc:
            shown = self._b.shown(self._parts)
            raise _gone(translate(exc, "uploading a part of", shown), shown) from exc
        self._done_parts.append({"PartNumber": number, "ETag": result["ETag"]})
        self._uploaded += size

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert not self._closed, "publish after publish/abort"
        b = self._b
        shown = b.shown(self._parts)
        try:
            if size != self.bytes_written:
                raise CommitError(f"{shown}: {self.bytes_written} bytes written, {size} expected")
            conditional: dict[str, Any] = {}
            if not self._overwrite:
                if b.conditional_writes():
                    conditional = {"IfNoneMatch": "*"}
                elif b.head(self._parts) is not None:
                    raise AlreadyExistsError(f"{shown} already exists")
            if self._upload_id is None:
                body, self._buf = self._buf, io.BytesIO()
                body.seek(0)
                md5 = (
                    content_md5(body)  # (more than single_put_max, less than a part)
                    if self._md5 is None
                    else {"ContentMD5": _b64(self._md5.digest())}
                )
                done = b.call(
                    "uploading",
                    self._parts,
                    "put_object",
                    Key=self._key,
                    Body=body,
                    **conditional,
                    **md5,
                )
                self._uploaded = self.bytes_written
            else:
                rest, self._buf = self._buf, io.BytesIO()
                if rest.tell():
                    length = rest.tell()
                    rest.seek(0)
                    self._submit(rest, length)
                while self._inflight:
                    self._reap()
                if self._uploaded != size:
                    raise CommitError(f"{shown}: {self._uploaded} bytes in parts, {size} expected")
                done = _call_upload(
                    b,
                    "completing the upload of",
                    self._parts,
                    "complete_multipart_upload",
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={
                        "Parts": sorted(self._done_parts, key=lambda p: p["PartNumber"])
                    },
                    **conditional,
                )
                self._upload_id = None  # completed: nothing left to abort
            self._closed = True
            head = b.head(self._parts)
            found = -1 if head is None else int(head["ContentLength"])
            etag = done.get("ETag")
            if conditional and head is not None and etag and head.get("ETag") != etag:
                raise CommitError(
                    f"{shown}: another writer replaced the object right after this upload "
                    "completed (the endpoint did not serialise the create-only condition)"
                )
            if found != size:
                if head is not None and etag and head.get("ETag") == etag:
                    # Our own object is wrong: take it back (never another writer's).
                    with contextlib.suppress(Exception):
                        b.call("removing", self._parts, "delete_object", Key=self._key)
                raise CommitError(
                    f"{shown}: post-upload size check failed: {found} bytes stored, {size} written"
                )
            return CommitInfo(
                size,
                notes=[]
                if conditional or self._overwrite
                else ["endpoint ignores conditional writes: create-only is best effort"],
            )
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        self._closed = True
        self._buf = io.BytesIO()
        while self._inflight:
            _, _, fut = self._inflight.popleft()
            with contextlib.suppress(Exception):
                fut.result()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            # A dead endpoint leaves the upload pending; gc (and a bucket lifecycle rule) ends it.
            with contextlib.suppress(Exception):
                self._b.call(
                    "aborting the upload of",
                    self._parts,
                    "abort_multipart_upload",
                    Key=self._key,
                    UploadId=upload_id,
                )


def content_md5(body: io.BytesIO) -> dict[str, str]:
    """The ``ContentMD5`` parameter for ``body`` (the server refuses a body that does not match)."""
    with body.getbuffer() as view:
        return {"ContentMD5": _b64(_md5(view).digest())}


def _md5(data: memoryview | None = None) -> Any:
    """MD5 as a transfer checksum (Content-MD5), not for security."""
    h = hashlib.md5(usedforsecurity=False)
    if data is not None:
        h.update(data)
    return h


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _gone(err: CommitStoreError, shown: str) -> CommitStoreError:
    """NoSuchUpload during an upload is a failed commit (the upload was aborted meanwhile, by gc
    or a lifecycle rule, or the request reached the server garbled), not a missing artifact."""
    if isinstance(err, NotFoundError):
        return CommitError(f"{shown}: the multipart upload no longer exists (aborted meanwhile?)")
    return err


def _call_upload(b: S3Backend, what: str, parts: Parts, method: str, **kwargs: Any) -> Any:
    try:
        return b.call(what, parts, method, **kwargs)
    except NotFoundError as exc:
        raise _gone(exc, b.shown(parts)) from exc
