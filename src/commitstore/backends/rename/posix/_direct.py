"""Direct I/O for large local staging files: the bytes go from a ring of page-aligned buffers
to the device (``O_DIRECT``), past the page cache, while the caller fills the next buffer.

A buffered write copies every byte into the page cache, and the kernel then writes the dirty
pages back at its own pace (throttling the writer when they pile up): on a shared machine the
same 1 GiB commit then takes anywhere between a fraction and several times what the device
needs. ``O_DIRECT`` writes are the device's own limit (what ``dd oflag=direct`` measures), and
with more than one buffer the copy and the hash of the next bytes overlap the device write of
the previous ones (``os.pwrite`` releases the GIL): :data:`DEPTH` worker threads per staging
file take the full buffers in order and write each at its own offset, so up to ``DEPTH`` writes
are in flight at once (a queue depth, as ``fio --iodepth``; ``dd`` keeps one), and the next one
is already queued when one returns: the device waits neither for the caller nor for a thread
hand-over.

What does not change: the staging file gets exactly the bytes given, in order; the file is
fsynced (metadata and the device cache) before anything is published: by the worker after the
last write (``start_sync``, waited for in ``posix.LocalBackend.finish``) or by ``finish``; a
failed write (EIO, ENOSPC) raises OSError from a later ``write`` (at the latest the one that
needs its buffer again) or from ``flush`` in the caller's thread, so the sink translates and
aborts as for a buffered write; the writes queued after a failed one are never made (the file
is discarded).

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
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

BUFFER = 4 * 1024 * 1024
"""Each aligned buffer (a multiple of :data:`ALIGN`)."""
BUFFERS = 4
"""Buffers in the ring (16 MiB in all): while the workers write up to :data:`DEPTH` of them, the
others wait in their queue and the caller fills the last, so a caller held up (hashing, a
descheduled thread) for a write's time leaves the device no gap."""
DEPTH = 2
"""Worker threads per staging file, each writing one buffer at a time at its offset: the writes
in flight at once (at most ``BUFFERS - 1``: one buffer is always the caller's)."""
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
    :data:`ALIGN`, ``O_DIRECT`` already set) through a ring of :data:`BUFFERS` aligned buffers
    and :data:`DEPTH` worker threads.

    :meth:`write` copies into the buffer being filled and queues a full one for the workers
    with its offset in the file, after the write that last used the buffer finished (its
    error, or any earlier write's, is raised here); the workers take queued buffers in order,
    so a write starts as soon as a worker is free. :meth:`flush` writes what is left (the
    unaligned tail buffered, once every earlier write returned) and waits; :meth:`start_sync`
    queues the same and an fsync without waiting (flush then waits for both); :meth:`close`
    stops the workers, whatever state they are in (an abort), and frees the buffers. Not
    thread-safe (one stage, one writer).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.direct = True
        self._bufs = [mmap.mmap(-1, BUFFER) for _ in range(BUFFERS)]
        self._fill = 0
        self._used = 0
        self._pending: list[Future[None] | None] = [None] * BUFFERS
        self._switch = threading.Lock()
        """Held while a worker turns O_DIRECT off (:meth:`_buffered`)."""
        self._failed = False
        """Set by the worker when a write failed: the writes queued after it are skipped (the
        caller raises that write's error and the staging file is discarded)."""
        self._offset = os.lseek(fd, 0, os.SEEK_CUR)
        """Where the next full buffer goes in the file (each write is made at its offset)."""
        self._pool = SerialWorker("commitstore-direct", threads=max(1, min(DEPTH, BUFFERS - 1)))
        self._closed = False
        self._rest: Future[None] | None = None
        """The tail's writes (and the fsync, after :meth:`start_sync`), queued last."""
        self.synced = False
        """True once the worker fsynced the file (:meth:`start_sync`, then :meth:`flush`)."""

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

    def start_sync(self) -> None:
        """Queue the rest and an ``fsync`` behind the writes: the worker writes the tail and
        syncs the file while the caller goes on (the pending record); :meth:`flush` waits for
        it and raises what it met, and :attr:`synced` is then True. Nothing more may be taken."""
        self._queue_rest(sync=True)

    def flush(self) -> None:
        """Write everything taken and wait; O_DIRECT is off afterwards (the tail is buffered).
        After :meth:`start_sync`: wait for it, its fsync included. The first failed write's
        error is raised (the writes are waited for oldest first)."""
        self._queue_rest(sync=False)
        self._wait_all()
        assert self._rest is not None
        self._rest.result()

    def _queue_rest(self, *, sync: bool) -> None:
        if self._rest is None:
            before = [p for p in self._pending if p is not None]
            self._rest = self._pool.submit(
                self._finish, self._fill, self._used, self._offset, before, sync
            )
            self._used = 0

    def _finish(
        self, tail: int, used: int, offset: int, before: list[Future[None]], sync: bool
    ) -> None:
        """In a worker, once the writes queued ``before`` it have returned (in the other
        workers: they were taken first): the aligned head of buffer ``tail`` direct at
        ``offset``, O_DIRECT off, the rest of it buffered, the descriptor's offset at the end
        of the file, then (``sync``) ``fsync``."""
        for fut in before:
            with contextlib.suppress(BaseException):  # its error is the caller's to raise
                fut.result()
        aligned = used - used % ALIGN
        if aligned:
            self._write(self._bufs[tail], aligned, offset)
        elif self._failed:
            raise OSError(errno.ECANCELED, "an earlier write of this file failed")
        try:
            self._buffered()
            _write_all(self.fd, self._bufs[tail], aligned, used, offset + aligned)
            os.lseek(self.fd, offset + used, os.SEEK_SET)
            if sync:
                os.fsync(self.fd)
                self.synced = True
        except BaseException:
            self._failed = True
            raise

    def close(self) -> None:
        """Stop the worker and free the buffers. Idempotent. After :meth:`flush` (nothing in
        flight) the worker frees them on its way out and the caller does not wait: unmapping
        16 MiB the device wrote from takes milliseconds, and the commit's syncs need not wait
        for it. Otherwise (an abort) the write in flight is waited for (its error dropped, the
        writes queued behind it skipped), so no write can reach the descriptor once the
        caller closes it, and the worker thread has ended when this returns (a failed stage
        leaves no thread behind, whether or not its writes were all done)."""
        if self._closed:
            return
        self._closed = True
        flushed = not self._failed and self._rest is not None and self._rest.done()
        self._failed = True  # what is still queued is not written
        if flushed and all(p is None or p.done() for p in self._pending):
            self._pool.submit(self._free)
            self._pool.shutdown(wait=False)
        else:
            self._pool.shutdown(wait=True)
            self._free()
        self._pending = [None] * BUFFERS

    def _free(self) -> None:
        for buf in self._bufs:
            with contextlib.suppress(BufferError):  # a view still held: freed with it
                buf.close()

    def _submit(self, length: int) -> None:
        """Queue the buffer being filled; then wait until the next one is free again (the
        write that used it last has returned) and raise the first failed write's error."""
        buf = self._bufs[self._fill]
        self._pending[self._fill] = self._pool.submit(self._write, buf, length, self._offset)
        self._offset += length
        self._fill = (self._fill + 1) % BUFFERS
        self._used = 0
        if self._failed:
            self._wait_all()
        self._wait(self._fill)

    def _wait(self, index: int) -> None:
        pending, self._pending[index] = self._pending[index], None
        if pending is not None:
            pending.result()

    def _wait_all(self) -> None:
        """Wait for every queued write, oldest first (the first error is raised)."""
        for i in range(BUFFERS):
            self._wait((self._fill + i) % BUFFERS)

    def _write(self, buf: mmap.mmap, length: int, offset: int) -> None:
        """In a worker: write ``buf[:length]`` at ``offset`` of the file, falling back to buffered
        writes when the filesystem refuses direct ones or one comes back short. (Slices of the
        buffer are only ever temporaries: a traceback keeping this frame holds no view of it,
        so the buffer can still be closed.)"""
        if self._failed:
            raise OSError(errno.ECANCELED, "an earlier write of this file failed")
        try:
            self._write_direct(buf, length, offset)
        except BaseException:
            self._failed = True
            raise

    def _write_direct(self, buf: mmap.mmap, length: int, offset: int) -> None:
        done = 0
        with memoryview(buf) as whole:
            while done < length:
                direct = self.direct  # how this write is made (another worker may switch)
                try:
                    n = os.pwrite(self.fd, whole[done:length], offset + done)
                except OSError as exc:
                    if exc.errno != errno.EINVAL or not direct:
                        raise
                    self._buffered()  # the filesystem takes no direct writes after all
                    continue
                if done + n < length and self.direct:
                    self._buffered()  # the offset is no longer aligned
                done += n

    def _buffered(self) -> None:
        """Switch the file to buffered writes, once (in a worker, while the caller waits or
        fills another buffer). Another worker's direct write in flight may then still fail
        with EINVAL: it is made again, buffered, at its own offset."""
        with self._switch:
            if self.direct:
                set_direct(self.fd, False)
                self.direct = False


_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class SerialWorker:
    """One thread running submitted calls in order (or ``threads`` threads taking them in
    order), each with its :class:`Future`: what a ``ThreadPoolExecutor`` gives, without its
    dependence on interpreter state. An
    executor refuses new work once interpreter shutdown begins ("cannot schedule new futures
    after interpreter shutdown"), which made every copy to a local mirror made by the exit
    flush fail at once; this worker takes work until :meth:`shutdown`, whenever that is. The
    thread is a daemon: a writer left open never holds the interpreter's exit."""

    def __init__(self, name: str, *, threads: int = 1) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None
        ]
        self._jobs = queue.SimpleQueue()
        self._stopped = False
        self._threads = {
            threading.Thread(target=self._run, name=f"{name}_{i}", daemon=True)
            for i in range(threads)
        }
        """The worker threads (a set, as ``ThreadPoolExecutor`` names them)."""
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` once every call submitted before it has started (with one thread:
        after it has returned)."""
        if self._stopped:
            raise RuntimeError("the direct writer's worker was shut down")
        fut: Future[Any] = Future()
        self._jobs.put((fut, fn, args))
        return fut

    def shutdown(self, *, wait: bool) -> None:
        """Stop after the calls already submitted; ``wait``: until the thread has ended."""
        if not self._stopped:
            self._stopped = True
            for _thread in self._threads:
                self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(result)
            del job, fut, fn, args  # no reference to a buffer outlives its call


def _write_all(fd: int, buf: mmap.mmap, start: int, end: int, offset: int) -> None:
    """Write ``buf[start:end]`` (buffered) at ``offset`` of the file, slices only as
    temporaries (see ``_write``)."""
    with memoryview(buf) as whole:
        while start < end:
            n = os.pwrite(fd, whole[start:end], offset)
            start, offset = start + n, offset + n
