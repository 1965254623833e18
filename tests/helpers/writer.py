"""Child process: commit one large artifact through ``stage()``; used by the crash tests.

Usage: python -m tests.helpers.writer ROOT NAME SEED SIZE
Store options (JSON) may come in WRITER_STORE_OPTIONS. Prints ``ready`` once the stage is open,
``wrote N`` after each chunk, ``done`` after the commit.
"""

from __future__ import annotations

import json
import os
import sys

from commitstore import open_store

from .payload import chunks


def main() -> None:
    root, name, seed, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = open_store(root, **json.loads(os.environ.get("WRITER_STORE_OPTIONS", "{}")))
    with store.stage(name, overwrite=True) as st:
        print("ready", flush=True)
        for c in chunks(seed, size):
            st.write(c)
            print(f"wrote {st.tell()}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
