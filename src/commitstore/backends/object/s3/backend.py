"""S3 strategy (``s3://bucket/prefix``): the upload's own completion is the commit.

There is no rename on an object store. An artifact uploads as a multipart upload whose
``CompleteMultipartUpload`` is the one step that makes it visible (a single ``PutObject`` when it is
at most ``single_put_max`` bytes, held in memory until then). Parts upload concurrently with bounded
memory (``single_put_max`` + ``max_inflight`` x ``part_size``); part size doubles every 1,000 parts
to stay under S3's 10,000. Every failure path aborts the upload; nothing is completed from
``__exit__`` after an exception (the upload is driven directly, never through an fsspec file's
close). After completion the object must be shown to be what was sent: the completion's ETag
equals the MD5-derived ETag of the bodies sent (each checked by the server: against its
``Content-MD5``, or by its answer's ETag, ``s3/upload``), or else a fresh HEAD must show the
expected size. ``IfNoneMatch="*"`` (create-only) is used for ``PutMode.CREATE`` exactly where
the endpoint honours it, which is probed once per store (or set with ``conditional_writes=``),
never assumed. The shared sink (``upload.py``) drives the upload; this module holds S3's
primitives, ``s3/upload.py`` the upload session (:class:`S3Upload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from collections.abc import Callable
from typing import Any, BinaryIO, cast
from urllib.parse import unquote, urlsplit

from commitstore.backends.base import MAX_SMALL_BYTES, PendingUpload, take_options, too_large
from commitstore.backends.object._transport import (
    ATTEMPTS,
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    request_deadline,
)
from commitstore.backends.object.base import ObjectBackend, with_heartbeat
from commitstore.backends.object.bodies import Body
from commitstore.backends.object.perprocess import PerProcess
from commitstore.backends.object.s3.errors import probe_conditional_create, translate
from commitstore.backends.object.s3.listing import list_prefix
from commitstore.backends.object.s3.reads import S3RangedReader
from commitstore.backends.object.s3.timestamps import fast_session
from commitstore.backends.object.s3.upload import (
    UPLOADS_DIR,
    S3Upload,
    body_md5,
    content_md5,
    upload_marker,
)
from commitstore.backends.object.upload import ObjectStat, Upload
from commitstore.errors import CommitError, ConfigurationError, NotFoundError
from commitstore.layout import META_DIR, Parts

MiB = 1024 * 1024
MAX_SINGLE_PUT = 5 * 1024 * MiB


class S3Backend(ObjectBackend):
    """A prefix in an S3 bucket (AWS or any S3-compatible endpoint)."""

    strategy = "s3-multipart"
    mtime_resolution = 1.0  # LastModified: whole seconds
    scheme = "s3"
    md5_bodies = True
    """Each body's Content-MD5 is computed by the sink while the body fills (the writer's
    thread), so a body is sent the moment it is complete."""
    reread_bodies = True
    """The server refuses a body that does not match its Content-MD5 (or answers a part with
    an ETag that shows it, ``s3/upload``), so a copy from a local file sends its bodies straight
    from that file (read again, by position), holding none of its bytes: the bytes sent are the
    bytes hashed, or nothing is stored."""

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
        read_part_size: int = 16 * MiB,
        read_inflight: int = 6,
        reason: str = "s3:// URL",
        make_fs: Callable[[], Any] | None = None,
    ) -> None:
        if read_part_size < 64 * 1024 or read_inflight < 1:
            raise ConfigurationError(
                "read_part_size must be at least 64 KiB and read_inflight at least 1"
            )
        if part_size < 5 * MiB:
            raise ConfigurationError("part_size must be at least 5 MiB (S3's minimum part)")
        if not 0 <= single_put_max <= MAX_SINGLE_PUT:
            raise ConfigurationError(
                "single_put_max must be between 0 and 5 GiB (S3's PutObject limit)"
            )
        super().__init__(bucket, prefix, conditional_writes=conditional_writes, reason=reason)
        self._fs = PerProcess(fs, make_fs, f"s3://{bucket}")
        self.endpoint = endpoint
        self.part_size = part_size
        self.max_inflight = max(1, max_inflight)
        self.single_put_max = single_put_max
        self.read_part_size = read_part_size
        self.read_inflight = read_inflight
        """A sequential read keeps up to ``read_inflight`` ranged GETs of ``read_part_size`` in
        flight: at most ``(read_inflight + 1) x read_part_size`` bytes of memory per reader."""
        self.part_etags_md5: bool | None = None
        """Whether this server answers a part with its body's MD5 as ETag (``s3/upload``)."""
        self.sign_payload = sign_payload
        """Every body is checked by the server (a Content-MD5, or a part's ETag: ``s3/upload``).
        False: the body is otherwise UNSIGNED-PAYLOAD. True: the SDK also signs its SHA-256 on
        the event loop, which authenticates it on plain HTTP (the fs must be configured to
        match: ``payload_signing_enabled``)."""

    @property
    def fs(self) -> Any:
        """The s3fs file system of this process (``make_fs`` makes one in a forked child)."""
        return self._fs.get()

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

    async def send_body(
        self,
        what: str,
        parts: Parts,
        method: str,
        body: Body,
        *,
        md5: bytes | None = None,
        checked: bool = True,
        **kwargs: Any,
    ) -> Any:
        """An S3 call with ``body`` and its Content-MD5 (``md5``: the body's MD5, when the caller
        computed it already), on s3fs's event loop. The MD5 is computed on a worker thread, so
        parts are hashed side by side and the loop stays free. ``checked=False`` (parts only,
        ``s3/upload``): no Content-MD5, the caller checks the answer's ETag instead."""
        try:
            if checked and md5 is None:
                assert isinstance(body, io.BytesIO), "a window's MD5 is always given"
                md5 = await asyncio.get_running_loop().run_in_executor(None, body_md5, body)
            header = content_md5(md5) if checked and md5 is not None else {}
            return await self.fs._call_s3(method, Bucket=self.bucket, Body=body, **header, **kwargs)
        except Exception as exc:
            raise translate(exc, what, self.shown(parts)) from exc

    # -- primitives --------------------------------------------------------------------
    @property
    def whole_max(self) -> int:
        return self.single_put_max

    def new_upload(self, parts: Parts, *, create_only: bool) -> Upload:
        return S3Upload(self, parts, create_only=create_only)

    def head(self, parts: Parts) -> ObjectStat | None:
        """A fresh HEAD of the object (never a listing cache); None if absent."""
        try:
            head = self.call("stat", parts, "head_object", Key=self.key(parts))
        except NotFoundError:
            return None
        return ObjectStat(self.key(parts), int(head["ContentLength"]), _ts(head), head.get("ETag"))

    def list_objects(self, parts: Parts, *, limit: int | None = None) -> list[ObjectStat]:
        """One request per 1,000 keys (one only with ``limit``); a longer listing lists the
        prefix's folders side by side (``s3/listing.py``)."""
        return cast(
            "list[ObjectStat]",
            self.run_coro(list_prefix(self, parts, self.dir_prefix(parts), limit)),
        )

    async def listing_call(self, parts: Parts, **kwargs: Any) -> dict[str, Any]:
        """One ListObjectsV2 request, on s3fs's event loop."""
        try:
            return cast(
                "dict[str, Any]",
                await self.fs._call_s3("list_objects_v2", Bucket=self.bucket, **kwargs),
            )
        except Exception as exc:
            raise translate(exc, "listing", self.shown(parts)) from exc

    def stat_of(self, entry: dict[str, Any]) -> ObjectStat:
        return ObjectStat(entry["Key"], int(entry["Size"]), _ts(entry), entry.get("ETag"))

    def delete_key(self, parts: Parts, key: str) -> None:
        self.call("removing", parts, "delete_object", Key=key)

    def delete_keys(self, parts: Parts, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            self.call("removing", parts, "delete_objects", Delete={"Objects": batch})

    def delete_version(self, parts: Parts, tag: str) -> None:
        """S3-compatible servers have no conditional delete to rely on: the caller has just seen
        ``tag`` in a fresh HEAD, and deletes right after."""
        self.delete_key(parts, self.key(parts))

    copy_max = 5 * 1024**3  # CopyObject's limit

    def server_copy(self, src: ObjectStat, parts: Parts) -> ObjectStat:
        """CopyObject, conditioned on the source's ETag (``x-amz-copy-source-if-match``)."""
        cond = {"CopySourceIfMatch": src.tag} if src.tag else {}
        source = {"Bucket": self.bucket, "Key": src.key}
        self.call(
            "copying to", parts, "copy_object", Key=self.key(parts), CopySource=source, **cond
        )
        got = self.head(parts)
        if got is None:
            raise CommitError(f"{self.shown(parts)}: gone right after its copy")
        return got

    def same_content(self, src: ObjectStat, dst: ObjectStat) -> bool:
        """Sizes, and the ETags when the source's is a plain MD5 (a single-part upload: every
        file up to ``single_put_max``); a multipart ETag is no digest of the bytes."""
        plain = src.tag is not None and "-" not in src.tag
        return src.size == dst.size and (not plain or src.tag == dst.tag)

    # -- Backend API -------------------------------------------------------------------
    def mark_empty_folder(self, parts: Parts) -> None:
        """A zero-byte ``name/`` marker: an empty folder exists on S3 only as that."""
        self.call("uploading", parts, "put_object", Key=self.key(parts) + "/", Body=b"")

    def open_read(self, parts: Parts) -> BinaryIO:
        """A fresh HEAD pins the version (size, ETag); the bytes come in ranged GETs of
        ``read_part_size``, up to ``read_inflight`` in flight while the reader reads on, each
        conditioned on that ETag (``s3/reads.py``)."""
        found = self.head(parts)
        if found is None:
            raise NotFoundError(f"{self.shown(parts)} does not exist")
        reader = S3RangedReader(
            self.fs,
            self.bucket,
            self.key(parts),
            self.shown(parts),
            size=found.size,
            etag=found.tag,
            block=self.read_part_size,
            depth=self.read_inflight,
        )
        return cast(BinaryIO, reader)

    def read_small_tagged(self, parts: Parts) -> tuple[bytes, str | None]:
        """One GET; the tag is the ETag of the version that GET returned. The response's length
        is checked before its body is read: a larger object than ``MAX_SMALL_BYTES`` raises
        RecordFormatError, its body never read (the connection is dropped)."""
        result = self.call("reading", parts, "get_object", Key=self.key(parts))
        body = result["Body"]
        try:
            length = result.get("ContentLength")
            if isinstance(length, int) and length > MAX_SMALL_BYTES:
                raise too_large(self.shown(parts), length)
            data: bytes = self.run_coro(_read_capped(body, MAX_SMALL_BYTES + 1))
            if len(data) > MAX_SMALL_BYTES:  # no length given, or a longer body than it said
                raise too_large(self.shown(parts), len(data))
        finally:
            body.close()
        return data, result.get("ETag")

    def run_coro(self, coro: Any) -> Any:
        """Run a coroutine on s3fs's event loop from this thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.fs.loop).result()

    def pending_uploads(self) -> list[PendingUpload]:
        """Multipart uploads under this store's prefix only (``prefix/``, never a sibling).

        An upload's time is its last activity: the newest of its start, its parts' upload
        times and its writer's last proof of life (``s3/upload.upload_marker``, rewritten every
        ``heartbeat`` seconds while the writer lives), so a long upload still receiving parts,
        or whose writer pauses between parts, is young (and moto's fixed ``Initiated`` cannot
        make a live upload look old).
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
                alive = self.head(upload_marker(up["UploadId"]))
                if alive is not None and alive.mtime is not None:
                    times.append(alive.mtime)
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

    def orphan_markers(self, uploads: list[PendingUpload]) -> list[tuple[Parts, float | None]]:
        listed = {upload_marker(up.upload_id) for up in uploads}
        where = (META_DIR, UPLOADS_DIR)
        found = [((*where, *rel), info.mtime) for rel, info in self.walk(where)]
        return [(parts, mtime) for parts, mtime in found if parts not in listed]

    def abort_upload(self, upload: PendingUpload) -> None:
        if not upload.key.startswith(self.dir_prefix(())):
            raise ValueError(f"{upload.key} is outside {self.shown(())}")
        self.call(
            "aborting", (), "abort_multipart_upload", Key=upload.key, UploadId=upload.upload_id
        )
        marker = upload_marker(upload.upload_id)
        with contextlib.suppress(NotFoundError):
            self.call("removing", marker, "delete_object", Key=self.key(marker))

    def describe_store(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "part_size": self.part_size,
            "max_inflight": self.max_inflight,
            "single_put_max": self.single_put_max,
            "sign_payload": self.sign_payload,
            "read_part_size": self.read_part_size,
            "read_inflight": self.read_inflight,
        }


