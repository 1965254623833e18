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
import json
import logging
import math
import threading
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from commitstore._recordrules import RecordFormatError
from commitstore.backends.base import Rereadable
from commitstore.backends.object.bodies import Body, SourceWindow
from commitstore.backends.object.resume import KeepsState, ResumeState, StateFile
from commitstore.backends.object.upload import Upload, Written
from commitstore.backends.object.writerid import known_dead, this_writer
from commitstore.errors import CommitError, CommitStoreError, NotFoundError
from commitstore.layout import META_DIR, Parts

MAX_PARTS = 10_000
UPLOADS_DIR = "uploads"
"""``.commitstore/uploads/<upload id>``: the proof of life of a live multipart upload."""
PARTS_PER_SIZE = 1000
"""The part size doubles after every this many parts (:func:`part_span`)."""
STALE_BEATS = 3.0
"""An upload is live (another writer's resume never aborts nor joins it) while its last activity
(its start, a part, its writer's marker) is younger than this many heartbeats, less the store's
``mtime_resolution``: a writer may miss one beat and still be taken for alive."""

log = logging.getLogger("commitstore")


def upload_marker(upload_id: str) -> Parts:
    """Where the writer of multipart upload ``upload_id`` proves it is alive (a small object,
    :func:`marker_body`, rewritten every ``heartbeat`` seconds while the upload is open): gc ages
    the upload by it, so a writer that pauses between parts for longer than ``min_age`` keeps
    its upload; another writer's resume never joins nor aborts the upload while it is fresh."""
    return (META_DIR, UPLOADS_DIR, upload_id.replace("/", "_"))


def marker_body(heartbeat: float) -> bytes:
    """An upload marker's bytes: ``{"heartbeat": <seconds>, "writer": ...}``: its writer's
    interval, so a resuming writer of another ``heartbeat`` judges the marker by the longer of
    the two, and its writer (:func:`~commitstore.backends.object.writerid.this_writer`), so a
    writer restarted on the same machine resumes at once once that process is gone."""
    return json.dumps({"heartbeat": heartbeat, "writer": this_writer()}).encode("ascii")


def _marker_doc(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def stated_writer_dead(data: bytes) -> bool:
    """Whether the writer a marker states (:func:`marker_body`) is known to be gone
    (:func:`~commitstore.backends.object.writerid.known_dead`); False when it states none."""
    return known_dead(_marker_doc(data).get("writer"))


def stated_heartbeat(data: bytes) -> float:
    """The heartbeat a marker states (:func:`marker_body`); 0.0 when it states none (an empty
    marker, as older versions wrote, or garbage)."""
    value = _marker_doc(data).get("heartbeat")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value) if math.isfinite(value) and value > 0 else 0.0


def part_span(number: int, part_size: int) -> tuple[int, int]:
    """(offset, size) of part ``number`` (from 1) of an upload whose first part is ``part_size``
    bytes: the size doubles every :data:`PARTS_PER_SIZE` parts (10,000 parts hold 1,023,000
    first parts' worth of bytes). The one place that rule is written: the sink fills parts of
    :attr:`S3Upload.part_size`, which follows it, and a resume checks and reuses the server's
    parts at the offsets it gives."""
    if number < 1:
        raise ValueError(f"part numbers start at 1, not {number}")
    block, index = divmod(number - 1, PARTS_PER_SIZE)
    size = part_size << block
    return PARTS_PER_SIZE * part_size * ((1 << block) - 1) + index * size, size


class S3Calls(Protocol):
    """What an upload session needs of its store (``s3.S3Backend`` provides it)."""

    @property
    def fs(self) -> Any:
        """The fsspec file system of this process."""

    part_size: int
    max_inflight: int
    mtime_resolution: float
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

    def read_small(self, parts: Parts) -> bytes: ...

    def head(self, parts: Parts) -> Any: ...

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
                Body=marker_body(self._b.heartbeat),
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


