"""Azure's upload session (:class:`AzureUpload`): blocks staged with ``Content-MD5`` under IDs
made of their part number and MD5 (``resume.block_id``), ``Put Block List`` of those IDs as the
commit, and the resume of an upload of a local file from the blocks the server still holds.

Every body (a block, or the whole blob in one ``Put Blob``) carries the MD5 the sink computed
from the bytes written, which the server checks: a body garbled on the way, or read from a
source that changed in between, is refused. So a block the server lists under an ID holds the
bytes of the MD5 in that ID, which is what lets a later attempt reuse it (:meth:`reuse`)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from commitstore.backends.base import Rereadable
from commitstore.backends.object.azure.resume import (
    MAX_BLOCKS,
    AzureResumeState,
    block_id,
    block_of,
)
from commitstore.backends.object.bodies import SourceWindow
from commitstore.backends.object.resume import KeepsState, StateFile
from commitstore.backends.object.session import Upload, Written
from commitstore.errors import NotFoundError
from commitstore.layout import Parts

T = TypeVar("T")
log = logging.getLogger("commitstore")


class AzureCalls(Protocol):
    """What an upload session needs of its store (``azure.backend.AzureBackend`` provides it)."""

    block_size: int
    max_inflight: int
    pool: concurrent.futures.ThreadPoolExecutor

    def call(self, what: str, parts: Parts, fn: Callable[[], T]) -> T: ...

    def blob(self, parts: Parts) -> Any: ...

    def key(self, parts: Parts) -> str: ...

    def shown(self, parts: Parts) -> str: ...

    def read_small(self, parts: Parts) -> bytes: ...


class AzureUpload(KeepsState[AzureResumeState], Upload):
    """Blocks staged concurrently, each with its ``Content-MD5``, under :func:`block_id` of its
    part number and MD5; ``commit_block_list`` of those IDs is the commit, with
    ``If-None-Match: *`` for create-only. Two writers of one blob never mix blocks: one ID is
    one content. Staged blocks are invisible and expire after seven days: there is nothing to
    abort on the server."""

    max_parts = MAX_BLOCKS

    def __init__(self, backend: AzureCalls, parts: Parts, *, create_only: bool) -> None:
        self._b, self._parts, self._client = backend, parts, backend.blob(parts)
        self._key = backend.key(parts)
        self._cond: dict[str, Any] = {"if_none_match": "*"} if create_only else {}
        self.part_size = backend.block_size
        self.max_inflight = backend.max_inflight
        self._given: dict[int, bytes] = {}  # MD5s the sink computed while filling the bodies
        # Resumable (the bytes come from a local file): the state kept on the target.
        self._lock = threading.Lock()
        self._state: AzureResumeState | None = None
        self._file = StateFile(
            parts,
            store=backend,
            write=lambda where, data: backend.call(
                "saving the upload state of",
                where,
                lambda: backend.blob(where).upload_blob(data, overwrite=True),
            ),
            remove=lambda where: backend.call(
                "removing", where, lambda: backend.blob(where).delete_blob()
            ),
        )
        self._saved = 0  # blocks in the state as last written (-1: never written)
        self._done: dict[int, str] = {}  # ID of each block the server took (or holds)
        self._stated: dict[int, str] = {}  # resumed: the IDs the state found gave
        self._held: dict[str, int] = {}  # resumed: the server's uncommitted blocks (ID -> size)
        self.reused_bytes = 0

    def given_md5(self, number: int, md5: bytes) -> None:
        self._given[number] = md5

    def _md5(self, number: int, data: bytes) -> bytes:
        given = self._given.pop(number, None)
        return given if given is not None else hashlib.md5(data, usedforsecurity=False).digest()

    def send_part(
        self, number: int, body: io.BytesIO, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        chunk = body.getvalue()  # the buffer's own bytes (no copy)
        return self._stage(number, chunk, length, self._md5(number, chunk))

    def send_window(
        self, number: int, body: SourceWindow, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        return self._stage(number, body, length, self._given.pop(number))

    def _stage(
        self, number: int, body: bytes | SourceWindow, length: int, md5: bytes
    ) -> concurrent.futures.Future[Any]:
        ident = block_id(number, md5)
        self._save_state()

        def stage() -> str:
            self._b.call(
                "staging a block of",
                self._parts,
                lambda: self._client.stage_block(
                    ident, body, length=length, transactional_content_md5=md5
                ),
            )
            with self._lock:
                self._done[number] = ident
            return ident

        return self._b.pool.submit(stage)

    def complete(self, receipts: list[Any]) -> Written:
        done = self._b.call(
            "committing the block list of",
            self._parts,
            lambda: self._client.commit_block_list(receipts, **self._cond),
        )
        self._drop_state()
        return Written(done.get("etag"))

    def put_whole(self, body: io.BytesIO, length: int) -> Written:
        data = body.getvalue()
        return self._put(data, length, self._md5(0, data))

    def put_window(self, body: SourceWindow, length: int) -> Written:
        return self._put(body, length, self._given.pop(0))

    def _put(self, body: bytes | SourceWindow, length: int, md5: bytes) -> Written:
        """One ``Put Blob`` (the store's ``whole_max`` keeps it within the SDK's single put,
        which reads a window into memory first)."""
        done = self._b.call(
            "uploading",
            self._parts,
            lambda: self._client.upload_blob(
                body, length=length, overwrite=True, transactional_content_md5=md5, **self._cond
            ),
        )
        return Written(done.get("etag"))

    def abort(self) -> None:
        """Nothing to abort on the server (uncommitted blocks are never visible and expire after
        seven days); the resume state, if any, is removed."""
        self._drop_state()

    # -- resuming (``azure/resume.py``) ----------------------------------------------------
    def resume(self, identity: dict[str, Any], source: Rereadable) -> None:
        """Find the state an earlier attempt at this name left. It is resumed only when it
        parses and names this name, this blob, this block size and a source of this very
        ``identity``; then the blocks the server holds uncommitted for this blob (``Get Block
        List``) are the ones :meth:`reuse` may take, and the state found stands until a block
        is taken. Otherwise the state is dropped and every block is sent; the new state is
        written before the first block is staged."""
        del source  # each block is checked against the bytes written (reuse)
        name = self._file.name
        self._state = AzureResumeState(name, self._key, self.part_size, identity)
        self._saved = -1
        there, found = self._file.find(AzureResumeState)
        if not there:
            return
        if found is not None and found.names(name, self._key, self.part_size, identity):
            self._held = self._uncommitted()
            self._stated = dict(found.blocks)
            self._saved = 0
            log.info(
                "%s: resuming its upload (%d blocks on the server)",
                self._b.shown(self._parts),
                len(self._held),
            )
            return
        self._file.start_over()

    def _uncommitted(self) -> dict[str, int]:
        """The blocks the server holds uncommitted for this blob, by ID (only IDs
        :func:`block_id` makes): ID -> size; none when the blob has no block at all."""

        def listing() -> list[Any]:
            return list(self._client.get_block_list("uncommitted")[1])

        try:
            blocks = self._b.call("listing the blocks of", self._parts, listing)
        except NotFoundError:
            return {}
        return {b.id: int(b.size) for b in blocks if block_of(str(b.id)) is not None}

    def reuse(self, number: int, md5: bytes, length: int) -> Any | None:
        """Block ``number``'s receipt (its ID) when the server holds the block of ID
        ``block_id(number, md5)`` (``md5``: of the bytes written now) with ``length`` bytes,
        and the state found does not give that part another ID; None: it is staged (again)."""
        ident = block_id(number, md5)
        if self._held.get(ident) != length or self._stated.get(number, ident) != ident:
            return None
        self._given.pop(number, None)
        with self._lock:
            self._done[number] = ident
        self.reused_bytes += length
        return ident

    def _save_state(self) -> None:
        """Write the state when it was never written or blocks were taken since (from the
        writer's thread, before each block is staged). A failed write is logged: the upload goes
        on, and a later resume finds no state (every block is sent again) or an older one."""
        state = self._state
        if state is None:
            return
        with self._lock:
            if len(self._done) == self._saved:
                return
            state.blocks = dict(self._done)
        if self._file.write(state.to_bytes()):
            self._saved = len(state.blocks)
