"""GCS strategy (``gs://bucket/prefix``): the resumable upload's final request is the commit.

Bytes are hashed (xxh3_128) and CRC32C-summed on the way and sent as 256 KiB-aligned chunks of a
resumable upload; the request that carries the total size finalises the object, and nothing is
visible before it. Every failure path cancels the upload session. Before the record is written, the
object's size and CRC32C (as reported by the server) must match what was sent. Create-only uses
``ifGenerationMatch=0``; whether the endpoint honours it for resumable uploads is probed once per
store (fake-gcs-server does not), never assumed.
"""

from __future__ import annotations

import base64
import contextlib
import os
import uuid
from typing import Any, BinaryIO
from urllib.parse import quote, unquote, urlsplit

import google_crc32c
from fsspec.asyn import sync

from commitstore.backends.base import CommitInfo, FileInfo, FileSink, take_options
from commitstore.backends.object._gcserrors import ViewReader, translate
from commitstore.backends.object.base import ObjectBackend
from commitstore.errors import AlreadyExistsError, CommitError, ConfigurationError, NotFoundError
from commitstore.layout import Parts

MiB = 1024 * 1024
CRC_PIECE = 1024 * 1024
"""CRC32C is fed in pieces of this size, each a small copy of the part of the chunk it covers."""
ALIGN = 256 * 1024


