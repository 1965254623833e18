"""GCS's upload session (:class:`GcsUpload`): a resumable upload's chunks, sent one at a time
and in order, CRC32C-summed on the way, whose final request is the commit, and the resume of an
upload of a local file from the session an earlier attempt left (``resume.py``).

The final chunk carries the total size and the CRC32C of every byte written (``x-goog-hash``),
which GCS checks; nothing is visible before it. A resumed session's chunks below its offset are
reused only when their CRC32Cs are those of the bytes written now."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import logging
import re
from typing import Any, Protocol

import google_crc32c

from commitstore.backends.base import Rereadable
from commitstore.backends.object.bodies import ViewReader
from commitstore.backends.object.gcs.resume import GcsState, session_of
from commitstore.backends.object.resume import KeepsState, StateFile
from commitstore.backends.object.upload import ObjectStat, Upload, Written, done
from commitstore.errors import CommitError, CommitStoreError, NotFoundError
from commitstore.layout import Parts

MiB = 1024 * 1024
CRC_PIECE = 1024 * 1024
"""CRC32C is fed in pieces of this size, each a small copy of the part of the chunk it covers."""

log = logging.getLogger("commitstore")


class GcsCalls(Protocol):
    """What an upload session needs of its store (``gcs.backend.GcsBackend`` provides it)."""

    @property
    def fs(self) -> Any:
        """The fsspec file system of this process."""

    bucket: str
    chunk_size: int

    def key(self, parts: Parts) -> str: ...

    def shown(self, parts: Parts) -> str: ...

    def call(
        self, what: str, parts: Parts, method: str, path: str, *args: Any, **kw: Any
    ) -> Any: ...

    def initiate(self, parts: Parts, key: str, *, create_only: bool) -> str: ...

    def upload_small(
        self, parts: Parts, key: str, data: bytes, *, create_only: bool
    ) -> dict[str, Any]: ...

    def delete_key(self, parts: Parts, key: str) -> None: ...

    def read_small(self, parts: Parts) -> bytes: ...

    def head(self, parts: Parts) -> ObjectStat | None: ...

    def probe_status_queries(self) -> bool: ...

    def query(self, parts: Parts, location: str, total: int) -> tuple[int, Any]: ...


def crc32c_b64(value: int) -> str:
    """GCS's encoding of a CRC32C: base64 of the 4 big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


