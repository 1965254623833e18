"""Azure Blob strategy (``az://container/prefix``): ``commit_block_list`` is the commit.

Blocks are staged with ``stage_block`` (concurrently, at most ``max_inflight`` at a time) under
block IDs unique to this writer; staged blocks are invisible and expire after seven days if never
committed. ``commit_block_list`` publishes the blob in one step (with ``If-None-Match: *`` for
``overwrite=False`` where the endpoint honours it, probed once), then fresh blob properties must
show the expected size. adlfs commits on close regardless of ``autocommit``, so the write path
drives azure-storage-blob directly.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import io
import os
import secrets
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar
from urllib.parse import unquote, urlsplit

from commitstore.backends.base import CommitInfo, FileInfo, FileSink, take_options
from commitstore.backends.object._azureerrors import translate
from commitstore.backends.object.base import ObjectBackend
from commitstore.digest import READ_CHUNK
from commitstore.errors import AlreadyExistsError, CommitError, ConfigurationError, NotFoundError
from commitstore.layout import Parts

MiB = 1024 * 1024
MAX_BLOCKS = 50_000
T = TypeVar("T")


class AzureBackend(ObjectBackend):
    """A prefix in an Azure Blob container."""

    strategy = "azure-blocklist"
    scheme = "az"

    def __init__(
        self,
        container: Any,
        prefix: str,
        *,
        block_size: int = 8 * MiB,
        max_inflight: int = 4,
        conditional_writes: bool | None = None,
        reason: str = "az:// URL",
    ) -> None:
        super().__init__(
            container.container_name, prefix, conditional_writes=conditional_writes, reason=reason
        )
        self.container = container
        self.block_size = block_size
        self.max_inflight = max(1, max_inflight)
        self.pool = concurrent.futures.ThreadPoolExecutor(self.max_inflight)

    def call(self, what: str, parts: Parts, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as exc:
            raise translate(exc, what, self.shown(parts)) from exc

    def blob(self, parts: Parts) -> Any:
        return self.container.get_blob_client(self.key(parts))

    def _probe_conditional(self) -> bool:
        parts = (".commitstore", f"probe-{uuid.uuid4().hex}")
        client = self.blob(parts)
        self.call("probing", parts, lambda: client.upload_blob(b"1", overwrite=True))
        try:
            ids = [base64.b64encode(b"probe-00").decode()]
            client.stage_block(ids[0], b"2")
            client.commit_block_list(ids, if_none_match="*")
            return False
        except Exception as exc:
            return isinstance(translate(exc, "probing", self.shown(parts)), AlreadyExistsError)
        finally:
            with contextlib.suppress(Exception):
                client.delete_blob()

    # -- Backend API -------------------------------------------------------------------
    def file_sink(self, parts: Parts, *, overwrite: bool) -> FileSink:
        return AzureFileSink(self, parts, overwrite=overwrite)

    def open_read(self, parts: Parts) -> BinaryIO:
        client = self.blob(parts)
        props = self.call("opening", parts, client.get_blob_properties)
        raw = _RangeReader(self, parts, client, int(props.size))
        return io.BufferedReader(raw, READ_CHUNK)

    def read_small(self, parts: Parts) -> bytes:
        """One download."""
        return self.read_small_tagged(parts)[0]

    def read_small_tagged(self, parts: Parts) -> tuple[bytes, str | None]:
        """One download; the tag is the ETag of the version it returned."""
        client = self.blob(parts)

        def fetch() -> tuple[bytes, str | None]:
            stream = client.download_blob()
            data: bytes = stream.readall()
            return data, stream.properties.etag

        return self.call("reading", parts, fetch)

    def stat(self, parts: Parts) -> FileInfo | None:
        if parts:
            try:
                props = self.call("stat", parts, self.blob(parts).get_blob_properties)
            except NotFoundError:
                props = None
            if props is not None:
                ts = props.last_modified.timestamp() if props.last_modified else 0.0
                return FileInfo(int(props.size), ts if ts > 0 else None)
        if self._blobs(parts, limit=1):
            return FileInfo(0, None, is_dir=True)
        return None

    def _blobs(self, parts: Parts, limit: int | None = None) -> list[Any]:
        prefix = self.dir_prefix(parts)

        def run() -> list[Any]:
            out = []
            for item in self.container.list_blobs(name_starts_with=prefix):
                out.append(item)
                if limit and len(out) >= limit:
                    break
            return out

        return self.call("listing", parts, run)

    def walk(self, parts: Parts) -> list[tuple[Parts, FileInfo]]:
        prefix = self.dir_prefix(parts)
        out = []
        for item in self._blobs(parts):
            if item.name.endswith("/"):
                continue
            ts = item.last_modified.timestamp() if item.last_modified else 0.0
            out.append(
                (
                    tuple(item.name[len(prefix) :].split("/")),
                    FileInfo(int(item.size), ts if ts > 0 else None, tag=item.etag),
                )
            )
        return out

    def remove(self, parts: Parts) -> bool:
        info = self.stat(parts) if parts else None
        if info is not None and not info.is_dir:
            self.call("removing", parts, self.blob(parts).delete_blob)
            return True
        names = [item.name for item in self._blobs(parts)]
        for name in names:
            client = self.container.get_blob_client(name)
            self.call("removing", parts, client.delete_blob)
        return bool(names)

    def describe(self) -> dict[str, Any]:
        return {
            **self.common_description(),
            "endpoint": self.container.url.split("?")[0],
            "block_size": self.block_size,
            "max_inflight": self.max_inflight,
        }


class _RangeReader(io.RawIOBase):
    """Seekable reads by HTTP range; errors translated."""

    def __init__(self, backend: AzureBackend, parts: Parts, client: Any, size: int) -> None:
        super().__init__()
        self._b, self._parts, self._client, self._size, self._pos = backend, parts, client, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b: Any) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._b.call(
            "reading",
            self._parts,
            lambda: self._client.download_blob(offset=self._pos, length=n).readall(),
        )
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


class AzureFileSink(FileSink):
    """Blocks staged under writer-unique IDs; ``commit_block_list`` publishes the blob."""

    def __init__(self, backend: AzureBackend, parts: Parts, *, overwrite: bool) -> None:
        self._b = backend
        self._parts = parts
        self._client = backend.blob(parts)
        self._overwrite = overwrite
        self._token = secrets.token_hex(6)
        self._buf = bytearray()
        self._ids: list[str] = []
        self._inflight: deque[concurrent.futures.Future[Any]] = deque()
        self._closed = False
        self.bytes_written = 0

    def write(self, data: memoryview) -> None:
        assert not self._closed, "write after publish/abort"
        self._buf += data
        self.bytes_written += data.nbytes
        try:
            while len(self._buf) >= self._b.block_size:
                self._stage(self._b.block_size)
        except BaseException:
            self.abort()
            raise

    def _stage(self, length: int) -> None:
        if len(self._ids) >= MAX_BLOCKS:
            raise CommitError(f"{self._b.shown(self._parts)}: more than {MAX_BLOCKS} blocks")
        with memoryview(self._buf) as view:
            chunk = bytes(view[:length])
        del self._buf[:length]
        block_id = base64.b64encode(f"{self._token}-{len(self._ids):08d}".encode()).decode()
        self._ids.append(block_id)
        self._inflight.append(self._b.pool.submit(self._client.stage_block, block_id, chunk))
        while len(self._inflight) >= self._b.max_inflight:
            self._reap()

    def _reap(self) -> None:
        fut = self._inflight.popleft()
        try:
            fut.result()
        except Exception as exc:
            raise translate(exc, "staging a block of", self._b.shown(self._parts)) from exc

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert not self._closed, "publish after publish/abort"
        b = self._b
        shown = b.shown(self._parts)
        try:
            if size != self.bytes_written:
                raise CommitError(f"{shown}: {self.bytes_written} bytes written, {size} expected")
            create_only = not self._overwrite and b.conditional_writes()
            if not self._overwrite and not create_only and b.stat(self._parts) is not None:
                raise AlreadyExistsError(f"{shown} already exists")
            cond: dict[str, Any] = {"if_none_match": "*"} if create_only else {}
            if not self._ids:
                data = bytes(self._buf)
                done = b.call(
                    "uploading",
                    self._parts,
                    lambda: self._client.upload_blob(data, overwrite=True, **cond),
                )
            else:
                if self._buf:
                    self._stage(len(self._buf))
                while self._inflight:
                    self._reap()
                done = b.call(
                    "committing the block list of",
                    self._parts,
                    lambda: self._client.commit_block_list(self._ids, **cond),
                )
            self._closed = True
            props = b.call("stat", self._parts, self._client.get_blob_properties)
            if int(props.size) != size:
                if done.get("etag") and props.etag == done["etag"]:  # ours: take it back
                    with contextlib.suppress(Exception):
                        self._client.delete_blob(etag=props.etag, match_condition=_if_match())
                raise CommitError(
                    f"{shown}: post-commit size check failed: {props.size} bytes stored, "
                    f"{size} written"
                )
            return CommitInfo(size)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Staged blocks never become visible; the service drops them after seven days."""
        self._closed = True
        self._buf = bytearray()
        while self._inflight:
            with contextlib.suppress(Exception):
                self._inflight.popleft().result()


