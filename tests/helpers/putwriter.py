"""Child process: ``put_file`` one local file; used by the resume tests and benchmark.

Usage: python -m tests.helpers.putwriter URL NAME PATH
Store options (JSON) may come in WRITER_STORE_OPTIONS. Prints ``ready`` once the store is open,
``done`` after the commit (or ``failed <error type>`` when it raised a commitstore error).

WRITER_PAUSE_AT=N (S3): the writer stops just before it sends part N (parts 1..N-1 landed, its
resume state written), prints ``paused``, and goes on once a line comes on stdin. Its upload's
marker keeps being rewritten meanwhile (the writer is live, only its part sending waits).
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


def main() -> None:
    url, name, path = sys.argv[1], sys.argv[2], sys.argv[3]
    if os.environ.get("WRITER_PAUSE_AT"):
        _pause_at(int(os.environ["WRITER_PAUSE_AT"]))
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
