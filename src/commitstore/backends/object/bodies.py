"""Request bodies of the upload sink that are not a buffer the sink owns: a read-only file over a
buffer (:class:`ViewReader`), and a window over a source file read again by position
(:class:`SourceWindow`), so a copy from a local file sends its bytes without holding them. Both,
and S3's ranged reader (``s3/reads.py``), are a :class:`SeekableBody`."""

from __future__ import annotations

import errno
import io
from typing import Any

from commitstore.backends.base import Rereadable
from commitstore.digest import Hasher
from commitstore.errors import CommitStoreError, IntegrityError


class SeekableBody(io.RawIOBase):
    """A read-only, seekable file of :meth:`_length` bytes whose position is ``_pos``: what the
    bodies and readers of the object backends share. A subclass gives :meth:`read` (and the
    length); :meth:`readinto` is a :meth:`read` copied into the buffer. A seek before the start
    lands at 0, a seek past the end is allowed (the next read is empty), an unknown ``whence``
    is ``OSError(EINVAL)``."""

    _pos = 0

    def _length(self) -> int:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def _origin(self, whence: int) -> int:
        """Where an offset from ``whence`` counts from."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length()}.get(whence)
        if base is None:
            raise OSError(errno.EINVAL, f"invalid whence {whence!r}")
        return base

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = max(0, self._origin(whence) + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class ViewReader(SeekableBody):
    """A seekable, read-only file over a buffer the caller keeps unchanged until the request
    returns, used as a request body.

    aiohttp joins a ``bytes`` body with the request headers (one copy) and asyncio's transport
    keeps what the socket did not take yet (a second copy), so a 64 MiB chunk sent as ``bytes``
    costs three times its size. A file body is streamed in 64 KiB reads instead, and being
    seekable it can be sent again (gcsfs retries; aiohttp re-sends on a redirect status, and GCS
    answers every non-final chunk with 308).
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def _length(self) -> int:
        return self._view.nbytes

    def read(self, size: int | None = -1) -> bytes:
        end = self._view.nbytes if size is None or size < 0 else self._pos + size
        data = bytes(self._view[self._pos : end])
        self._pos += len(data)
        return data


class SourceWindow(SeekableBody):
    """Bytes ``[start, start + length)`` of ``source`` as a seekable, read-only request body,
    read by position each time the request reads (in the HTTP client's small reads), so nothing
    of it is held beyond the read in progress. Seekable: the SDK re-sends it on a retry.

    The bytes served are hashed on the way (xxh3_128, restarted when the body is read again from
    0): :meth:`intact` says whether the last complete reading was ``expected`` (the digest of the
    bytes the sink was given), which holds even against a server that checks no body checksum.
    A read that comes short of the window (the source shrank) raises instead of ending the body
    early (the request would wait for bytes that never come). The error a read raised is kept
    in :attr:`failure`: the HTTP client reports it as a failed connection, the sink reports it
    as what it was."""

    def __init__(
        self, source: Rereadable, start: int, length: int, *, expected: str, shown: str
    ) -> None:
        super().__init__()
        self._source, self._start, self._size = source, start, length
        self._expected, self._shown = expected, shown
        self._pos = 0
        self._hash = Hasher()
        self._next: int | None = 0  # where the next in-order read starts; None: out of order
        self.failure: CommitStoreError | None = None

    def _length(self) -> int:
        return self._size

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._size - self._pos)
        n = left if size is None or size < 0 else min(size, left)
        if not n:
            return b""
        if self._pos == 0:  # read (again) from the start
            self._hash, self._next = Hasher(), 0
        elif self._pos != self._next:
            self._next = None  # not one reading in order: not attested
        try:
            data = self._source.pread(self._start + self._pos, n)
            if len(data) != n:
                raise IntegrityError(
                    f"{self._shown}: the source shrank while it was sent ({len(data)} of {n} "
                    f"bytes at offset {self._start + self._pos}); nothing was published"
                )
        except CommitStoreError as exc:
            self.failure = exc
            raise
        self._pos += n
        if self._next is not None:
            self._hash.update(data)
            self._next = self._pos
        return data

    def intact(self) -> bool:
        """The window was read whole, in order, and its bytes were the ones expected."""
        return self._next == self._size and self._hash.digest() == self._expected


Body = io.BytesIO | SourceWindow
"""What the sink sends: a buffer it owns, or a window over the source it was offered."""
