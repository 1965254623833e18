"""One measured operation in a fresh process, so its peak RSS is its own.

``python -m benchmarks.worker OP PATH SIZE`` prints ``{"seconds": ..., "maxrss_kib": ...}``.
OPs: ``naive_write`` (write the final name + fsync, no staging, no hash: the unsafe baseline),
``stage_commit`` (commitstore ``stage()`` + commit), ``plain_read`` (read the file to the end),
``verify_full`` (``verify(name, level="full")``).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

from commitstore import open_store

CHUNK = 4 * 1024 * 1024


def _block() -> bytes:
    return os.urandom(CHUNK)


def naive_write(path: Path, size: int) -> None:
    block = _block()
    with open(path, "wb") as f:
        for _ in range(size // CHUNK):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def stage_commit(path: Path, size: int) -> None:
    block = _block()
    store = open_store(path.parent)
    with store.stage(path.name, overwrite=True) as st:
        for _ in range(size // CHUNK):
            st.write(block)


def stage_commit_no_writeback(path: Path, size: int) -> None:
    """``stage_commit`` without early writeback (isolates what sync_file_range buys)."""
    from commitstore.backends import local

    local.WRITEBACK_EVERY = 1 << 62
    stage_commit(path, size)


def plain_read(path: Path, size: int) -> None:
    buf = bytearray(8 * 1024 * 1024)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def verify_full(path: Path, size: int) -> None:
    report = open_store(path.parent).verify(path.name, level="full")
    assert report.ok, report


OPS = {
    f.__name__: f
    for f in (naive_write, stage_commit, stage_commit_no_writeback, plain_read, verify_full)
}


def main() -> None:
    op, path, size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    t0 = time.perf_counter()
    OPS[op](path, size)
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "maxrss_kib": rss}))


if __name__ == "__main__":
    main()
