"""S3's upload session (:class:`S3Upload`): the ``Upload`` interface of ``upload.py`` over
multipart uploads, whose completion is the commit, and the ``Content-MD5`` of each body.

Every part's answer is checked: its ETag must be the MD5 of the body sent, which S3 and every
compatible server we know compute from the bytes they stored. Once a store has seen one part
answered that way (:attr:`S3Calls.part_etags_md5`), later parts go without ``Content-MD5``: the
ETag is then the server's own hash of what it received, compared with ours before the part is
used, so the check stays on the server's side of the wire while the server hashes each body once
rather than twice (``rclone serve s3`` hashes a body for its ``Content-MD5`` and again for its
ETag). A part whose ETag is not its body's MD5 is sent again with ``Content-MD5``, which the
server checks: garbled on the way, it is refused; answered with another ETag again, on a store
whose parts were answered with MD5s, the commit fails (``CommitError``); on a store not yet
known, the server's part ETags are taken to be something else (a KMS-encrypted bucket) and every
later part carries ``Content-MD5``. A ``PutObject`` always carries it: it is the commit itself.
Nothing is completed until every part's answer passed."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import io
import logging
import threading
from collections.abc import Coroutine
from typing import Any, Protocol

from commitstore.backends.object.bodies import Body, SourceWindow
from commitstore.backends.object.upload import Upload, Written
from commitstore.errors import CommitError, CommitStoreError, NotFoundError
from commitstore.layout import META_DIR, Parts

MAX_PARTS = 10_000
UPLOADS_DIR = "uploads"
"""``.commitstore/uploads/<upload id>``: the proof of life of a live multipart upload."""

log = logging.getLogger("commitstore")


def upload_marker(upload_id: str) -> Parts:
    """Where the writer of multipart upload ``upload_id`` proves it is alive (an empty object
    rewritten every ``heartbeat`` seconds while the upload is open): gc ages the upload by it,
    so a writer that pauses between parts for longer than ``min_age`` keeps its upload."""
    return (META_DIR, UPLOADS_DIR, upload_id.replace("/", "_"))


class S3Calls(Protocol):
    """What an upload session needs of its store (``s3.S3Backend`` provides it)."""

    fs: Any
    part_size: int
    max_inflight: int
    part_etags_md5: bool | None
    """True once a part was answered with its body's MD5 as ETag, False once one was answered
    otherwise although the server took its Content-MD5, None before either."""

    def key(self, parts: Parts) -> str: ...

    def shown(self, parts: Parts) -> str: ...

    def call(self, what: str, parts: Parts, method: str, **kwargs: Any) -> Any: ...

    def send_body(
        self,
        what: str,
        parts: Parts,
        method: str,
        body: Body,
        *,
        md5: bytes | None = None,
        checked: bool = True,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, Any]: ...

    def run_coro(self, coro: Any) -> Any: ...

    @property
    def heartbeat(self) -> float: ...


class _Alive:
    """A daemon thread that rewrites an upload's marker every ``interval`` seconds until
    :meth:`stop`, which also removes the marker. A failed rewrite is logged, never raised: the
    upload itself reports what matters (gc may abort an upload whose marker went stale; its
    writer's next part or completion then fails, and nothing is published)."""

    def __init__(self, b: S3Calls, upload_id: str) -> None:
        self._b, self._parts = b, upload_marker(upload_id)
        self._stop = threading.Event()
        self._beat()  # before the first part: the upload is never without a proof of life
        self._thread = threading.Thread(target=self._run, name="commitstore-upload-alive")
        self._thread.daemon = True
        self._thread.start()

    def _beat(self) -> None:
        try:
            self._b.call(
                "marking alive the upload of",
                self._parts,
                "put_object",
                Key=self._b.key(self._parts),
                Body=b"",
            )
        except CommitStoreError as exc:
            log.warning("%s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self._b.heartbeat):
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        try:
            self._b.call("removing", self._parts, "delete_object", Key=self._b.key(self._parts))
        except CommitStoreError as exc:  # gc removes a stale marker with its upload
            log.debug("%s", exc)


class S3Upload(Upload):
    """A multipart upload, created by its first part; ``CompleteMultipartUpload`` (or one
    ``PutObject``) is the commit, with ``IfNoneMatch="*"`` for create-only. Parts go
    concurrently; part size doubles every 1,000 parts (under 10,000 parts up to ~16 TiB).

    Each body's MD5 is kept: the ETag S3 (and every compatible server that follows its
    convention) answers to the completion is derived from them (one body: its MD5; parts: the MD5
    of the parts' MD5s, then ``-N``), so a matching answer shows the object is exactly the bodies
    sent, each of which the server checked against its ``Content-MD5`` (:meth:`attested`)."""

    max_parts = MAX_PARTS

    def __init__(self, backend: S3Calls, parts: Parts, *, create_only: bool) -> None:
        self._b, self._parts, self._key = backend, parts, backend.key(parts)
        self._cond: dict[str, Any] = {"IfNoneMatch": "*"} if create_only else {}
        self.part_size = backend.part_size
        self.max_inflight = backend.max_inflight
        self._upload_id: str | None = None
        self._md5s: dict[int, bytes] = {}
        self._given: dict[int, bytes] = {}  # MD5s the sink computed while filling the bodies
        self._expected_tag: str | None = None
        self._alive: _Alive | None = None

    def _stop_alive(self) -> None:
        alive, self._alive = self._alive, None
        if alive is not None:
            alive.stop()

    def given_md5(self, number: int, md5: bytes) -> None:
        self._given[number] = md5

    def send_part(
        self, number: int, body: io.BytesIO, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        return self._send(number, body)

    def send_window(
        self, number: int, body: SourceWindow, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        return self._send(number, body)

    def _send(self, number: int, body: Body) -> concurrent.futures.Future[Any]:
        b = self._b
        given = self._given.pop(number, None)
        if self._upload_id is None:
            created = b.call(
                "starting the upload of", self._parts, "create_multipart_upload", Key=self._key
            )
            self._upload_id = created["UploadId"]
            self._alive = _Alive(b, self._upload_id)
        if number % 1000 == 0:
            self.part_size *= 2
        upload_id = self._upload_id

        async def part() -> dict[str, Any]:
            try:
                md5 = given
                if md5 is None:  # not computed while filling: hash it now, off the loop
                    assert isinstance(body, io.BytesIO), "a window's MD5 is always given"
                    md5 = await asyncio.get_running_loop().run_in_executor(None, body_md5, body)
                self._md5s[number] = md5
                known = b.part_etags_md5
                tag = await self._part(body, md5, number, upload_id, checked=known is not True)
                if tag != md5.hex() and known is not False:
                    # stored bytes that are not the body's, or not an MD5 ETag: again, checked
                    body.seek(0)
                    tag = await self._part(body, md5, number, upload_id, checked=True)
                    if tag != md5.hex():
                        if b.part_etags_md5:
                            raise CommitError(
                                f"{b.shown(self._parts)}: part {number} was stored twice with an "
                                f"ETag ({tag}) that is not the MD5 of the body sent"
                            )
                        b.part_etags_md5 = False
                elif tag == md5.hex() and known is None:
                    b.part_etags_md5 = True
            except NotFoundError as exc:
                raise _gone(exc, b.shown(self._parts)) from exc
            return {"PartNumber": number, "ETag": f'"{tag}"'}

        return asyncio.run_coroutine_threadsafe(part(), b.fs.loop)

    async def _part(
        self, body: Body, md5: bytes, number: int, upload_id: str, *, checked: bool
    ) -> str:
        """Send part ``number``; its ETag as answered, unquoted (``checked``: with Content-MD5)."""
        done = await self._b.send_body(
            "uploading a part of",
            self._parts,
            "upload_part",
            body,
            md5=md5,
            checked=checked,
            Key=self._key,
            UploadId=upload_id,
            PartNumber=number,
        )
        return str(done.get("ETag") or "").strip().strip('"')

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
        self._stop_alive()
        numbers = sorted(p["PartNumber"] for p in receipts)
        if numbers == sorted(self._md5s):
            joined = b"".join(self._md5s[n] for n in numbers)
            digest = hashlib.md5(joined, usedforsecurity=False).hexdigest()
            self._expected_tag = f"{digest}-{len(numbers)}"
        return Written(done.get("ETag"))

    def put_whole(self, body: io.BytesIO, length: int) -> Written:
        given = self._given.pop(0, None)
        return self._put(body, given if given is not None else body_md5(body))

    def put_window(self, body: SourceWindow, length: int) -> Written:
        return self._put(body, self._given.pop(0))

    def _put(self, body: Body, md5: bytes) -> Written:
        coro = self._b.send_body(
            "uploading", self._parts, "put_object", body, md5=md5, Key=self._key, **self._cond
        )
        written = Written(self._b.run_coro(coro).get("ETag"))
        self._expected_tag = md5.hex()
        return written

    def attested(self, written: Written) -> bool:
        """The completion's ETag is the one derived from the MD5s of the bodies sent."""
        tag = (written.tag or "").strip().strip('"')
        return self._expected_tag is not None and tag == self._expected_tag

    def abort(self) -> None:
        self._stop_alive()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            self._b.call(
                "aborting the upload of",
                self._parts,
                "abort_multipart_upload",
                Key=self._key,
                UploadId=upload_id,
            )


def body_md5(body: io.BytesIO) -> bytes:
    """The MD5 of ``body``'s bytes: a transfer checksum, not for security."""
    with body.getbuffer() as view:
        return hashlib.md5(view, usedforsecurity=False).digest()


def content_md5(md5: bytes) -> dict[str, str]:
    """The ``ContentMD5`` parameter for a body of MD5 ``md5`` (the server refuses a body that
    does not match)."""
    return {"ContentMD5": base64.b64encode(md5).decode("ascii")}


def _gone(err: CommitStoreError, shown: str) -> CommitStoreError:
    """NoSuchUpload during an upload is a failed commit (the upload was aborted meanwhile, by gc
    or a lifecycle rule, or the request reached the server garbled), not a missing artifact."""
    if isinstance(err, NotFoundError):
        return CommitError(f"{shown}: the multipart upload no longer exists (aborted meanwhile?)")
    return err
