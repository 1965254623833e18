"""Content digests: xxh3_128, written as ``"xxh3_128:<32 hex>"``.

Folder artifacts get one digest over a canonical manifest of their files (see ``docs/format.md``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

import xxhash

ALGORITHM = "xxh3_128"
_HEX32 = re.compile("[0-9a-f]{32}")
READ_CHUNK = 8 * 1024 * 1024
FIRST_READ = 64 * 1024
"""The first read of :func:`hash_stream`; later ones double up to its ``chunk``."""


class Hasher:
    """Streaming xxh3_128 that also counts the bytes it has seen."""

    __slots__ = ("_h", "count")

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()
        self.count = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)
        self.count += len(data) if not isinstance(data, memoryview) else data.nbytes

    def digest(self) -> str:
        return f"{ALGORITHM}:{self._h.hexdigest()}"


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """Digest of an in-memory buffer."""
    return f"{ALGORITHM}:{xxhash.xxh3_128_hexdigest(data)}"


def hash_stream(stream: BinaryIO, *, chunk: int = READ_CHUNK) -> tuple[int, str]:
    """Read ``stream`` to its end; return (bytes read, digest). Constant memory: the read
    buffer starts small (a scan hashes many small files, and zeroing ``chunk`` bytes for each
    costs more than hashing them) and doubles up to ``chunk`` while reads fill it."""
    h = Hasher()
    view = memoryview(bytearray(min(chunk, FIRST_READ)))
    readinto = getattr(stream, "readinto", None)
    while True:
        if readinto is not None:
            n = readinto(view)
            if not n:
                break
            h.update(view[:n])
            if n == len(view) and n < chunk:
                view = memoryview(bytearray(min(chunk, 2 * n)))
        else:
            data = stream.read(chunk)
            if not data:
                break
            h.update(data)
    return h.count, h.digest()


def hash_opened(stream: BinaryIO) -> tuple[int, str]:
    """:func:`hash_stream` of a stream just opened, unless it can hash itself whole without
    being read through a buffer: a local file hashed from the page cache (its raw file's
    ``whole_digest``, which may decline with None). The same (bytes, digest) either way."""
    raw = getattr(stream, "raw", stream)
    whole = getattr(raw, "whole_digest", None)
    if whole is not None and stream.tell() == 0:
        result: tuple[int, str] | None = whole()
        if result is not None:
            return result
    return hash_stream(stream)


def copy_hashed(
    src: BinaryIO,
    write: Callable[[memoryview], object],
    *,
    progress: Callable[[int], None] | None = None,
    start: int = 0,
    chunk_size: int = READ_CHUNK,
) -> tuple[int, str]:
    """Copy ``src`` to ``write`` in constant memory (one ``chunk_size`` buffer), hashing on the
    way (one pass).

    Returns (bytes copied, digest); ``progress`` gets ``start`` + the running count.
    """
    h = Hasher()
    for chunk in read_chunks(src, chunk_size):
        h.update(chunk)
        write(chunk)
        if progress is not None:
            progress(start + h.count)
    return h.count, h.digest()


def copy_chunks(
    src: BinaryIO,
    write: Callable[[memoryview], object],
    *,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Copy ``src`` to ``write`` in constant memory (no hashing: the writer hashes, e.g. a
    stage); ``progress`` gets the running count. Returns the bytes copied."""
    total = 0
    for chunk in read_chunks(src):
        write(chunk)
        total += chunk.nbytes
        if progress is not None:
            progress(total)
    return total


def read_chunks(src: BinaryIO, chunk: int = READ_CHUNK) -> Iterator[memoryview]:
    """``src`` to its end in views of one reused buffer (no allocation per chunk): each view is
    valid until the next one is taken, so consumers must copy or consume it at once (as every
    sink's ``write`` does)."""
    readinto = getattr(src, "readinto", None)
    if readinto is None:
        while data := src.read(chunk):
            yield memoryview(data)
        return
    view = memoryview(bytearray(chunk))  # (not released here: a caller may hold the last view)
    while n := readinto(view):
        yield view[:n]


def manifest_digest(files: Iterable[tuple[str, int, str]]) -> str:
    """Folder digest: xxh3_128 over ``path\\tsize\\tdigest\\n`` lines sorted by path."""
    h = xxhash.xxh3_128()
    for path, size, digest in sorted(files):
        h.update(f"{path}\t{size}\t{digest}\n".encode())
    return f"{ALGORITHM}:{h.hexdigest()}"


def is_valid_digest(value: object) -> bool:
    """True for ``"xxh3_128:"`` followed by 32 lowercase hex digits."""
    if not isinstance(value, str) or not value.startswith(ALGORITHM + ":"):
        return False
    return _HEX32.fullmatch(value, len(ALGORITHM) + 1) is not None
