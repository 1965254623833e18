"""Child process: ``put_file`` one local file; used by the resume tests and benchmark.

Usage: python -m tests.helpers.putwriter URL NAME PATH
Store options (JSON) may come in WRITER_STORE_OPTIONS. Prints ``ready`` once the store is open,
``done`` after the commit.
"""

from __future__ import annotations

import json
import os
import sys

from commitstore import open_store


def main() -> None:
    url, name, path = sys.argv[1], sys.argv[2], sys.argv[3]
    store = open_store(url, **json.loads(os.environ.get("WRITER_STORE_OPTIONS", "{}")))
    print("ready", flush=True)
    store.put_file(name, path, overwrite=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