def crc32c_b64(value: int) -> str:
    """GCS's encoding of a CRC32C: base64 of the 4 big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


class GcsBackend(ObjectBackend):
    """A prefix in a GCS bucket (or a compatible server)."""

    strategy = "gcs-resumable"
    scheme = "gs"

    def __init__(
        self,
        fs: Any,
        bucket: str,
        prefix: str,
        *,
        chunk_size: int = 64 * MiB,
        conditional_writes: bool | None = None,
        reason: str = "gs:// URL",
    ) -> None:
        if chunk_size < ALIGN or chunk_size % ALIGN:
            raise ConfigurationError("chunk_size must be a positive multiple of 256 KiB")
        super().__init__(bucket, prefix, conditional_writes=conditional_writes, reason=reason)
        self.fs = fs
        self.chunk_size = chunk_size

    def run(self, what: str, parts: Parts, coro: Any) -> Any:
        """Run a gcsfs coroutine on its loop; errors translated in one place."""
        try:
            return sync(self.fs.loop, lambda: coro)
        except Exception as exc:
            raise translate(exc, what, self.shown(parts)) from exc

    def call(self, what: str, parts: Parts, method: str, path: str, *args: Any, **kw: Any) -> Any:
        return self.run(what, parts, self.fs._call(method, path, *args, **kw))

    def _probe_conditional(self) -> bool:
        """Does a resumable upload with ``ifGenerationMatch=0`` refuse to replace an object?"""
        parts = (".commitstore", f"probe-{uuid.uuid4().hex}")
        key = self.key(parts)
        self.upload_small(parts, key, b"1", create_only=False)
        try:
            loc = self.initiate(parts, key, create_only=True)
            self.call(
                "probing",
                parts,
                "POST",
                loc,
                headers={"Content-Range": "bytes 0-0/1", "Content-Length": "1"},
                data=b"2",
            )
        except (AlreadyExistsError, CommitError):
            return True
        finally:
            with contextlib.suppress(Exception):
                self.delete_key(parts, key)
        return False

    # -- protocol pieces -------------------------------------------------------------------
    def initiate(self, parts: Parts, key: str, *, create_only: bool) -> str:
        kw = {"ifGenerationMatch": "0"} if create_only else {}
        headers, _ = self.call(
            "starting the upload of",
            parts,
            "POST",
            f"{self.fs._location}/upload/storage/v1/b/{quote(self.bucket)}/o",
            uploadType="resumable",
            name=key,
            json={"name": key},
            headers={"X-Upload-Content-Type": "application/octet-stream"},
            **kw,
        )
        loc = headers["Location"]
        return str(loc[0] if isinstance(loc, list) else loc)

    def upload_small(
        self, parts: Parts, key: str, data: bytes, *, create_only: bool
    ) -> dict[str, Any]:
        from gcsfs.core import simple_upload

        coro = simple_upload(
            self.fs, self.bucket, key, data, mode="create" if create_only else "overwrite"
        )
        result: dict[str, Any] = self.run("uploading", parts, coro)
        return result

    def metadata(self, parts: Parts) -> dict[str, Any] | None:
        """The object's metadata, fresh from the server (no listing cache); None if absent."""
        try:
            doc: dict[str, Any] = self.call(
                "stat", parts, "GET", "b/{}/o/{}", self.bucket, self.key(parts), json_out=True
            )
        except NotFoundError:
            return None
        return doc

    def delete_key(self, parts: Parts, key: str) -> None:
        self.call("removing", parts, "DELETE", "b/{}/o/{}", self.bucket, key)

    # -- Backend API -------------------------------------------------------------------------
    def file_sink(self, parts: Parts, *, overwrite: bool) -> FileSink:
        return GcsFileSink(self, parts, overwrite=overwrite)

    def open_read(self, parts: Parts) -> BinaryIO:
        path = f"{self.bucket}/{self.key(parts)}"
        self.fs.invalidate_cache(path)
        try:
            f: BinaryIO = self.fs.open(path, "rb", block_size=8 * MiB)
        except Exception as exc:
            raise translate(exc, "opening", self.shown(parts)) from exc
        return f

    def read_small(self, parts: Parts) -> bytes:
        """One media GET."""
        return self.read_small_tagged(parts)[0]

    def read_small_tagged(self, parts: Parts) -> tuple[bytes, str | None]:
        """One media GET; the tag is the generation that GET returned."""
        headers, data = self.call(
            "reading", parts, "GET", "b/{}/o/{}", self.bucket, self.key(parts), alt="media"
        )
        tag = headers.get("x-goog-generation") if headers is not None else None
        return bytes(data), tag

    def stat(self, parts: Parts) -> FileInfo | None:
        meta = self.metadata(parts) if parts else None
        if meta is not None:
            return FileInfo(int(meta["size"]), _ts(meta.get("updated")))
        if self._list(parts, max_results=1):
            return FileInfo(0, None, is_dir=True)
        return None

    def _list(self, parts: Parts, *, max_results: int | None = None) -> list[dict[str, Any]]:
        prefix = self.dir_prefix(parts)
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"prefix": prefix}
            if token:
                kw["pageToken"] = token
            if max_results:
                kw["maxResults"] = max_results
            page = self.call("listing", parts, "GET", "b/{}/o", self.bucket, json_out=True, **kw)
            items.extend(page.get("items", []))
            token = page.get("nextPageToken")
            if not token or max_results:
                return items

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        prefix = self.dir_prefix(parts)
        out = []
        for item in self._list(parts):
            name = item["name"]
            if name.endswith("/"):
                continue
            out.append(
                (
                    tuple(name[len(prefix) :].split("/")),
                    FileInfo(
                        int(item["size"]), _ts(item.get("updated")), tag=item.get("generation")
                    ),
                )
            )
        return out

    def remove(self, parts: Parts) -> bool:
        if parts and self.metadata(parts) is not None:
            self.delete_key(parts, self.key(parts))
            return True
        items = self._list(parts)
        for item in items:
            self.delete_key(parts, item["name"])
        return bool(items)

    def describe(self) -> dict[str, Any]:
        return {
            **self.common_description(),
            "endpoint": self.fs._location,
            "chunk_size": self.chunk_size,
        }


def _ts(value: Any) -> float | None:
    if not value:
        return None
    from datetime import datetime

    try:
        ts = datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return ts if ts > 0 else None


