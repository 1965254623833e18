"""Child process: ``put_file`` one local file; used by the resume tests and benchmark.

Usage: python -m tests.helpers.putwriter URL NAME PATH
Store options (JSON) may come in WRITER_STORE_OPTIONS. Prints ``ready`` once the store is open,
``done`` after the commit (or ``failed <error type>`` when it raised a commitstore error).

WRITER_PAUSE_AT=N (S3): the writer stops just before it sends part N (parts 1..N-1 landed, its
resume state written), prints ``paused``, and goes on once a line comes on stdin. Its upload's
marker keeps being rewritten meanwhile (the writer is live, only its part sending waits).

WRITER_GCS_AT (GCS; N counts this process's chunk requests, or the chunks a state lists):
``pause-before-chunk:N`` prints ``paused`` just before chunk request N is sent and goes on once
a line comes on stdin; ``kill-after-chunk:N`` SIGKILLs the writer right after chunk request N
was answered (before anything else: its resume state still lists that chunk as in flight);
``pause-at-acked:N`` prints ``paused`` right after the resume state was written saying N chunks
were acknowledged and none is in flight, and waits for a line on stdin (a test SIGKILLs it);
``pause-before-state:N`` prints ``paused`` just before the resume state listing chunk N as in
flight is written (a resumed writer: after it read and checked the state it resumes from) and
goes on once a line comes on stdin.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import threading
from typing import Any

from commitstore import CommitStoreError, open_store


def _pause_at(at: int) -> None:
    from commitstore.backends.object.bodies import Body
    from commitstore.backends.object.s3.upload import S3Upload

    send = S3Upload._send
    once = threading.Event()

    def pausing(self: S3Upload, number: int, body: Body) -> concurrent.futures.Future[Any]:
        if number == at and not once.is_set():
            once.set()
            print("paused", flush=True)
            sys.stdin.readline()
        return send(self, number, body)

    S3Upload._send = pausing  # type: ignore[method-assign]


def _gcs_at(spec: str) -> None:
    import signal

    from commitstore.backends.object.gcs.backend import GcsBackend

    what, _, at = spec.partition(":")
    n = int(at)
    call, upload_small = GcsBackend.call, GcsBackend.upload_small
    chunks = [0]

    def pause() -> None:
        print("paused", flush=True)
        sys.stdin.readline()

    def calling(
        self: GcsBackend, what_: str, parts: Any, method: str, path: str, *a: Any, **kw: Any
    ) -> Any:
        crange = str((kw.get("headers") or {}).get("Content-Range", ""))
        if method != "POST" or not crange.startswith("bytes ") or crange.startswith("bytes */"):
            return call(self, what_, parts, method, path, *a, **kw)
        chunks[0] += 1
        if what == "pause-before-chunk" and chunks[0] == n:
            pause()
        result = call(self, what_, parts, method, path, *a, **kw)
        if what == "kill-after-chunk" and chunks[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    def uploading(self: GcsBackend, parts: Any, key: str, data: bytes, *, create_only: bool) -> Any:
        state = json.loads(data) if tuple(parts[:2]) == (".commitstore", "resume") else None
        acked = -1 if state is None else state["gcs"]["sent"] // state["part_size"]
        listed = -1 if state is None else len(state["gcs"]["crc32c"])
        if what == "pause-before-state" and (listed, acked) == (n, n - 1):
            pause()
        result = upload_small(self, parts, key, data, create_only=create_only)
        if what == "pause-at-acked" and (listed, acked) == (n, n):
            pause()
        return result

    GcsBackend.call = calling  # type: ignore[method-assign,assignment]
    GcsBackend.upload_small = uploading  # type: ignore[method-assign]


def main() -> None:
    url, name, path = sys.argv[1], sys.argv[2], sys.argv[3]
    if os.environ.get("WRITER_PAUSE_AT"):
        _pause_at(int(os.environ["WRITER_PAUSE_AT"]))
    if os.environ.get("WRITER_GCS_AT"):
        _gcs_at(os.environ["WRITER_GCS_AT"])
    store = open_store(url, **json.loads(os.environ.get("WRITER_STORE_OPTIONS", "{}")))
    print("ready", flush=True)
    try:
        store.put_file(name, path, overwrite=True)
    except CommitStoreError as exc:
        print(f"failed {type(exc).__name__}: {exc}", flush=True)
        sys.exit(1)
    print("done", flush=True)


if __name__ == "__main__":
    main()
