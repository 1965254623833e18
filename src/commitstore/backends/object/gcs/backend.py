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
import concurrent.futures
import contextlib
import functools
import io
import json
import logging
import os
import re
import uuid
from typing import Any, BinaryIO, cast
from urllib.parse import quote, unquote, urlsplit

import google_crc32c
from fsspec.asyn import sync

from commitstore._recordrules import RecordFormatError
from commitstore._secrets import leaks, redact, secret_values, stand_in
from commitstore.backends.base import MAX_SMALL_BYTES, Rereadable, take_options, too_large
from commitstore.backends.object._transport import (
    ATTEMPTS,
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    TranslatedReader,
    check_deadlines,
)
from commitstore.backends.object.base import ObjectBackend, with_heartbeat
from commitstore.backends.object.bodies import ViewReader
from commitstore.backends.object.gcs.errors import translate
from commitstore.backends.object.gcs.resume import GcsState, parse_gcs, session_of
from commitstore.backends.object.upload import ObjectStat, Upload, Written, done
from commitstore.errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    CommitError,
    CommitStoreError,
    ConfigurationError,
    NotFoundError,
)
from commitstore.layout import Parts, resume_parts

MiB = 1024 * 1024
CRC_PIECE = 1024 * 1024
"""CRC32C is fed in pieces of this size, each a small copy of the part of the chunk it covers."""
ALIGN = 256 * 1024

log = logging.getLogger("commitstore")


