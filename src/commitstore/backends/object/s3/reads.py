"""Pipelined ranged reads of one S3 object version: what ``S3Backend.open_read`` returns.

A HEAD at open pins the object's size and ETag. Reads are served from ranged GETs, each
conditioned on that ETag (``If-Match``; a server that ignores the condition is caught by
comparing each answer's own ETag and length), so an object replaced while it is read fails
loudly (:class:`NotFoundError`, "replaced while it was read") and never mixes two versions.

While the consumer reads sequentially, up to ``depth`` ranges are in flight on s3fs's event loop.
A fresh start or a seek starts a window of two ranges of ``block`` bytes (so a random-access
reader such as ``torch.load`` costs one range per seek, as a read-ahead file did); every range
consumed in order doubles the window's count (up to ``depth``) and its range length (up to a
third of the budget): a long sequential read asks for fewer, larger ranges, which a server
answering one request at a time (and reading the whole object per request, as moto does)
needs. Results are consumed IN ORDER: the hash and the
destination see the bytes sequentially. Memory is bounded by a byte budget of
``(depth + 1) x block``: the ranges in flight and the one being consumed never hold more
(a range is only requested if it fits, and a consumed range is released first). No range is ever
requested past the end of the object, and a sequential read of the whole object downloads each
byte once. Every failure is typed (``s3/errors.translate``, the backend exception as
``__cause__``); a failure, a seek away from the window, or :meth:`close` cancels every range in
flight and waits until each has finished (no request keeps running; no thread is started: the
requests run on s3fs's own loop).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import errno
import io
from typing import Any

from commitstore.backends.object.bodies import SeekableBody
from commitstore.backends.object.s3.errors import translate
from commitstore.errors import BackendUnavailableError, CommitError, CommitStoreError, NotFoundError


class _Replaced(Exception):
    """An answer from another version of the object than the one pinned at open."""


class S3RangedReader(SeekableBody):
    """A readable, seekable file over one version of an S3 object (see the module docstring)."""

    def __init__(
        self,
        fs: Any,
        bucket: str,
        key: str,
        shown: str,
        *,
        size: int,
        etag: str | None,
        block: int,
        depth: int,
    ) -> None:
        super().__init__()
        self._fs, self._bucket, self._key, self._shown = fs, bucket, key, shown
        self.size, self.etag = size, etag
        self._part, self._max_depth = block, max(1, depth)
        self._budget = (self._max_depth + 1) * block
        """Bytes held at most: the ranges in flight plus the one being consumed."""
        self._cap = max(block, self._budget // 3)
        """The largest range: two fit in flight beside the one being consumed (with ``depth``
        below 3, ranges stay ``block`` long)."""
        self._block = block
        self._pos = 0
        self._buf, self._buf_start = b"", 0
        self._queue: collections.deque[tuple[int, int, concurrent.futures.Future[bytes]]] = (
            collections.deque()
        )
        self._next = 0  # where the next range to request starts
        self._depth = min(2, self._max_depth)
        self._tasks: set[asyncio.Task[bytes]] = set()  # touched on the loop only
        self.requested = 0
        """Bytes requested so far (ranges in flight included): what the server is asked for."""
        self.peak_held = 0
        """The most bytes held at once (ranges in flight and the one being consumed)."""

    # -- io.RawIOBase ------------------------------------------------------------------------
    def _length(self) -> int:
        return self.size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """As a file's: a seek before the start is ``OSError(EINVAL)``, not a seek to 0."""
        self._checkClosed()
        base = self._origin(whence)
        if base + offset < 0:
            raise OSError(errno.EINVAL, f"invalid seek ({offset}, {whence}) in {self._shown}")
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        """Fills ``b`` whole unless the end comes first (never a short read mid-object)."""
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view) and (data := self._chunk(len(view) - done)):
            view[done : done + len(data)] = data
            done += len(data)
        return done

    def read(self, size: int | None = -1) -> bytes:
        """``size`` bytes (fewer only at the end); all the rest when ``size`` is None or < 0."""
        if size is None or size < 0:
            size = max(0, self.size - self._pos)
        out = []
        while size > 0 and (chunk := self._chunk(size)):
            out.append(bytes(chunk))
            size -= len(chunk)
        return b"".join(out)

    def readall(self) -> bytes:
        return self.read()

    def close(self) -> None:
        if not self.closed:
            try:
                self._cancel()
            finally:
                self._buf = b""
                super().close()

    # -- the pipeline ------------------------------------------------------------------------
    def _chunk(self, n: int) -> memoryview:
        """Up to ``n`` bytes at the current position (empty at the end), as a view."""
        self._checkClosed()
        if n <= 0 or self._pos >= self.size:
            return memoryview(b"")
        at = self._pos - self._buf_start
        if not 0 <= at < len(self._buf):
            self._fill()
            at = self._pos - self._buf_start
        data = memoryview(self._buf)[at : at + n]
        self._pos += len(data)
        return data

    def _fill(self) -> None:
        """Make the range holding the current position the buffer, keeping the window full."""
        self._buf = b""  # consumed (or of no use after a seek): released before asking for more
        if not self._queue or self._queue[0][0] != self._pos:
            # A fresh start, or a seek away from the window: nothing in flight is of use.
            self._cancel()
            self._next, self._depth = self._pos, min(2, self._max_depth)
            self._block = self._part
        else:
            # Read in order: a wider window of larger ranges, in the same memory (a server that
            # answers one request at a time pays per request, not per range in flight).
            self._depth = min(self._depth * 2, self._max_depth)
            self._block = min(self._block * 2, self._cap)
        self._top_up()
        start, _, fut = self._queue.popleft()
        try:
            data = fut.result()
        except BaseException as exc:
            self._cancel()
            raise self._typed(exc) from exc
        self._buf, self._buf_start = data, start
        self._top_up()

    def _top_up(self) -> None:
        held = len(self._buf) + sum(end - start for start, end, _ in self._queue)
        while len(self._queue) < self._depth and self._next < self.size:
            start, end = self._next, min(self._next + self._block, self.size)
            if held + end - start > self._budget:
                break  # never reached with nothing in flight and nothing held: block <= budget
            held += end - start
            self.peak_held = max(self.peak_held, held)
            self._queue.append((start, end, self._spawn(start, end)))
            self._next = end
            self.requested += end - start

    def _spawn(self, start: int, end: int) -> concurrent.futures.Future[bytes]:
        fut: concurrent.futures.Future[bytes] = concurrent.futures.Future()

        def begin() -> None:
            task = asyncio.ensure_future(self._get(start, end))
            self._tasks.add(task)
            task.add_done_callback(lambda t: self._settle(t, fut))

        self._fs.loop.call_soon_threadsafe(begin)
        return fut

    def _settle(self, task: asyncio.Task[bytes], fut: concurrent.futures.Future[bytes]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            fut.cancel()
        elif (exc := task.exception()) is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(task.result())

    async def _get(self, start: int, end: int) -> bytes:
        cond = {"IfMatch": self.etag} if self.etag else {}
        resp = await self._fs._call_s3(
            "get_object",
            Bucket=self._bucket,
            Key=self._key,
            Range=f"bytes={start}-{end - 1}",
            **cond,
        )
        body = resp["Body"]
        try:
            data: bytes = await body.read()
        finally:
            body.close()
        if (self.etag and resp.get("ETag") not in (None, self.etag)) or len(data) != end - start:
            raise _Replaced(f"bytes {start}-{end - 1}: another version answered")
        return data

    def _cancel(self) -> None:
        """Cancel every range in flight and wait until each has finished. A settled future means
        its task has finished (``_settle`` runs when it is done): with none unsettled, or s3fs's
        loop gone (interpreter exit), there is nothing to wait for."""
        pending = [fut for _, _, fut in self._queue if not fut.done()]
        self._queue.clear()
        if not pending or not self._fs.loop.is_running():
            return

        async def drain() -> None:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(drain(), self._fs.loop).result()

    def _typed(self, exc: BaseException) -> BaseException:
        if isinstance(exc, CommitStoreError | KeyboardInterrupt | SystemExit):
            return exc
        if isinstance(exc, _Replaced) or _precondition_failed(exc):
            return NotFoundError(f"{self._shown} was replaced while it was read")
        status = _status(exc)
        if status is not None and 500 <= status < 600:
            return BackendUnavailableError(
                f"reading {self._shown}: S3 endpoint unavailable (HTTP {status})"
            )
        if isinstance(exc, concurrent.futures.CancelledError):
            return CommitError(f"reading {self._shown}: the read was cancelled")
        return translate(exc, "reading", self._shown)


def _status(exc: BaseException) -> int | None:
    """The HTTP status of the answer behind an s3fs error (s3fs chains botocore's ClientError,
    whose ``response`` carries it, as ``__cause__``)."""
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if isinstance(status, int):
        return status
    code = str(response.get("Error", {}).get("Code", ""))
    return 412 if code == "PreconditionFailed" else None


def _precondition_failed(exc: BaseException) -> bool:
    """A 412: ``If-Match`` did not hold (s3fs folds it into ``OSError(EINVAL)``)."""
    return _status(exc) == 412
