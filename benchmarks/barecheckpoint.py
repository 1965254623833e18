"""The floor of an asynchronous checkpoint on this machine: the same snapshot and the same bytes
written in the background, with no library (benchmarks only).

:class:`BareCheckpointer` copies a state's tensors into buffers it keeps (the snapshot, on the
caller's thread: as ``save_async`` does) and writes their raw bytes from one background thread
the fastest plain way: ``O_DIRECT`` through one aligned 4 MiB buffer (buffered where the file
system refuses it), then ``fsync``, a rename onto the final name and an ``fsync`` of the folder.
No serialization, no hash, no record. One write in flight: :meth:`save` waits for the previous
one, as ``async_inflight=1`` does. What a loop loses to it is what the I/O itself costs the
compute on this machine.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
from pathlib import Path
from typing import Any

CHUNK = 4 << 20


class BareCheckpointer:
    """Snapshot on the caller's thread, raw write in one background thread."""

    def __init__(self) -> None:
        self._buffers: list[Any] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._last: concurrent.futures.Future[None] | None = None

    def save(self, state: dict[str, Any], path: Path) -> concurrent.futures.Future[None]:
        """Wait for the previous write, copy ``state`` into the kept buffers, queue the write."""
        if self._last is not None:
            self._last.result()
        import torch

        tensors = list(state.values())
        if len(self._buffers) != len(tensors):
            self._buffers = [torch.empty_like(t) for t in tensors]
        for buf, t in zip(self._buffers, tensors, strict=True):
            buf.copy_(t)
        self._last = self._pool.submit(_write, list(self._buffers), path)
        return self._last

    def close(self) -> None:
        """Wait for the last write and stop the thread."""
        if self._last is not None:
            self._last.result()
        self._pool.shutdown()


def _write(buffers: list[Any], path: Path) -> None:
    part = path.with_name(path.name + ".part")
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(part, flags | getattr(os, "O_DIRECT", 0))
    except OSError:
        fd = os.open(part, flags)
    aligned = mmap.mmap(-1, CHUNK)
    try:
        fill = total = 0
        for buf in buffers:
            view = memoryview(buf.numpy()).cast("B")  # released with the tensor it views
            while view.nbytes:
                n = min(CHUNK - fill, view.nbytes)
                aligned[fill : fill + n] = view[:n]
                fill, total, view = fill + n, total + n, view[n:]
                if fill == CHUNK:
                    _write_all(fd, aligned, CHUNK)
                    fill = 0
        if fill:
            aligned[fill:] = bytes(CHUNK - fill)  # padded to the block, cut back below
            _write_all(fd, aligned, CHUNK)
        os.ftruncate(fd, total)
        os.fsync(fd)
    finally:
        os.close(fd)
        aligned.close()
    os.replace(part, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _write_all(fd: int, buf: mmap.mmap, length: int) -> None:
    with memoryview(buf) as whole:
        done = 0
        while done < length:
            done += os.write(fd, whole[done:length])