def crc32c_b64(value: int) -> str:
    """GCS's encoding of a CRC32C: base64 of the 4 big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


class GcsBackend(ObjectBackend):
    """A prefix in a GCS bucket (or a compatible server)."""

    strategy = "gcs-resumable"
    scheme = "gs"
    resumes_uploads = True
    """A ``put_file`` sent in chunks resumes the session an earlier attempt left
    (:meth:`GcsUpload.resume`)."""

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
    ) -> None:
        if chunk_size < ALIGN or chunk_size % ALIGN:
            raise ConfigurationError("chunk_size must be a positive multiple of 256 KiB")
        super().__init__(bucket, prefix, conditional_writes=conditional_writes, reason=reason)
        self.fs = fs
        self.chunk_size = chunk_size
        self._secrets = secrets
        self.status_queries: bool | None = None
        """Whether the endpoint answers a resumable session's status query (``Content-Range:
        bytes */N``, no body) with the offset it holds, without finalising the object: probed
        once per store, the first time a resume needs it (:meth:`probe_status_queries`)."""

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
        found = parse_gcs(state)
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


class GcsUpload(Upload):
    """A resumable upload: 256 KiB-aligned chunks, one at a time and in order, CRC32C-summed on
    the way; the final one (never empty: the sink keeps a byte for it) carries the total size and
    the CRC32C of every byte written (``x-goog-hash``: GCS documents that it refuses an upload
    whose bytes do not match a checksum supplied with it) and is the commit. Create-only is
    ``ifGenerationMatch=0`` on the session.

    Offered a local source (:meth:`resume`), the session keeps its state on the target (the
    session URI, each chunk's CRC32C: ``gcs/resume.py``), rewritten just before each chunk is
    sent, so a later attempt from the same unchanged source sends only what the server lacks."""

    max_inflight = 1

    def __init__(self, backend: GcsBackend, parts: Parts, *, create_only: bool) -> None:
        self._b, self._parts, self._key = backend, parts, backend.key(parts)
        self._create_only = create_only
        self.part_size = backend.chunk_size
        self._crc = google_crc32c.Checksum()  # type: ignore[no-untyped-call]
        self._location: str | None = None
        self._offset = 0
        self._state: GcsState | None = None  # resumable: the state kept on the target
        self._held = 0  # resumed: the bytes the session holds (chunks not sent again)
        self.reused_bytes = 0

    def send_part(
        self, number: int, body: io.BytesIO, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        b = self._b
        # CRC32C is fed in small copies, as google-crc32c wants read-only bytes; the chunk's
        # own CRC32C too, when the state keeps it.
        own = google_crc32c.Checksum()  # type: ignore[no-untyped-call]
        with body.getbuffer() as view, view[:length] as chunk:
            for i in range(0, length, CRC_PIECE):
                piece = bytes(chunk[i : i + CRC_PIECE])
                self._crc.update(piece)  # type: ignore[no-untyped-call]
                if self._state is not None:
                    own.update(piece)  # type: ignore[no-untyped-call]
            crc = own.digest().hex()  # type: ignore[no-untyped-call]
            skip = self._reused(number, crc, length)
            if skip == length:
                self._offset += length
                return done(None)
            if self._location is None:
                self._location = b.initiate(self._parts, self._key, create_only=self._create_only)
                if self._state is not None:
                    self._state.session = self._location
            start = self._offset + skip
            total = str(self._offset + length) if final else "*"
            headers = {
                "Content-Range": f"bytes {start}-{self._offset + length - 1}/{total}",
                "Content-Length": str(length - skip),
            }
            if final:
                headers["x-goog-hash"] = f"crc32c={self.checksum()}"
            else:  # listed before it is sent: whatever the server took, the state covers
                self._save_state(number, crc)
            # Sent straight from the part's buffer (no copy of the chunk).
            _headers, txt = b.call(
                "uploading",
                self._parts,
                "POST",
                self._location,
                headers=headers,
                data=ViewReader(chunk[skip:]),
            )
        self._offset += length
        if not final:
            return done(None)
        self._location = None  # finalised: nothing left to cancel
        self._drop_state()
        return done(json.loads(txt) if txt else {})

    def _reused(self, number: int, crc: str, length: int) -> int:
        """The bytes of chunk ``number`` (of CRC32C ``crc``, computed from the bytes written)
        that the resumed session already holds: none past its offset; below it, the chunk
        must be the one the state lists (checked up front against the source), else the
        source changed since and the commit fails (nothing is finalised)."""
        if self._offset >= self._held:
            return 0
        assert self._state is not None
        if self._state.crc32c.get(number) != crc:
            raise CommitError(
                f"{self._b.shown(self._parts)}: chunk {number} is not the bytes the resumed "
                "upload holds (the source changed while it was copied); nothing was published"
            )
        skip = min(length, self._held - self._offset)
        self.reused_bytes += skip
        return skip

    def complete(self, receipts: list[Any]) -> Written:
        return _written(receipts[-1] or {})  # the final chunk was the commit

    def put_whole(self, body: io.BytesIO, length: int) -> Written:
        data = body.getvalue()
        self._crc.update(data)  # type: ignore[no-untyped-call]
        return _written(
            self._b.upload_small(self._parts, self._key, data, create_only=self._create_only)
        )

    def abort(self) -> None:
        self._drop_state()
        if self._location is not None:
            location, self._location = self._location, None
            # An unreachable endpoint leaves the session; GCS expires it after a week.
            self._b.call("cancelling the upload of", self._parts, "DELETE", location)

    def checksum(self) -> str | None:
        return crc32c_b64(int.from_bytes(self._crc.digest(), "big"))  # type: ignore[no-untyped-call]

    # -- resuming (``gcs/resume.py``) ------------------------------------------------------
    def resume(self, identity: dict[str, Any], source: Rereadable) -> None:
        """Find the state an earlier attempt at this name left and resume its session. It is
        resumed only when the state parses, names this name, key, chunk size, session mode and
        a source of this very ``identity``, and a session URI of this key on this endpoint; the
        offset comes from the server's answer to a status query where the endpoint answers one
        (GCS), else (fake-gcs-server, whose status query would finalise the object) from the
        state, checked only by the finalisation (see ``docs/guarantees.md``); every chunk below
        it must have the CRC32C the state lists for it over the same bytes of ``source`` read
        now (and :meth:`send_part` checks each again against the bytes written). Otherwise the
        state is dropped (its session cancelled when it is this key's: never another URL) and
        the upload starts over; the state is written once the new session is started, just
        before its first chunk is sent."""
        where = resume_parts(self._parts)
        name = "/".join(self._parts)
        mine = GcsState(name, self._key, "", self.part_size, identity, self._create_only)
        self._state = mine
        size = int(identity["size"])
        try:
            data = self._b.read_small(where)
        except NotFoundError:
            return
        except RecordFormatError:
            data = b""
        found = parse_gcs(data)
        ours = found is not None and session_of(
            self._b.fs._location, self._b.bucket, self._key, found.session
        )
        if (
            found is not None
            and ours
            and found.name == name
            and found.key == self._key
            and found.chunk_size == self.part_size
            and found.create_only == self._create_only
            and found.source == identity
        ):
            held = self._held_by(found, size)
            if 0 < held < size and self._all_match(found, held, source):
                self._location, self._held = found.session, held
                found.sent = held - held % self.part_size
                # the chunks that hold a byte below the offset (one partly, where the server
                # kept part of a chunk), each checked again in send_part
                found.crc32c = {
                    n: c for n, c in found.crc32c.items() if (n - 1) * self.part_size < held
                }
                self._state = found
                log.info("%s: resuming upload at byte %d", self._b.shown(self._parts), held)
                return
        if found is not None and ours:  # another source, or a state not to trust: start over
            with contextlib.suppress(CommitStoreError):
                self._b.call("cancelling the upload of", self._parts, "DELETE", found.session)
        with contextlib.suppress(CommitStoreError):
            self._b.delete_key(where, self._b.key(where))

    def _held_by(self, found: GcsState, size: int) -> int:
        """The bytes the session holds: the server's answer to a status query where the
        endpoint answers one as a query, else the state's acknowledged chunks; -1 when the
        session is gone or finalised, or the server holds more than the state lists."""
        try:
            answers = self._b.probe_status_queries()
        except CommitStoreError:  # not known: nothing is resumed on a guess
            return -1
        if not answers:
            # the state's word is checked only by the finalisation, which replaces what stands
            # under the name before its check can fail: taken only when nothing stands there
            # (an overwrite of a committed object starts over instead, so it never loses it)
            try:
                standing = self._b.head(self._parts)
            except CommitStoreError:
                return -1
            return found.sent if standing is None else -1
        try:
            status, headers = self._b.query(self._parts, found.session, size)
        except CommitStoreError:
            return -1
        if status != 308:
            return -1  # finalised (200/201) or cancelled (499)
        held = 0
        got = headers.get("Range")
        if got is not None:
            match = re.fullmatch(r"bytes=0-(\d+)", str(got).strip())
            if match is None:
                return -1
            held = int(match.group(1)) + 1
        # every byte held must lie in a chunk whose CRC32C the state lists (the chunk in
        # flight at the kill is listed before it is sent)
        return held if held <= len(found.crc32c) * self.part_size else -1

    def _all_match(self, found: GcsState, held: int, source: Rereadable) -> bool:
        """Whether each chunk that holds a byte below ``held`` has the CRC32C the state lists
        over the same bytes of ``source`` read now; a failed or short read is no."""
        chunks = -(-held // self.part_size)
        for number in range(1, chunks + 1):
            crc = google_crc32c.Checksum()  # type: ignore[no-untyped-call]
            at, left = (number - 1) * self.part_size, self.part_size
            try:
                while left:
                    piece = source.pread(at, min(left, 8 * MiB))
                    if not piece:
                        return False
                    crc.update(piece)  # type: ignore[no-untyped-call]
                    at, left = at + len(piece), left - len(piece)
            except CommitStoreError:
                return False
            if crc.digest().hex() != found.crc32c.get(number):  # type: ignore[no-untyped-call]
                return False
        return True

    def _save_state(self, number: int, crc: str) -> None:
        """List chunk ``number`` (of CRC32C ``crc``) and rewrite the state, just before the
        chunk is sent (from the writer's thread): ``sent``, the bytes acknowledged, is then
        where the chunk starts. A failed write is logged: the upload goes on, and a later
        resume finds fewer chunks (or none) to reuse."""
        state = self._state
        if state is None or not state.session:
            return
        state.crc32c[number] = crc
        state.sent = self._offset
        where = resume_parts(self._parts)
        try:
            self._b.upload_small(where, self._b.key(where), state.to_bytes(), create_only=False)
        except CommitStoreError as exc:
            log.warning("%s", exc)

    def _drop_state(self) -> None:
        """Remove the state once the upload finalised or aborted (a failure is logged: gc, or
        the next attempt, removes it)."""
        if self._state is None:
            return
        self._state = None
        where = resume_parts(self._parts)
        try:
            self._b.delete_key(where, self._b.key(where))
        except CommitStoreError as exc:
            log.debug("%s", exc)


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


def _written(meta: dict[str, Any]) -> Written:
    generation = meta.get("generation")
    return Written(None if generation is None else str(generation), meta.get("crc32c"))


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
    failure: Exception | None = None
    try:
        fs = TimedGCSFileSystem(**kw)
        fs.attempts = attempts
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
    )
    return with_heartbeat(backend, opts["heartbeat"])
