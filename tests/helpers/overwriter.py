"""Child process: overwrite one folder artifact of a local store on demand.

Usage: python -m tests.helpers.overwriter ROOT NAME
Reads one line per request on stdin. For each, it first probes the store's publish lock
(``.commitstore/lock``, ``docs/format.md``) without waiting: held (a reader is checking under it)
answers ``locked`` and changes nothing; free, it commits the next version of NAME (every file's
bytes differ from the version before) with ``overwrite=True`` and answers ``done N``. The caller
waits for the answer, so nobody can take the lock between the probe and the commit.
"""

from __future__ import annotations

import fcntl
import os
import sys

from commitstore import open_store

FILES = ("a.bin", "b.bin", "sub/c.bin")


def version(n: int) -> dict[str, bytes]:
    """Version ``n`` of the folder: three files, each different in every version."""
    return {rel: f"v{n} {rel} ".encode() * (200 + 37 * i) for i, rel in enumerate(FILES)}


def lock_is_free(root: str) -> bool:
    fd = os.open(os.path.join(root, ".commitstore", "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def main() -> None:
    root, name = sys.argv[1], sys.argv[2]
    store = open_store(root)
    n = 1
    for _line in sys.stdin:
        if not lock_is_free(root):
            print("locked", flush=True)
            continue
        n += 1
        with store.stage_dir(name, overwrite=True) as d:
            for rel, body in version(n).items():
                (d / rel).parent.mkdir(parents=True, exist_ok=True)
                (d / rel).write_bytes(body)
        print(f"done {n}", flush=True)


if __name__ == "__main__":
    main()