def _ts(entry: dict[str, Any]) -> float | None:
    modified = entry.get("LastModified")
    ts = modified.timestamp() if modified is not None else 0.0
    return ts if ts > 0 else None


def factory(url: str, options: dict[str, Any]) -> ObjectBackend:
    opts = take_options(
        options,
        {
            "endpoint_url": None,
            "key": None,
            "secret": None,
            "token": None,
            "part_size": 8 * 1024 * 1024,
            "max_inflight": 4,
            "single_put_max": 64 * 1024 * 1024,
            "sign_payload": False,
            "conditional_writes": None,
            "read_part_size": 16 * 1024 * 1024,
            "read_inflight": 6,
            "heartbeat": ObjectBackend.heartbeat,
            "connect_timeout": CONNECT_TIMEOUT,
            "read_timeout": READ_TIMEOUT,
            "retries": ATTEMPTS,
        },
        kinds={"conditional_writes": (bool, None), "endpoint_url": (str, None)},
    )
    for name in ("read_part_size", "read_inflight"):
        if not isinstance(opts[name], int) or isinstance(opts[name], bool):
            raise ConfigurationError(f"{name} must be an integer, not {opts[name]!r}")
    deadline = request_deadline(opts["connect_timeout"], opts["read_timeout"], opts["retries"])
    if not isinstance(opts["sign_payload"], bool):
        raise ConfigurationError(
            f"sign_payload must be True or False, not {opts['sign_payload']!r}"
        )
    parsed = urlsplit(url)
    if not parsed.netloc:
        raise ConfigurationError("S3 URLs look like s3://bucket[/prefix]")
    import s3fs

    endpoint = (
        opts["endpoint_url"]
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )

    def make_fs() -> Any:
        fs = s3fs.S3FileSystem(
            key=opts["key"],
            secret=opts["secret"],
            token=opts["token"],
            endpoint_url=endpoint,
            skip_instance_cache=True,
            session=fast_session(),
            config_kwargs={
                **deadline,
                # botocore >= 1.36 checksums break several S3-compatible servers (s3fs#931)
                "request_checksum_calculation": "when_required",
                "response_checksum_validation": "when_required",
                # Bodies carry a Content-MD5 instead of a SHA-256 signature unless asked
                "s3": {"payload_signing_enabled": bool(opts["sign_payload"])},
            },
        )
        fs.retries = 1  # botocore retries (bounded, above); s3fs's own would multiply them
        return fs

    fs = make_fs()
    return with_heartbeat(
        S3Backend(
            fs,
            parsed.netloc,
            unquote(parsed.path),
            endpoint=endpoint,
            part_size=int(opts["part_size"]),
            max_inflight=int(opts["max_inflight"]),
            single_put_max=int(opts["single_put_max"]),
            sign_payload=bool(opts["sign_payload"]),
            conditional_writes=opts["conditional_writes"],
            read_part_size=opts["read_part_size"],
            read_inflight=opts["read_inflight"],
            reason="s3:// URL (multipart upload completion is the commit)",
            make_fs=make_fs,
        ),
        opts["heartbeat"],
    )


async def _read_capped(body: Any, cap: int) -> bytes:
    """The bytes of a response body up to its end, or its first ``cap`` or more when it is longer
    (a stream's ``read(n)`` may return fewer than ``n`` before the end)."""
    chunks: list[bytes] = []
    total = 0
    while total < cap:
        chunk: bytes = await body.read(cap - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