class GcsUpload(KeepsState[GcsState], Upload):
    """A resumable upload: 256 KiB-aligned chunks, one at a time and in order, CRC32C-summed on
    the way; the final one (never empty: the sink keeps a byte for it) carries the total size and
    the CRC32C of every byte written (``x-goog-hash``: GCS documents that it refuses an upload
    whose bytes do not match a checksum supplied with it) and is the commit. Create-only is
    ``ifGenerationMatch=0`` on the session.

    Offered a local source (:meth:`resume`), the session keeps its state on the target (the
    session URI, each chunk's CRC32C: ``gcs/resume.py``), rewritten just before each chunk is
    sent (listing it: in flight) and again once its answer came (none in flight), so a later
    attempt from the same unchanged source sends only what the server lacks. A chunk the
    server answers 404 (the session finalised by another writer that resumed it, or
    cancelled) is a ``CommitError``."""

    max_inflight = 1

    def __init__(self, backend: GcsCalls, parts: Parts, *, create_only: bool) -> None:
        self._b, self._parts, self._key = backend, parts, backend.key(parts)
        self._create_only = create_only
        self.part_size = backend.chunk_size
        self._crc = google_crc32c.Checksum()  # type: ignore[no-untyped-call]
        self._location: str | None = None
        self._offset = 0
        self._state: GcsState | None = None  # resumable: the state kept on the target
        self._file = StateFile(
            parts,
            store=backend,
            write=lambda where, data: backend.upload_small(
                where, backend.key(where), data, create_only=False
            ),
            remove=lambda where: backend.delete_key(where, backend.key(where)),
        )
        self._held = 0  # resumed: the bytes the session holds (chunks not sent again)
        self._unconfirmed = False  # resumed on the state's word (no status query)
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
                self._finalisable()
            else:  # listed before it is sent: whatever the server took, the state covers
                self._save_state(number, crc)
            # Sent straight from the part's buffer (no copy of the chunk).
            try:
                _headers, txt = b.call(
                    "uploading",
                    self._parts,
                    "POST",
                    self._location,
                    headers=headers,
                    data=ViewReader(chunk[skip:]),
                )
            except NotFoundError as exc:
                raise self._session_gone() from exc
        self._offset += length
        if not final:
            self._save_acked()
            return done(None)
        self._location = None  # finalised: nothing left to cancel
        self._drop_state()
        return done(json.loads(txt) if txt else {})

    def _finalisable(self) -> None:
        """Just before the final request of a session resumed on the state's word (no status
        query, :meth:`_held_by`): a fresh stat must still find no object under the name. The
        finalisation replaces what stands there before the post-upload check can fail, and the
        bytes this session holds are confirmed by nothing but that check (another writer may
        have resumed the same session and sent into it): an object committed since the resume
        makes this a ``CommitError``, with nothing finalised (the session is cancelled)."""
        if not self._unconfirmed:
            return
        if self._b.head(self._parts) is not None:
            raise CommitError(
                f"{self._b.shown(self._parts)}: an object was committed under the name while this "
                "resumed upload ran; the resumed session was not finalised (nothing replaced)"
            )

    def _session_gone(self) -> CommitError:
        """The error for a chunk the server answered 404: the session is gone (finalised by
        another writer that resumed it, or cancelled): this write failed, the name is not
        missing (a ``CommitError``, never a ``NotFoundError``)."""
        return CommitError(
            f"{self._b.shown(self._parts)}: the upload session is gone (finalised by another "
            "writer that resumed it, or cancelled); nothing was published by this upload"
        )

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
        state, only when it says no chunk was in flight and no object stands under the name,
        which a fresh stat checks again just before the final request (:meth:`_finalisable`;
        see ``docs/guarantees.md``); every chunk below
        it must have the CRC32C the state lists for it over the same bytes of ``source`` read
        now (and :meth:`send_part` checks each again against the bytes written). Otherwise the
        state is dropped (its session cancelled when it is this key's: never another URL) and
        the upload starts over; the state is written once the new session is started, just
        before its first chunk is sent."""
        name = self._file.name
        mine = GcsState(name, self._key, "", self.part_size, identity, self._create_only)
        self._state = mine
        size = int(identity["size"])
        there, found = self._file.find(GcsState)
        if not there:
            return
        ours = found is not None and session_of(
            self._b.fs._location, self._b.bucket, self._key, found.session
        )
        if (
            found is not None
            and ours
            and found.names(name, self._key, self.part_size, identity)
            and found.create_only == self._create_only
        ):
            held = self._held_by(found, size)
            if 0 < held < size and self._all_match(found, held, source):
                self._location, self._held = found.session, held
                self._unconfirmed = not self._b.probe_status_queries()  # known by now: cached
                found.sent = held - held % self.part_size
                # the chunks that hold a byte below the offset (one partly, where the server
                # kept part of a chunk), each checked again in send_part
                found.crc32c = {
                    n: c for n, c in found.crc32c.items() if (n - 1) * self.part_size < held
                }
                self._state = found
                log.info("%s: resuming upload at byte %d", self._b.shown(self._parts), held)
                return
        if found is None or not ours:  # no session of this key to cancel
            self._file.start_over()
            return
        session = found.session  # another source, or a state not to trust: cancelled
        self._file.start_over(
            lambda: self._b.call("cancelling the upload of", self._parts, "DELETE", session)
        )

    def _held_by(self, found: GcsState, size: int) -> int:
        """The bytes the session holds: the server's answer to a status query where the
        endpoint answers one as a query, else the state's acknowledged chunks, only when the
        state says no chunk was in flight (a chunk listed past ``sent``: the server may hold it,
        and nothing can ask); -1 when the session is gone or finalised, the server holds more
        than the state lists, or (no status query) a chunk was in flight or an object stands."""
        try:
            answers = self._b.probe_status_queries()
        except CommitStoreError:  # not known: nothing is resumed on a guess
            return -1
        if not answers:
            if found.sent != len(found.crc32c) * self.part_size:
                return -1  # killed with a chunk in flight: the server may be past ``sent``
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
        self._file.write(state.to_bytes())

    def _save_acked(self) -> None:
        """Rewrite the state once a (non-final) chunk's answer came: ``sent`` is then the end
        of the chunks it lists, which says no chunk is in flight (:meth:`_held_by` trusts the
        state's offset without a status query only then). A failed write is logged: the state
        still lists the chunk as in flight, and a resume without a status query starts over."""
        state = self._state
        if state is None or not state.session:
            return
        state.sent = self._offset
        self._file.write(state.to_bytes())


def _written(meta: dict[str, Any]) -> Written:
    generation = meta.get("generation")
    return Written(None if generation is None else str(generation), meta.get("crc32c"))
