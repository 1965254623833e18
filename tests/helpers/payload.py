"""Deterministic large payloads, generated chunk by chunk in constant memory."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import xxhash

CHUNK = 4 * 1024 * 1024


def chunks(seed: int, size: int) -> Iterator[bytes]:
    """``size`` bytes in chunks; every chunk distinct (index and seed mixed into a base block)."""
    base = hashlib.shake_256(f"commitstore-{seed}".encode()).digest(CHUNK)
    done = 0
    i = 0
    while done < size:
        n = min(CHUNK, size - done)
        head = f"{seed}:{i}:".encode()
        yield (head + base[len(head) : n]) if n > len(head) else head[:n]
        done += n
        i += 1


def digest(seed: int, size: int) -> str:
    """The xxh3_128 of ``chunks(seed, size)``, computed without commitstore."""
    h = xxhash.xxh3_128()
    for c in chunks(seed, size):
        h.update(c)
    return "xxh3_128:" + h.hexdigest()