def _if_match() -> Any:
    from azure.core import MatchConditions

    return MatchConditions.IfNotModified


def factory(url: str, options: dict[str, Any]) -> ObjectBackend:
    opts = take_options(
        options,
        {
            "connection_string": None,
            "account_url": None,
            "credential": None,
            "block_size": 8 * 1024 * 1024,
            "max_inflight": 4,
            "conditional_writes": None,
            "client_options": {},
        },
    )
    client_options = dict(opts["client_options"])  # e.g. retry_total, initial_backoff
    parsed = urlsplit(url)
    if not parsed.netloc:
        raise ConfigurationError("Azure URLs look like az://container[/prefix]")
    from azure.storage.blob import BlobServiceClient

    conn = opts["connection_string"] or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if conn:
        service = BlobServiceClient.from_connection_string(conn, **client_options)
    elif opts["account_url"]:
        service = BlobServiceClient(
            opts["account_url"], credential=opts["credential"], **client_options
        )
    else:
        raise ConfigurationError(
            "az:// needs connection_string= (or AZURE_STORAGE_CONNECTION_STRING) or account_url="
        )
    return AzureBackend(
        service.get_container_client(parsed.netloc),
        unquote(parsed.path),
        block_size=int(opts["block_size"]),
        max_inflight=int(opts["max_inflight"]),
        conditional_writes=opts["conditional_writes"],
        reason="az:// URL (commit_block_list is the commit)",
    )