class S3Upload(KeepsState[ResumeState], Upload):
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
        self._base = backend.part_size
        self.part_size = backend.part_size  # of the next part to fill (``part_span``)
        self.max_inflight = backend.max_inflight
        self._upload_id: str | None = None
        self._md5s: dict[int, bytes] = {}
        self._given: dict[int, bytes] = {}  # MD5s the sink computed while filling the bodies
        self._expected_tag: str | None = None
        self._alive: _Alive | None = None
        # Resumable (the bytes come from a local file): the state kept on the target.
        self._state: ResumeState | None = None
        self._file = StateFile(
            parts,
            store=backend,
            write=lambda where, data: backend.call(
                "saving the upload state of", where, "put_object", Key=backend.key(where), Body=data
            ),
            remove=lambda where: backend.call(
                "removing", where, "delete_object", Key=backend.key(where)
            ),
        )
        self._saved = 0  # parts in the state as last written
        self._done: dict[int, str] = {}  # MD5 (hex) of each part the server took
        self._held: dict[int, tuple[str, int]] = {}  # resumed: the server's parts (ETag, size)
        self.reused_bytes = 0

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
            if self._state is not None:
                self._state.upload_id, self._saved = self._upload_id, -1
        self._save_state()
        self.part_size = part_span(number + 1, self._base)[1]
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
                self._done[number] = md5.hex()
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
        self._drop_state()
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
            self._abort_id(upload_id)
        self._drop_state()

    def _abort_id(self, upload_id: str) -> None:
        self._b.call(
            "aborting the upload of",
            self._parts,
            "abort_multipart_upload",
            Key=self._key,
            UploadId=upload_id,
        )

    # -- resuming (``backends/object/resume.py``) ------------------------------------------
    def resume(self, identity: dict[str, Any], source: Rereadable) -> None:
        """Find the state an earlier attempt at this name left. It is resumed only when it
        parses, names this key, this part size and a source of this very ``identity``, the
        server lists its upload id as an upload of this key, that upload is not live
        (:meth:`_live`: another writer's, still running), and every part the server holds for
        it has the MD5 and length of the same bytes of ``source`` read now (a source changed in
        place with its identity kept would need a part sent again into the same upload, which
        some servers refuse: ``rclone serve s3``); then those parts are reused (each checked
        again by :meth:`reuse` against the bytes the sink hashes). A live upload is neither
        joined nor aborted, and its state is left in place: this upload starts anew (its own
        state replaces that one once it is created). Otherwise the state is dropped (its upload
        aborted when the server shows it is this key's: never another name's) and the upload
        starts over; the state is written once the new upload is created."""
        name = self._file.name
        self._state = ResumeState(name, self._key, "", self._base, identity)
        there, found = self._file.find(ResumeState)
        if not there:
            return
        listed = None
        if found is not None and found.key == self._key:
            listed = self._listed(found.upload_id)
        held = None if listed is None or found is None else self._list_parts(found.upload_id)
        if found is not None and listed is not None and held is not None:
            if self._live(found.upload_id, listed, held):
                log.info(
                    "%s: upload %s of the resume state is live (another writer's): neither "
                    "joined nor aborted, a new upload is started",
                    self._b.shown(self._parts),
                    found.upload_id,
                )
                return
            if found.names(name, self._key, self._base, identity) and self._all_match(
                held, found.part_size, source
            ):
                self._upload_id = found.upload_id
                self._alive = _Alive(self._b, found.upload_id)
                self._held = {n: (tag, size) for n, (tag, size, _t) in held.items()}
                self._state = found
                self._done = dict(found.parts)
                self._saved = len(self._done)
                log.info(
                    "%s: resuming upload %s (%d parts on the server)",
                    self._b.shown(self._parts),
                    found.upload_id,
                    len(held),
                )
                return
        if found is None or listed is None:  # no upload of this key to abort
            self._file.start_over()
            return
        upload_id = found.upload_id  # another source, or not to trust: aborted
        self._file.start_over(lambda: self._abort_earlier(upload_id))

    def _abort_earlier(self, upload_id: str) -> None:
        """Abort an earlier attempt's upload of this key (dead, or not to trust), then remove
        its writer's marker (:func:`upload_marker`), which nothing else would remove."""
        self._abort_id(upload_id)
        marker = upload_marker(upload_id)
        self._b.call("removing", marker, "delete_object", Key=self._b.key(marker))

    def _live(
        self,
        upload_id: str,
        listed: dict[str, Any],
        held: dict[int, tuple[str, int, float | None]],
    ) -> bool:
        """Whether upload ``upload_id`` may be another writer's, still running: its last
        activity (its start as listed, its parts' times, its writer's marker,
        :func:`upload_marker`, rewritten every heartbeat while that writer lives) is younger
        than :data:`STALE_BEATS` heartbeats, judged as gc judges ages (the local clock against
        the server's times, less the store's ``mtime_resolution``: a time truncated to the
        second never makes an upload look older than it is); the heartbeat is the longer of this
        store's and the one the marker states (:func:`marker_body`). A marker whose writer is
        known to be gone (a process of this machine that no longer runs:
        :func:`stated_writer_dead`) makes it dead at once, whatever its age. An unreadable
        marker, or no time at all, counts as live."""
        started = listed.get("Initiated")
        times = [started.timestamp()] if started is not None else []
        times += [t for _tag, _size, t in held.values() if t is not None]
        heartbeat = self._b.heartbeat
        marker = upload_marker(upload_id)
        try:
            alive = self._b.head(marker)
            if alive is not None:
                body = self._b.read_small(marker)
                if stated_writer_dead(body):  # its process is gone: no need to wait
                    return False
                heartbeat = max(heartbeat, stated_heartbeat(body))
        except (CommitStoreError, RecordFormatError):  # gone meanwhile, unreadable, too large
            return True
        if alive is not None:
            if alive.mtime is None:
                return True
            times.append(alive.mtime)
        if not times:
            return True
        age = time.time() - max(times) - float(self._b.mtime_resolution)
        return bool(age < STALE_BEATS * heartbeat)

    @staticmethod
    def _all_match(
        held: dict[int, tuple[str, int, float | None]], part_size: int, source: Rereadable
    ) -> bool:
        """Whether each held part (number -> (ETag, size, time)) is the MD5 of ``size`` bytes
        of ``source`` at that part's offset (:func:`part_span`); a failed read is no."""
        for number, (etag, length, _t) in held.items():
            digest = hashlib.md5(usedforsecurity=False)
            at, left = part_span(number, part_size)[0], length
            try:
                while left:
                    chunk = source.pread(at, min(left, 8 * 1024 * 1024))
                    if not chunk:
                        return False
                    digest.update(chunk)
                    at, left = at + len(chunk), left - len(chunk)
            except CommitStoreError:
                return False
            if digest.hexdigest() != etag:
                return False
        return True

    def reuse(self, number: int, md5: bytes, length: int) -> Any | None:
        """Part ``number``'s receipt when the server holds a part of ETag ``md5`` (the MD5 of
        the bytes written now) and ``length`` bytes, and the state does not give that part
        another MD5; None: it is sent (again)."""
        held = self._held.get(number)
        hexed = md5.hex()
        assert self._state is not None or not self._held
        stated = self._state.parts.get(number, hexed) if self._state is not None else hexed
        if held is None or held != (hexed, length) or stated != hexed:
            return None
        self.part_size = part_span(number + 1, self._base)[1]
        self._given.pop(number, None)
        self._md5s[number] = md5
        self._done[number] = hexed
        self.reused_bytes += length
        return {"PartNumber": number, "ETag": f'"{hexed}"'}

    def _listed(self, upload_id: str) -> dict[str, Any] | None:
        """The server's listing entry of ``upload_id`` when it is an upload in progress of this
        very key; None otherwise."""
        marker: dict[str, Any] = {}
        while True:
            try:
                page = self._b.call(
                    "listing uploads of",
                    self._parts,
                    "list_multipart_uploads",
                    Prefix=self._key,
                    **marker,
                )
            except NotFoundError:  # rclone answers NoSuchUpload when there are none
                return None
            for up in page.get("Uploads", []):
                if up.get("Key") == self._key and up.get("UploadId") == upload_id:
                    return dict(up)
            if not page.get("IsTruncated"):
                return None
            marker = {
                "KeyMarker": page.get("NextKeyMarker"),
                "UploadIdMarker": page.get("NextUploadIdMarker"),
            }

    def _list_parts(self, upload_id: str) -> dict[int, tuple[str, int, float | None]] | None:
        """The parts the server holds for ``upload_id``: number -> (ETag unquoted, size, time
        it landed or None); None when the upload is gone."""
        held: dict[int, tuple[str, int, float | None]] = {}
        marker: dict[str, Any] = {}
        while True:
            try:
                page = self._b.call(
                    "listing parts of",
                    self._parts,
                    "list_parts",
                    Key=self._key,
                    UploadId=upload_id,
                    **marker,
                )
            except NotFoundError:
                return None
            for p in page.get("Parts", []):
                tag = str(p.get("ETag") or "").strip().strip('"')
                landed = p.get("LastModified")
                when = landed.timestamp() if landed is not None else None
                held[int(p["PartNumber"])] = (tag, int(p.get("Size", -1)), when)
            if not page.get("IsTruncated"):
                return held
            marker = {"PartNumberMarker": page.get("NextPartNumberMarker")}

    def _save_state(self) -> None:
        """Write the state when parts were taken since it was last written (from the writer's
        thread, before each part is sent). A failed write is logged: the upload goes on, and a
        later resume finds fewer parts (or none) to reuse."""
        state = self._state
        if state is None or not state.upload_id or len(self._done) == self._saved:
            return
        state.parts = dict(self._done)
        if self._file.write(state.to_bytes()):
            self._saved = len(state.parts)


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
