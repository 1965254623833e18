"""GCS strategy (``gs://bucket/prefix``): the resumable upload's final request is the commit.

Bytes are hashed (xxh3_128) and CRC32C-summed on the way and sent as 256 KiB-aligned chunks of a
resumable upload; the request that carries the total size finalises the object, and nothing is
visible before it. Every failure path cancels the upload session. Before the record is written, the
object's size and CRC32C (as reported by the server) must match what was sent. Create-only uses
``ifGenerationMatch=0``; whether the endpoint honours it for resumable uploads is probed once per
store (fake-gcs-server does not), never assumed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable
from typing import Any, BinaryIO, cast
from urllib.parse import quote, unquote, urlsplit

from fsspec.asyn import sync

from commitstore._secrets import leaks, redact, secret_values, stand_in
from commitstore.backends.base import MAX_SMALL_BYTES, take_options, too_large
from commitstore.backends.object._transport import (
    ATTEMPTS,
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    TranslatedReader,
    check_deadlines,
)
from commitstore.backends.object.base import ObjectBackend, with_heartbeat
from commitstore.backends.object.gcs.errors import translate
from commitstore.backends.object.gcs.resume import GcsState, session_of
from commitstore.backends.object.gcs.upload import GcsUpload
from commitstore.backends.object.perprocess import PerProcess
from commitstore.backends.object.upload import ObjectStat, Upload
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    ConfigurationError,
    NotFoundError,
)
from commitstore.layout import Parts

MiB = 1024 * 1024
ALIGN = 256 * 1024


class GcsBackend(ObjectBackend):
    """A prefix in a GCS bucket (or a compatible server)."""

    strategy = "gcs-resumable"
    scheme = "gs"
    resumes_uploads = True
    """A ``put_file`` sent in chunks resumes the session an earlier attempt left
    (``gcs/upload.GcsUpload.resume``)."""

    def __init__(
        self,
        fs: Any,
        bucket: str,
        prefix: str,
        *,
        chunk_size: int = 64 * MiB,
        conditional_writes: bool | None = None,
        reason: str = "gs:// URL",
        secrets: tuple[str, ...] = (),
        make_fs: Callable[[], Any] | None = None,
    ) -> None:
        if chunk_size < ALIGN or chunk_size % ALIGN:
            raise ConfigurationError("chunk_size must be a positive multiple of 256 KiB")
        super().__init__(bucket, prefix, conditional_writes=conditional_writes, reason=reason)
        self._fs = PerProcess(fs, make_fs, f"gs://{bucket}")
        self.chunk_size = chunk_size
        self._secrets = secrets
        self.status_queries: bool | None = None
        """Whether the endpoint answers a resumable session's status query (``Content-Range:
        bytes */N``, no body) with the offset it holds, without finalising the object: probed
        once per store, the first time a resume needs it (:meth:`probe_status_queries`)."""

    @property
    def fs(self) -> Any:
        """The gcsfs file system of this process (``make_fs`` makes one in a forked child)."""
        return self._fs.get()

    def run(self, what: str, parts: Parts, coro: Any) -> Any:
        """Run a gcsfs coroutine on its loop; errors translated in one place (a credential in
        the SDK's error never reaches the message or the chain: ``_secrets``)."""
        try:
            return sync(self.fs.loop, lambda: coro)
        except Exception as exc:
            caught = exc
        err = translate(caught, what, self.shown(parts))
        if self._secrets and leaks(caught, self._secrets):
            raise _redacted(err, self._secrets) from stand_in(caught, self._secrets)
        raise err from caught

    def call(self, what: str, parts: Parts, method: str, path: str, *args: Any, **kw: Any) -> Any:
        return self.run(what, parts, self.fs._call(method, path, *args, **kw))

    def _probe_conditional(self) -> bool:
        """Does a resumable upload with ``ifGenerationMatch=0`` refuse to replace an object?

        Only a "precondition failed" answer (AlreadyExistsError) says yes; a success or any other
        refusal says no; an unreachable endpoint raises BackendUnavailableError (probed again
        next time)."""
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
        except AlreadyExistsError:  # 412 Precondition Failed: the one answer that means honoured
            return True
        except CommitError:  # refused for another reason: nothing shows the condition is honoured
            return False
        finally:
            with contextlib.suppress(Exception):
                self.delete_key(parts, key)
        return False

    def probe_status_queries(self) -> bool:
        """Does a status query of a resumable session answer 308 with the offset it holds?

        GCS does; fake-gcs-server finalises the object with what it holds instead (so a query
        there would publish a truncated object). Probed on a probe key of our own: one 256 KiB
        chunk, then the query; only a 308 answer says yes. Cached once known."""
        if self.status_queries is not None:
            return self.status_queries
        parts = (".commitstore", f"probe-{uuid.uuid4().hex}")
        key = self.key(parts)
        loc = self.initiate(parts, key, create_only=False)
        try:
            self.call(
                "probing",
                parts,
                "PUT",
                loc,
                headers={"Content-Range": f"bytes 0-{ALIGN - 1}/*", "Content-Length": str(ALIGN)},
                data=bytes(ALIGN),
            )
            status, headers = self.query(parts, loc, 2 * ALIGN)
            self.status_queries = status == 308 and headers.get("Range") == f"bytes=0-{ALIGN - 1}"
        finally:
            with contextlib.suppress(Exception):
                self.call("probing", parts, "DELETE", loc)
            with contextlib.suppress(Exception):
                self.delete_key(parts, key)
        return self.status_queries

    def query(self, parts: Parts, location: str, total: int) -> tuple[int, Any]:
        """The status query of resumable session ``location`` (``total``: the object's size):
        the answer's status and headers (308 and ``Range``: the bytes the session holds)."""
        status, headers, _info, _data = self.run(
            "querying the upload of",
            parts,
            self.fs._request(
                "PUT",
                location,
                headers={"Content-Range": f"bytes */{total}", "Content-Length": "0"},
                data=b"",
            ),
        )
        return int(status), headers

    def abandon_upload_of(self, state: bytes) -> None:
        """Cancel the resumable session a stale state names (gc), when it is a session of the
        key the state names on this endpoint and bucket (never a URL of another); errors are
        ignored (GCS expires an abandoned session after a week)."""
        found = GcsState.parse(state)
        if found is None:
            return
        if not session_of(self.fs._location, self.bucket, found.key, found.session):
            return
        with contextlib.suppress(Exception):
            self.call("cancelling the upload of", (found.key,), "DELETE", found.session)

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

    def delete_key(self, parts: Parts, key: str) -> None:
        self.call("removing", parts, "DELETE", "b/{}/o/{}", self.bucket, key)

    # -- primitives ------------------------------------------------------------------------
    @property
    def whole_max(self) -> int:
        return self.chunk_size

    def new_upload(self, parts: Parts, *, create_only: bool) -> Upload:
        return GcsUpload(self, parts, create_only=create_only)

    def head(self, parts: Parts) -> ObjectStat | None:
        """The object's metadata, fresh from the server (no listing cache); None if absent."""
        try:
            doc = self.call(
                "stat", parts, "GET", "b/{}/o/{}", self.bucket, self.key(parts), json_out=True
            )
        except NotFoundError:
            return None
        return _stat(doc)

    def list_objects(self, parts: Parts, *, limit: int | None = None) -> list[ObjectStat]:
        items: list[ObjectStat] = []
        kw: dict[str, Any] = {"prefix": self.dir_prefix(parts)}
        if limit:
            kw["maxResults"] = limit
        while True:
            page = self.call("listing", parts, "GET", "b/{}/o", self.bucket, json_out=True, **kw)
            items += [_stat(item) for item in page.get("items", [])]
            kw["pageToken"] = page.get("nextPageToken")
            if not kw["pageToken"] or limit:
                return items

    def delete_version(self, parts: Parts, tag: str) -> None:
        self.call(
            "removing",
            parts,
            "DELETE",
            "b/{}/o/{}",
            self.bucket,
            self.key(parts),
            ifGenerationMatch=tag,
        )

    copy_max = 5 * 1024**4  # a rewrite may take several calls; each is followed to the end

    def server_copy(self, src: ObjectStat, parts: Parts) -> ObjectStat:
        """The rewrite API, conditioned on the source's generation (``ifSourceGenerationMatch``)
        and followed until done; the copy's CRC32C must be the source's (``same_content``)."""
        kw: dict[str, Any] = {"ifSourceGenerationMatch": src.tag} if src.tag else {}
        path = "b/{}/o/{}/rewriteTo/b/{}/o/{}"
        while True:
            doc = self.call(
                "copying to",
                parts,
                "POST",
                path,
                self.bucket,
                src.key,
                self.bucket,
                self.key(parts),
                json_out=True,
                **kw,
            )
            if doc.get("done", True):
                break
            kw["rewriteToken"] = doc["rewriteToken"]
        return _stat(doc["resource"])

    # -- Backend API -------------------------------------------------------------------------
    def open_read(self, parts: Parts) -> BinaryIO:
        path = f"{self.bucket}/{self.key(parts)}"
        self.fs.invalidate_cache(path)
        try:
            f = self.fs.open(path, "rb", block_size=8 * MiB)
        except Exception as exc:
            raise translate(exc, "opening", self.shown(parts)) from exc
        shown = self.shown(parts)
        return cast(BinaryIO, TranslatedReader(f, lambda exc: translate(exc, "reading", shown)))

    def read_small_tagged(self, parts: Parts) -> tuple[bytes, str | None]:
        """One media GET of the first ``MAX_SMALL_BYTES + 1`` bytes at most (a range): a larger
        object raises RecordFormatError, and no more of it than that is downloaded. The tag is
        the generation that GET returned."""
        headers, data = self.run("reading", parts, self._get_small(self.key(parts)))
        if len(data) > MAX_SMALL_BYTES:
            raise too_large(self.shown(parts))
        tag = headers.get("x-goog-generation") if headers is not None else None
        return bytes(data), tag

    async def _get_small(self, key: str) -> tuple[Any, bytes]:
        """The ranged media GET of :meth:`read_small_tagged`; an empty object, which a range
        cannot start in (416), is read again without one."""
        get = functools.partial(self.fs._call, "GET", "b/{}/o/{}", self.bucket, key, alt="media")
        try:
            got: tuple[Any, bytes] = await get(headers={"Range": f"bytes=0-{MAX_SMALL_BYTES}"})
        except Exception as exc:  # gcsfs's HttpError (gcsfs is imported only with a gs:// URL)
            if getattr(exc, "code", None) != 416:
                raise
            got = await get()
        return got

    def describe_store(self) -> dict[str, Any]:
        return {
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


def _stat(doc: dict[str, Any]) -> ObjectStat:
    generation = doc.get("generation")
    return ObjectStat(
        doc["name"],
        int(doc["size"]),
        _ts(doc.get("updated")),
        None if generation is None else str(generation),
        doc.get("crc32c"),
    )


def _redacted(err: CommitStoreError, secrets: tuple[str, ...]) -> CommitStoreError:
    """``err`` with its message redacted (the translated errors that quote the SDK's text)."""
    text = redact(str(err), secrets)
    if text == str(err) or isinstance(err, (NotFoundError, AlreadyExistsError)):
        return err  # these never quote the SDK's text
    return type(err)(text)


def _credential_error(exc: Exception, secrets: tuple[str, ...]) -> CommitStoreError:
    """The typed error for a ``token=`` that gcsfs/google-auth could not use (secrets masked)."""
    what = f"{type(exc).__name__}: {redact(str(exc).splitlines()[0] if str(exc) else '', secrets)}"
    if isinstance(exc, (OSError, TimeoutError)):  # requests' errors are OSErrors: unreachable
        return BackendUnavailableError(
            f"the GCS credentials given as token= could not be checked ({what[:300]})"
        )
    return ConfigurationError(f"token= is not a usable GCS credential ({what[:300]})")


def factory(url: str, options: dict[str, Any]) -> ObjectBackend:
    opts = take_options(
        options,
        {
            "endpoint_url": None,
            "token": None,
            "project": None,
            "chunk_size": 64 * 1024 * 1024,
            "conditional_writes": None,
            "heartbeat": ObjectBackend.heartbeat,
            "connect_timeout": CONNECT_TIMEOUT,
            "read_timeout": READ_TIMEOUT,
            "retries": ATTEMPTS,
        },
        kinds={"conditional_writes": (bool, None), "endpoint_url": (str, None)},
    )
    connect, read, attempts = check_deadlines(
        opts["connect_timeout"], opts["read_timeout"], opts["retries"]
    )
    parsed = urlsplit(url)
    if not parsed.netloc:
        raise ConfigurationError("GCS URLs look like gs://bucket[/prefix]")
    # gcsfs otherwise probes every bucket over gRPC/TLS first (hangs against plain-HTTP servers)
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    from commitstore.backends.object.gcs.client import TimedGCSFileSystem, client_timeout

    endpoint = opts["endpoint_url"] or os.environ.get("STORAGE_EMULATOR_HOST")
    kw: dict[str, Any] = {
        "skip_instance_cache": True,
        "requests_timeout": client_timeout(connect, read),
    }
    if endpoint:
        kw["endpoint_url"] = endpoint
    if opts["token"] is not None:
        kw["token"] = opts["token"]
    if opts["project"] is not None:
        kw["project"] = opts["project"]
    secrets = secret_values(opts["token"])

    def make_fs() -> Any:
        made = TimedGCSFileSystem(**kw)
        made.attempts = attempts
        return made

    failure: Exception | None = None
    try:
        fs = make_fs()
    except Exception as exc:  # google-auth checks a token here (and quotes it when that fails)
        failure = exc
    if failure is not None:  # raised outside the handler: the original is not even __context__
        raise _credential_error(failure, secrets) from stand_in(failure, secrets)
    backend = GcsBackend(
        fs,
        parsed.netloc,
        unquote(parsed.path),
        chunk_size=int(opts["chunk_size"]),
        conditional_writes=opts["conditional_writes"],
        reason="gs:// URL (the resumable upload's final request is the commit)",
        secrets=secrets,
        make_fs=make_fs,
    )
    return with_heartbeat(backend, opts["heartbeat"])
