"""moto's S3 server, serving one request at a time.

``moto_server`` handles requests on threads, and its conditional writes (``IfNoneMatch="*"``)
are a check-then-set without a lock: two truly simultaneous CompleteMultipartUpload calls can both
pass the check. Real S3 makes the condition atomic. Serialising requests gives moto the same
atomicity, so the tests exercise commitstore's use of the primitive rather than moto's race.

Usage: python -m tests.helpers.moto_serial HOST PORT
"""

from __future__ import annotations

import os
import sys

from moto.server import (  # type: ignore[attr-defined]
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))
    run_simple(
        host,
        port,
        DomainDispatcherApplication(create_backend_app),
        threaded=False,
        use_reloader=False,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
