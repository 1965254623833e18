"""Azure Blob strategy (``az://container/prefix``): ``commit_block_list`` is the commit.

Blocks are staged with ``stage_block`` (concurrently, at most ``max_inflight`` at a time), each
with its ``Content-MD5``, under block IDs made of its part number and MD5 (``upload.py``); staged
blocks are invisible and expire after seven days if never committed. ``commit_block_list``
publishes the blob in one step (with ``If-None-Match: *`` for ``overwrite=False`` where the
endpoint honours it, probed once), then fresh blob properties must show the expected size. A
``put_file`` sends its blocks from the file, and one killed mid-upload resumes from the blocks the
server holds (``resume.py``). adlfs commits on close regardless of ``autocommit``, so the write
path drives azure-storage-blob directly.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import io
import os
import time
import uuid
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar
from urllib.parse import unquote, urlsplit

from commitstore.backends.base import MAX_SMALL_BYTES, take_options, too_large
from commitstore.backends.object._transport import (
    ATTEMPTS,
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    check_deadlines,
)
from commitstore.backends.object.azure.errors import translate
from commitstore.backends.object.azure.upload import AzureUpload
from commitstore.backends.object.base import ObjectBackend, with_heartbeat
from commitstore.backends.object.upload import ObjectStat, Upload
from commitstore.digest import READ_CHUNK
from commitstore.errors import (
    AlreadyExistsError,
    CommitError,
    ConfigurationError,
    IntegrityError,
    NotFoundError,
)
from commitstore.layout import Parts

MiB = 1024 * 1024
SINGLE_PUT_MAX = 64 * MiB
"""azure-storage-blob's default ``max_single_put_size``: the largest blob it sends in one Put
Blob (a client option may lower it)."""
T = TypeVar("T")
COPY_WAIT = 600.0
"""Seconds a Copy Blob inside the account may stay pending before the copy counts as failed."""


class AzureBackend(ObjectBackend):
    """A prefix in an Azure Blob container."""

    strategy = "azure-blocklist"
    mtime_resolution = 1.0  # Last-Modified: an HTTP date, whole seconds
    scheme = "az"
    md5_bodies = True
    """Every block and every Put Blob carries the Content-MD5 of its body (the server checks it)."""
    reread_bodies = True
    """So a copy from a local file sends its bodies from the file (and may resume)."""

    def __init__(
        self,
        container: Any,
        prefix: str,
        *,
        block_size: int = 8 * MiB,
        max_inflight: int = 4,
        conditional_writes: bool | None = None,
        reason: str = "az:// URL",
        single_put_max: int = SINGLE_PUT_MAX,
    ) -> None:
        super().__init__(
            container.container_name, prefix, conditional_writes=conditional_writes, reason=reason
        )
        self.container = container
        self.block_size = block_size
        self.single_put_max = single_put_max
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

    # -- primitives --------------------------------------------------------------------
    @property
    def whole_max(self) -> int:
        """A full block is staged; and never more than the SDK sends in one Put Blob (beyond
        it the SDK would split the body into blocks of its own, each refused for the whole
        body's Content-MD5)."""
        return max(0, min(self.block_size, self.single_put_max) - 1)

    def sink_memory(self, size: int, *, source_rereads: bool) -> int:
        """Sent in blocks from a local source file, nothing is held; sent whole, the SDK reads
        the body into memory first (at most :attr:`whole_max`)."""
        if source_rereads and size > self.whole_max:
            return 0
        return min(size, self.whole_max)

    def resume_upload_of(self, state: bytes) -> tuple[str, str] | None:
        """None: an Azure upload's state names no upload to abort (its uncommitted blocks are
        invisible and expire on the server after seven days), so gc ages the state alone."""
        del state
        return None

    def new_upload(self, parts: Parts, *, create_only: bool) -> Upload:
        return AzureUpload(self, parts, create_only=create_only)

    def head(self, parts: Parts) -> ObjectStat | None:
        try:
            props = self.call("stat", parts, self.blob(parts).get_blob_properties)
        except NotFoundError:
            return None
        return ObjectStat(self.key(parts), int(props.size), _ts(props), props.etag)

    def list_objects(self, parts: Parts, *, limit: int | None = None) -> list[ObjectStat]:
        prefix = self.dir_prefix(parts)

        def run() -> list[ObjectStat]:
            out = []
            for item in self.container.list_blobs(name_starts_with=prefix):
                out.append(ObjectStat(item.name, int(item.size), _ts(item), item.etag))
                if limit and len(out) >= limit:
                    break
            return out

        return self.call("listing", parts, run)

    def delete_key(self, parts: Parts, key: str) -> None:
        self.call("removing", parts, self.container.get_blob_client(key).delete_blob)

    def delete_version(self, parts: Parts, tag: str) -> None:
        from azure.core import MatchConditions

        client = self.blob(parts)
        self.call(
            "removing",
            parts,
            lambda: client.delete_blob(etag=tag, match_condition=MatchConditions.IfNotModified),
        )

    copy_max = 4 * 1024**4

    def server_copy(self, src: ObjectStat, parts: Parts) -> ObjectStat:
        """Copy Blob inside the account, conditioned on the source's ETag, waited for until the
        service reports it finished; anything but ``success`` is a CommitError."""
        from azure.core import MatchConditions

        source = self.container.get_blob_client(src.key)
        client = self.blob(parts)

        def run() -> Any:
            client.start_copy_from_url(
                source.url,
                source_etag=src.tag,
                source_match_condition=MatchConditions.IfNotModified,
            )
            deadline = time.monotonic() + COPY_WAIT
            while True:
                props = client.get_blob_properties()
                if props.copy.status != "pending" or time.monotonic() > deadline:
                    return props
                time.sleep(0.05)

        props = self.call("copying to", parts, run)
        if props.copy.status != "success":
            raise CommitError(f"{self.shown(parts)}: copy {props.copy.status}")
        return ObjectStat(self.key(parts), int(props.size), _ts(props), props.etag)

    # -- Backend API -------------------------------------------------------------------
    def open_read(self, parts: Parts) -> BinaryIO:
        """Seekable reads by range, every range pinned to the ETag of the version opened
        (``If-Match``): a blob replaced while it is read raises IntegrityError, never hands out
        bytes of two versions (nor, after a verified open, of an unverified one)."""
        client = self.blob(parts)
        props = self.call("opening", parts, client.get_blob_properties)
        raw = _RangeReader(self, parts, client, int(props.size), props.etag)
        return io.BufferedReader(raw, READ_CHUNK)

    def read_small_tagged(self, parts: Parts) -> tuple[bytes, str | None]:
        """One download of the first ``MAX_SMALL_BYTES + 1`` bytes at most (a range): a larger
        blob raises RecordFormatError, and no more of it than that is downloaded. The tag is the
        ETag of the version it returned."""
        client = self.blob(parts)

        def fetch() -> tuple[bytes, str | None]:
            try:
                stream = client.download_blob(offset=0, length=MAX_SMALL_BYTES + 1)
            except Exception as exc:  # the SDK's HttpResponseError (imported with an az:// URL)
                if getattr(exc, "status_code", None) != 416:
                    raise
                stream = client.download_blob()  # empty: no range can start in it
            data: bytes = stream.readall()
            return data, stream.properties.etag

        data, tag = self.call("reading", parts, fetch)
        if len(data) > MAX_SMALL_BYTES:
            raise too_large(self.shown(parts))
        return data, tag

    def describe_store(self) -> dict[str, Any]:
        return {
            "endpoint": self.container.url.split("?")[0],
            "block_size": self.block_size,
            "max_inflight": self.max_inflight,
        }


class _RangeReader(io.RawIOBase):
    """Seekable reads by HTTP range of one version (``etag``); errors translated."""

    def __init__(
        self, backend: AzureBackend, parts: Parts, client: Any, size: int, etag: str
    ) -> None:
        super().__init__()
        self._b, self._parts, self._client, self._size, self._pos = backend, parts, client, size, 0
        self._etag = etag

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
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError

        def fetch() -> bytes:
            try:
                stream = self._client.download_blob(
                    offset=self._pos,
                    length=n,
                    etag=self._etag,
                    match_condition=MatchConditions.IfNotModified,
                )
                return bytes(stream.readall())
            except ResourceModifiedError as exc:
                shown = self._b.shown(self._parts)
                raise IntegrityError(
                    f"{shown} was replaced while it was read (ETag {self._etag} is gone); "
                    "no byte of the other version was handed out",
                    name="/".join(self._parts),
                    status="hash_mismatch",
                ) from exc

        data = self._b.call("reading", self._parts, fetch)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _ts(item: Any) -> float | None:
    ts = item.last_modified.timestamp() if item.last_modified else 0.0
    return ts if ts > 0 else None


SDK_DEADLINES = {
    "connect_timeout": "connection_timeout",
    "read_timeout": "read_timeout",
    "retries": "retry_total",
}
"""Each deadline option and the ``BlobServiceClient`` keyword it sets (``retries`` attempts in
all are ``retries - 1`` retries of the SDK's retry policy)."""


def sdk_deadlines(options: dict[str, Any], client_options: dict[str, Any]) -> dict[str, Any]:
    """The SDK keywords that bound every request: ``connection_timeout``, ``read_timeout`` and
    ``retry_total`` from the store's ``connect_timeout``, ``read_timeout`` and ``retries``
    (checked: :func:`check_deadlines`). A keyword also in ``client_options`` is the caller's
    (it wins over the default), unless the store's option was given too: then which one is
    meant is unclear, a ConfigurationError."""
    for ours, theirs in SDK_DEADLINES.items():
        if theirs in client_options and ours in options:
            raise ConfigurationError(
                f"{ours}= and client_options[{theirs!r}] both set the same deadline; give one"
            )
    connect, read, attempts = check_deadlines(
        options.get("connect_timeout", CONNECT_TIMEOUT),
        options.get("read_timeout", READ_TIMEOUT),
        options.get("retries", ATTEMPTS),
    )
    kw = {"connection_timeout": connect, "read_timeout": read, "retry_total": attempts - 1}
    return {**kw, **client_options}


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
            "heartbeat": ObjectBackend.heartbeat,
            "connect_timeout": CONNECT_TIMEOUT,
            "read_timeout": READ_TIMEOUT,
            "retries": ATTEMPTS,
        },
        kinds={"conditional_writes": (bool, None)},
    )
    # e.g. initial_backoff; deadlines from the store's own options unless given here
    client_options = sdk_deadlines(options, dict(opts["client_options"]))
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
    backend = AzureBackend(
        service.get_container_client(parsed.netloc),
        unquote(parsed.path),
        block_size=int(opts["block_size"]),
        max_inflight=int(opts["max_inflight"]),
        conditional_writes=opts["conditional_writes"],
        reason="az:// URL (commit_block_list is the commit)",
        single_put_max=int(client_options.get("max_single_put_size", SINGLE_PUT_MAX)),
    )
    return with_heartbeat(backend, opts["heartbeat"])
