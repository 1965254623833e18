"""S3 strategy (``s3://bucket/prefix``): the upload's own completion is the commit.

There is no rename on an object store. An artifact uploads as a multipart upload whose
``CompleteMultipartUpload`` is the one step that makes it visible (a single ``PutObject`` when it is
at most ``single_put_max`` bytes, held in memory until then). Parts upload concurrently with bounded
memory (``single_put_max`` + ``max_inflight`` x ``part_size``); part size doubles every 1,000 parts
to stay under S3's 10,000. Every failure path aborts the upload; nothing is completed from
``__exit__`` after an exception (the upload is driven directly, never through an fsspec file's
close). After completion a fresh HEAD must show the expected size. ``IfNoneMatch="*"``
(create-only) is used for ``overwrite=False`` where the endpoint honours it, which is probed once
per store (or set with ``conditional_writes=``), never assumed.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import hashlib
import io
from collections import deque
from typing import Any, BinaryIO

from .._names import Parts
from ..errors import AlreadyExistsError, CommitError, CommitStoreError, NotFoundError
from ._base import (
    CommitInfo,
    FileInfo,
    FileSink,
    PendingUpload,
)
from ._object import ObjectBackend
from ._s3io import probe_conditional_create, translate

MiB = 1024 * 1024
MAX_PARTS = 10_000
MAX_SINGLE_PUT = 5 * 1024 * MiB


class S3Backend(ObjectBackend):
    """A prefix in an S3 bucket (AWS or any S3-compatible endpoint)."""

    strategy = "s3-multipart"
    scheme = "s3"

    def __init__(
        self,
        fs: Any,
        bucket: str,
        prefix: str,
        *,
        endpoint: str | None,
        part_size: int = 8 * MiB,
        max_inflight: int = 4,
        single_put_max: int = 64 * MiB,
        sign_payload: bool = False,
        conditional_writes: bool | None = None,
        reason: str = "s3:// URL",
    ) -> None:
        if part_size < 5 * MiB:
            raise ValueError("part_size must be at least 5 MiB (S3's minimum part)")
        if not 0 <= single_put_max <= MAX_SINGLE_PUT:
            raise ValueError("single_put_max must be between 0 and 5 GiB (S3's PutObject limit)")
        super().__init__(bucket, prefix, conditional_writes=conditional_writes, reason=reason)
        self.fs = fs
        self.endpoint = endpoint
        self.part_size = part_size
        self.max_inflight = max(1, max_inflight)
        self.single_put_max = single_put_max
        self.sign_payload = sign_payload
        """Every body carries a Content-MD5 (computed while staging, off the event loop) that the
        server checks before storing anything. False: the body is otherwise UNSIGNED-PAYLOAD.
        True: the SDK also signs its SHA-256 on the event loop, which authenticates it on plain
        HTTP (the fs must be configured to match: ``payload_signing_enabled``)."""

    def _probe_conditional(self) -> bool:
        try:
            return probe_conditional_create(self.fs, self.bucket, self.prefix)
        except Exception as exc:
            raise translate(exc, "probing conditional writes at", self.shown(())) from exc

    def call(self, what: str, parts: Parts, method: str, **kwargs: Any) -> Any:
        try:
            return self.fs.call_s3(method, Bucket=self.bucket, **kwargs)
        except Exception as exc:
            raise translate(exc, what, self.shown(parts)) from exc

    def submit_body(
        self, method: str, body: io.BytesIO, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Start an S3 call with ``body`` and its Content-MD5 on s3fs's event loop; returns a
        future (for concurrent parts). The MD5 is computed on a worker thread, so the caller goes
        on reading while parts are hashed side by side."""

        async def run() -> Any:
            loop = asyncio.get_running_loop()
            md5 = await loop.run_in_executor(None, content_md5, body)
            return await self.fs._call_s3(method, Bucket=self.bucket, Body=body, **md5, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self.fs.loop)

    # -- Backend API -------------------------------------------------------------------
    def file_sink(self, parts: Parts, *, overwrite: bool) -> FileSink:
        return S3FileSink(self, parts, overwrite=overwrite)

    def mark_empty_folder(self, parts: Parts) -> None:
        """A zero-byte ``name/`` marker: an empty folder exists on S3 only as that."""
        self.call("uploading", parts, "put_object", Key=self.key(parts) + "/", Body=b"")

    def open_read(self, parts: Parts) -> BinaryIO:
        path = f"{self.bucket}/{self.key(parts)}"
        self.fs.invalidate_cache(path)
        try:
            f: BinaryIO = self.fs.open(path, "rb", block_size=8 * MiB, cache_type="readahead")
        except Exception as exc:
            raise translate(exc, "opening", self.shown(parts)) from exc
        return f

    read_concurrency = 16

    def read_small(self, parts: Parts) -> bytes:
        """One GET (no HEAD first)."""
        return self.read_small_tagged(parts)[0]

    def read_small_tagged(self, parts: Parts) -> tuple[bytes, str | None]:
        """One GET; the tag is the ETag of the version that GET returned."""
        result = self.call("reading", parts, "get_object", Key=self.key(parts))
        body = result["Body"]
        try:
            data: bytes = self.run_coro(body.read())
        finally:
            body.close()
        return data, result.get("ETag")

    def run_coro(self, coro: Any) -> Any:
        """Run a coroutine on s3fs's event loop from this thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.fs.loop).result()

    def head(self, parts: Parts) -> dict[str, Any] | None:
        """A fresh HEAD of the object (never a listing cache); None if absent."""
        try:
            result: dict[str, Any] = self.call("stat", parts, "head_object", Key=self.key(parts))
        except NotFoundError:
            return None
        return result

    def stat(self, parts: Parts) -> FileInfo | None:
        head = self.head(parts) if parts else None
        if head is not None:
            modified = head.get("LastModified")
            ts = modified.timestamp() if modified is not None else 0.0
            return FileInfo(int(head["ContentLength"]), ts if ts > 0 else None)
        listing = self.call(
            "listing", parts, "list_objects_v2", Prefix=self.dir_prefix(parts), MaxKeys=1
        )
        if listing.get("KeyCount", 0) or listing.get("Contents"):
            return FileInfo(0, None, is_dir=True)
        return None

    def _objects(self, parts: Parts) -> list[dict[str, Any]]:
        """Every object below ``parts`` (one request per 1,000 keys), folder markers included."""
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": self.dir_prefix(parts)}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.call("listing", parts, "list_objects_v2", **kwargs)
            out.extend(page.get("Contents", []))
            if not page.get("IsTruncated"):
                return out
            token = page.get("NextContinuationToken")

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        prefix = self.dir_prefix(parts)
        out: list[tuple[Parts, FileInfo]] = []
        for obj in self._objects(parts):
            if obj["Key"].endswith("/"):
                continue  # a folder marker (empty folder artifact), not a file
            rel = tuple(obj["Key"][len(prefix) :].split("/"))
            ts = obj["LastModified"].timestamp() if obj.get("LastModified") else 0.0
            info = FileInfo(int(obj["Size"]), ts if ts > 0 else None, tag=obj.get("ETag"))
            out.append((rel, info))
        return out

    def remove(self, parts: Parts) -> bool:
        if self.head(parts) is not None:
            self.call("removing", parts, "delete_object", Key=self.key(parts))
            return True
        keys = [obj["Key"] for obj in self._objects(parts)]
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            self.call("removing", parts, "delete_objects", Delete={"Objects": batch})
        return bool(keys)

    def pending_uploads(self) -> list[PendingUpload]:
        """Multipart uploads under this store's prefix only (``prefix/``, never a sibling).

        An upload's time is its last activity: the newest of its start and its parts' upload
        times, so a long upload still receiving parts is young (and moto's fixed ``Initiated``
        cannot make a live upload look old).
        """
        prefix = self.dir_prefix(())
        out: list[PendingUpload] = []
        markers: dict[str, Any] = {}
        while True:
            try:
                page = self.call(
                    "listing uploads under", (), "list_multipart_uploads", Prefix=prefix, **markers
                )
            except NotFoundError:  # rclone answers NoSuchUpload when there are none
                return out
            for up in page.get("Uploads", []):
                if not up["Key"].startswith(prefix):
                    continue
                started = up.get("Initiated")
                times = [started.timestamp()] if started is not None else []
                times += self._part_times(up["Key"], up["UploadId"])
                last = max(times) if times else 0.0
                out.append(PendingUpload(up["Key"], up["UploadId"], last if last > 0 else None))
            if not page.get("IsTruncated"):
                return out
            markers = {
                "KeyMarker": page.get("NextKeyMarker"),
                "UploadIdMarker": page.get("NextUploadIdMarker"),
            }

    def _part_times(self, key: str, upload_id: str) -> list[float]:
        times: list[float] = []
        marker: dict[str, Any] = {}
        while True:
            try:
                page = self.call(
                    "listing parts of", (), "list_parts", Key=key, UploadId=upload_id, **marker
                )
            except NotFoundError:  # completed or aborted meanwhile
                return times
            times += [
                p["LastModified"].timestamp()
                for p in page.get("Parts", [])
                if p.get("LastModified")
            ]
            if not page.get("IsTruncated"):
                return times
            marker = {"PartNumberMarker": page.get("NextPartNumberMarker")}

    def abort_upload(self, upload: PendingUpload) -> None:
        if not upload.key.startswith(self.dir_prefix(())):
            raise ValueError(f"{upload.key} is outside {self.shown(())}")
        self.call(
            "aborting", (), "abort_multipart_upload", Key=upload.key, UploadId=upload.upload_id
        )

    def describe(self) -> dict[str, Any]:
        return {
            **self.common_description(),
            "endpoint": self.endpoint,
            "part_size": self.part_size,
            "max_inflight": self.max_inflight,
            "single_put_max": self.single_put_max,
            "sign_payload": self.sign_payload,
        }


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
