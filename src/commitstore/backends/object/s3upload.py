"""S3's upload session (:class:`S3Upload`): the ``Upload`` interface of ``upload.py`` over
multipart uploads, whose completion is the commit, and the ``Content-MD5`` of each body."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import io
from collections.abc import Coroutine
from typing import Any, Protocol

from commitstore.backends.object.upload import Upload, Written
from commitstore.errors import CommitError, CommitStoreError, NotFoundError
from commitstore.layout import Parts

MAX_PARTS = 10_000


class S3Calls(Protocol):
    """What an upload session needs of its store (``s3.S3Backend`` provides it)."""

    fs: Any
    part_size: int
    max_inflight: int

    def key(self, parts: Parts) -> str: ...

    def shown(self, parts: Parts) -> str: ...

    def call(self, what: str, parts: Parts, method: str, **kwargs: Any) -> Any: ...

    def send_body(
        self, what: str, parts: Parts, method: str, body: io.BytesIO, **kwargs: Any
    ) -> Coroutine[Any, Any, Any]: ...

    def run_coro(self, coro: Any) -> Any: ...


class S3Upload(Upload):
    """A multipart upload, created by its first part; ``CompleteMultipartUpload`` (or one
    ``PutObject``) is the commit, with ``IfNoneMatch="*"`` for create-only. Parts go
    concurrently; part size doubles every 1,000 parts (under 10,000 parts up to ~16 TiB)."""

    max_parts = MAX_PARTS

    def __init__(self, backend: S3Calls, parts: Parts, *, create_only: bool) -> None:
        self._b, self._parts, self._key = backend, parts, backend.key(parts)
        self._cond = {"IfNoneMatch": "*"} if create_only else {}
        self.part_size = backend.part_size
        self.max_inflight = backend.max_inflight
        self._upload_id: str | None = None

    def send_part(
        self, number: int, body: io.BytesIO, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        b = self._b
        if self._upload_id is None:
            created = b.call(
                "starting the upload of", self._parts, "create_multipart_upload", Key=self._key
            )
            self._upload_id = created["UploadId"]
        if number % 1000 == 0:
            self.part_size *= 2
        upload_id = self._upload_id

        async def part() -> dict[str, Any]:
            try:
                done = await b.send_body(
                    "uploading a part of",
                    self._parts,
                    "upload_part",
                    body,
                    Key=self._key,
                    UploadId=upload_id,
                    PartNumber=number,
                )
            except NotFoundError as exc:
                raise _gone(exc, b.shown(self._parts)) from exc
            return {"PartNumber": number, "ETag": done["ETag"]}

        return asyncio.run_coroutine_threadsafe(part(), b.fs.loop)

    def complete(self, receipts: list[Any]) -> Written:
        try:
            done = self._b.call(
                "completing the upload of",
                self._parts,
                "complete_multipart_upload",
                Key=self._key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": sorted(receipts, key=lambda p: p["PartNumber"])},
                **self._cond,
            )
        except NotFoundError as exc:
            raise _gone(exc, self._b.shown(self._parts)) from exc
        self._upload_id = None  # completed: nothing left to abort
        return Written(done.get("ETag"))

    def put_whole(self, body: io.BytesIO, length: int) -> Written:
        coro = self._b.send_body(
            "uploading", self._parts, "put_object", body, Key=self._key, **self._cond
        )
        return Written(self._b.run_coro(coro).get("ETag"))

    def abort(self) -> None:
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            self._b.call(
                "aborting the upload of",
                self._parts,
                "abort_multipart_upload",
                Key=self._key,
                UploadId=upload_id,
            )


def content_md5(body: io.BytesIO) -> dict[str, str]:
    """The ``ContentMD5`` parameter for ``body`` (the server refuses a body that does not match);
    MD5 as a transfer checksum, not for security."""
    with body.getbuffer() as view:
        digest = hashlib.md5(view, usedforsecurity=False).digest()
    return {"ContentMD5": base64.b64encode(digest).decode("ascii")}


def _gone(err: CommitStoreError, shown: str) -> CommitStoreError:
    """NoSuchUpload during an upload is a failed commit (the upload was aborted meanwhile, by gc
    or a lifecycle rule, or the request reached the server garbled), not a missing artifact."""
    if isinstance(err, NotFoundError):
        return CommitError(f"{shown}: the multipart upload no longer exists (aborted meanwhile?)")
    return err
