"""Child process: commit one artifact to an object store and stop right after its record is
published, before the commit adds that record to the record cache; the parent SIGKILLs it there.

Usage: python -m tests.helpers.cachekill URL NAME SIZE
Store options (JSON) come in CACHEKILL_STORE_OPTIONS. Prints ``published`` at the stop.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from commitstore import _recordcache, open_store


def _stop_here(*_args: Any, **_kwargs: Any) -> None:
    print("published", flush=True)
    time.sleep(3600)  # the parent kills this process


def main() -> None:
    url, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = open_store(url, **json.loads(os.environ.get("CACHEKILL_STORE_OPTIONS", "{}")))
    _recordcache.note = _stop_here  # the commit's only call of it comes after its record
    store.put_bytes(name, b"k" * size)
    print("not stopped", flush=True)


if __name__ == "__main__":
    main()