class GcsFileSink(FileSink):
    """One object via a resumable upload; the final (total-size) request publishes it."""

    def __init__(self, backend: GcsBackend, parts: Parts, *, overwrite: bool) -> None:
        self._b = backend
        self._parts = parts
        self._key = backend.key(parts)
        self._overwrite = overwrite
        self._buf = bytearray()
        self._crc = google_crc32c.Checksum()  # type: ignore[no-untyped-call]
        self._location: str | None = None
        self._offset = 0
        self._closed = False
        self.bytes_written = 0

    def _create_only(self) -> bool:
        return not self._overwrite and self._b.conditional_writes()

    def write(self, data: memoryview) -> None:
        assert not self._closed, "write after publish/abort"
        self._buf += data
        self.bytes_written += data.nbytes
        try:
            while len(self._buf) >= self._b.chunk_size + 1:  # keep >= 1 byte for the final request
                self._send(self._b.chunk_size, final=False)
        except BaseException:
            self.abort()
            raise

    def _send(self, length: int, *, final: bool) -> Any:
        b = self._b
        if self._location is None:
            self._location = b.initiate(self._parts, self._key, create_only=self._create_only())
        end = self._offset + length - 1
        total = str(self._offset + length) if final else "*"
        rng = f"bytes {self._offset}-{end}/{total}" if length else f"bytes */{total}"
        # The chunk is sent straight from the buffer, piece by piece (no copy of the chunk): the
        # view is released before the buffer is trimmed.
        with memoryview(self._buf) as view, view[:length] as chunk:
            for i in range(0, length, CRC_PIECE):  # google-crc32c wants read-only bytes
                self._crc.update(bytes(chunk[i : i + CRC_PIECE]))  # type: ignore[no-untyped-call]
            _headers, txt = b.call(
                "uploading",
                self._parts,
                "POST",
                self._location,
                headers={"Content-Range": rng, "Content-Length": str(length)},
                data=ViewReader(chunk) if length else None,
            )
        del self._buf[:length]
        self._offset += length
        return txt

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert not self._closed, "publish after publish/abort"
        b = self._b
        shown = b.shown(self._parts)
        try:
            if size != self.bytes_written:
                raise CommitError(f"{shown}: {self.bytes_written} bytes written, {size} expected")
            create_only = self._create_only()
            if not self._overwrite and not create_only and b.metadata(self._parts) is not None:
                raise AlreadyExistsError(f"{shown} already exists")
            if self._location is None:
                self._crc.update(bytes(self._buf))  # type: ignore[no-untyped-call]
                meta = b.upload_small(
                    self._parts, self._key, bytes(self._buf), create_only=not self._overwrite
                )
            else:
                import json

                txt = self._send(len(self._buf), final=True)
                meta = json.loads(txt) if txt else {}
                self._location = None  # finalised: nothing left to cancel
            self._closed = True
            fresh = b.metadata(self._parts) or {}
            expected_crc = crc32c_b64(int.from_bytes(self._crc.digest(), "big"))  # type: ignore[no-untyped-call]
            found_size = int(fresh.get("size", -1))
            found_crc = fresh.get("crc32c") or meta.get("crc32c")
            if found_size != size or (found_crc is not None and found_crc != expected_crc):
                ours = meta.get("generation")
                if ours is not None and str(fresh.get("generation")) == str(ours):
                    # Our own object is wrong: take it back (only that generation, never another
                    # writer's).
                    with contextlib.suppress(Exception):
                        b.call(
                            "removing",
                            self._parts,
                            "DELETE",
                            "b/{}/o/{}",
                            b.bucket,
                            self._key,
                            ifGenerationMatch=str(ours),
                        )
                raise CommitError(
                    f"{shown}: post-upload check failed: {found_size} bytes / crc32c {found_crc} "
                    f"stored, {size} bytes / crc32c {expected_crc} sent"
                )
            return CommitInfo(size)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        self._closed = True
        self._buf = bytearray()
        if self._location is not None:
            location, self._location = self._location, None
            # An unreachable endpoint leaves the session; GCS expires it after a week.
            with contextlib.suppress(Exception):
                self._b.call("cancelling the upload of", self._parts, "DELETE", location)


def factory(url: str, options: dict[str, Any]) -> ObjectBackend:
    opts = take_options(
        options,
        {
            "endpoint_url": None,
            "token": None,
            "project": None,
            "chunk_size": 64 * 1024 * 1024,
            "conditional_writes": None,
        },
    )
    parsed = urlsplit(url)
    if not parsed.netloc:
        raise ConfigurationError("GCS URLs look like gs://bucket[/prefix]")
    # gcsfs otherwise probes every bucket over gRPC/TLS first (hangs against plain-HTTP servers)
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs

    endpoint = opts["endpoint_url"] or os.environ.get("STORAGE_EMULATOR_HOST")
    kw: dict[str, Any] = {"skip_instance_cache": True}
    if endpoint:
        kw["endpoint_url"] = endpoint
    if opts["token"] is not None:
        kw["token"] = opts["token"]
    if opts["project"] is not None:
        kw["project"] = opts["project"]
    fs = gcsfs.GCSFileSystem(**kw)
    return GcsBackend(
        fs,
        parsed.netloc,
        unquote(parsed.path),
        chunk_size=int(opts["chunk_size"]),
        conditional_writes=opts["conditional_writes"],
        reason="gs:// URL (the resumable upload's final request is the commit)",
    )
