"""Direct I/O for large local staging files: the bytes go from two page-aligned buffers to the
device (``O_DIRECT``), past the page cache, while the caller fills the other buffer.

A buffered write copies every byte into the page cache, and the kernel then writes the dirty
pages back at its own pace (throttling the writer when they pile up): on a shared machine the
same 1 GiB commit then takes anywhere between a fraction and several times what the device
needs. ``O_DIRECT`` writes are the device's own limit (what ``dd oflag=direct`` measures), and
with a second buffer the copy and the hash of the next bytes overlap the device write of the
previous ones (``os.write`` releases the GIL): one worker thread per staging file writes, and
at most one write is in flight.

What does not change: the staging file gets exactly the bytes given, in order; ``finish``
(``posix.LocalBackend.finish``) still fsyncs it (metadata and the device cache) before anything
is published; a failed write (EIO, ENOSPC) raises OSError from the next ``write`` or from
``flush`` in the caller's thread, so the sink translates and aborts as for a buffered write.

Fallbacks (the file keeps being written, buffered): the filesystem refuses ``O_DIRECT`` (EINVAL
from ``fcntl`` or from the first direct write, which is then written buffered), or a direct
write is short (the rest is written buffered). The tail that is not a multiple of
:data:`ALIGN` is written buffered after ``O_DIRECT`` is cleared.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor

BUFFER = 8 * 1024 * 1024
"""Each of the two aligned buffers (a multiple of :data:`ALIGN`)."""
ALIGN = 4096
"""Offsets and lengths of direct writes are multiples of this (the largest common logical block
size; ``mmap`` buffers are page-aligned)."""


def set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; False when the filesystem refuses (EINVAL)."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    want = flags | os.O_DIRECT if on else flags & ~os.O_DIRECT
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, want)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    return True


class DirectWriter:
    """Writes the rest of a staging file opened on ``fd`` (its offset a multiple of
    :data:`ALIGN`, ``O_DIRECT`` already set) through two aligned buffers and one worker thread.

    :meth:`write` copies into the buffer being filled and hands a full one to the worker (after
    the previous write finished: its error, if any, is raised here); :meth:`flush` writes what
    is left (the unaligned tail buffered) and waits; :meth:`close` stops the worker, whatever
    state it is in (an abort), and frees the buffers. Not thread-safe (one stage, one writer).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.direct = True
        self._bufs = [mmap.mmap(-1, BUFFER), mmap.mmap(-1, BUFFER)]
        self._fill = 0
        self._used = 0
        self._pending: Future[None] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="commitstore-direct")

    def write(self, data: memoryview) -> int:
        """Take all of ``data`` (copied); bytes taken."""
        view, total = data, data.nbytes
        while view.nbytes:
            buf = self._bufs[self._fill]
            n = min(BUFFER - self._used, view.nbytes)
            buf[self._used : self._used + n] = view[:n]
            self._used += n
            view = view[n:]
            if self._used == BUFFER:
                self._submit(BUFFER)
        return total

    def flush(self) -> None:
        """Write everything taken and wait; O_DIRECT is off afterwards (the tail is buffered)."""
        used = self._used
        aligned = used - used % ALIGN
        tail = self._bufs[self._fill]  # its aligned head goes direct, the rest buffered after
        if aligned:
            self._submit(aligned)
        self._wait()
        if self.direct:
            set_direct(self.fd, False)
            self.direct = False
        _write_all(self.fd, tail, aligned, used)
        self._used = 0

    def close(self) -> None:
        """Stop the worker (waiting for a write in flight, its error dropped) and free the
        buffers. Idempotent."""
        self._pool.shutdown(wait=True)
        self._pending = None
        for buf in self._bufs:
            with contextlib.suppress(BufferError):  # a view still held: freed with it
                buf.close()

    def _submit(self, length: int) -> None:
        self._wait()
        self._pending = self._pool.submit(self._write, self._bufs[self._fill], length)
        self._fill ^= 1
        self._used = 0

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _write(self, buf: mmap.mmap, length: int) -> None:
        """In the worker: write ``buf[:length]`` at the file's offset, falling back to buffered
        writes when the filesystem refuses direct ones or one comes back short. (Slices of the
        buffer are only ever temporaries: a traceback keeping this frame holds no view of it,
        so the buffer can still be closed.)"""
        done = 0
        with memoryview(buf) as whole:
            while done < length:
                try:
                    n = os.write(self.fd, whole[done:length])
                except OSError as exc:
                    if exc.errno != errno.EINVAL or not self.direct:
                        raise
                    self._buffered()  # the filesystem takes no direct writes after all
                    continue
                if done + n < length and self.direct:
                    self._buffered()  # the offset is no longer aligned
                done += n

    def _buffered(self) -> None:
        """(In the worker, while the caller waits or fills the other buffer.)"""
        set_direct(self.fd, False)
        self.direct = False


def _write_all(fd: int, buf: mmap.mmap, start: int, end: int) -> None:
    """Write ``buf[start:end]`` (buffered), slices only as temporaries (see ``_write``)."""
    with memoryview(buf) as whole:
        while start < end:
            start += os.write(fd, whole[start:end])
