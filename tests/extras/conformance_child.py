"""The conformance suite inside a venv that has one extra installed (run by tests/test_extras.py).

Imports only commitstore, pytest, hypothesis, the standard library and the extra's own client
library (its backdoor is written against that library, or is the ``os`` one for SMB). The parent
test starts the server and describes it in ``COMMITSTORE_EXTRA`` (smb, s3, gcs, azure, sftp
or webdav) and ``COMMITSTORE_EXTRA_SERVER`` (JSON: ``url`` of the bucket/share, store
``options``, and what the backdoor needs).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from commitstore import CommitStoreError, open_store
from commitstore.testing import (
    AzureBackdoor,
    Backdoor,
    GcsBackdoor,
    LocalBackdoor,
    S3Backdoor,
    StoreConformance,
    Target,
)

EXTRA = os.environ["COMMITSTORE_EXTRA"]
SERVER: dict[str, Any] = json.loads(os.environ["COMMITSTORE_EXTRA_SERVER"])


def botocore_client() -> Any:
    import botocore.session
    from botocore.config import Config

    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=SERVER["endpoint"],
        aws_access_key_id=SERVER["options"]["key"],
        aws_secret_access_key=SERVER["options"]["secret"],
        region_name="us-east-1",
        config=Config(
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def backdoor(prefix: str) -> Backdoor:
    if EXTRA == "smb":
        return LocalBackdoor(Path(SERVER["share_dir"]) / prefix)
    if EXTRA in ("sftp", "webdav"):  # the server's folder on this machine's disk
        return LocalBackdoor(Path(SERVER["root"]) / prefix)
    if EXTRA == "s3":
        return S3Backdoor(botocore_client(), SERVER["bucket"], prefix)
    if EXTRA == "gcs":
        return GcsBackdoor(SERVER["endpoint"], SERVER["bucket"], prefix)
    if EXTRA == "azure":
        from azure.storage.blob import ContainerClient

        conn = SERVER["options"]["connection_string"]
        return AzureBackdoor(
            ContainerClient.from_connection_string(conn, SERVER["container"]), prefix
        )
    raise AssertionError(f"unknown extra {EXTRA!r}")


FLIP_EXAMPLES = 5
"""Examples of the bit-flip property here (25 in the main suite, on every server): what this
run shows is that detection works through this extra alone; which bytes and bits are flipped
does not depend on the extras installed."""


def _with_examples(test: Any, examples: int) -> Any:
    """The Hypothesis test ``test`` with ``examples`` examples (its other settings and its
    strategies kept); ``test`` unchanged where Hypothesis does not expose them."""
    handle: Any = getattr(test, "hypothesis", None)
    strategies = getattr(handle, "_given_kwargs", None)
    base = getattr(test, "_hypothesis_internal_use_settings", None)
    if not strategies or base is None:
        return test
    return settings(base, max_examples=examples)(given(**strategies)(handle.inner_test))


class TestConformance(StoreConformance):
    test_any_bit_flip_detected = _with_examples(
        StoreConformance.test_any_bit_flip_detected, FLIP_EXAMPLES
    )

    @pytest.fixture
    def target(self) -> Target:
        prefix = f"x{os.getpid()}-{time.monotonic_ns()}"
        url, options = f"{SERVER['url']}/{prefix}", SERVER["options"]
        return Target(
            open_store(url, **options), backdoor(prefix), lambda: open_store(url, **options)
        )


class _Refuse(http.server.BaseHTTPRequestHandler):
    """Answers every request with 403, like a credential without the right to write."""

    def _refuse(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b'{"error": {"code": 403, "message": "denied"}}'
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _refuse

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def refusing_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


def _refused_request_is_a_commitstore_error() -> None:
    """A refused request is translated into commitstore's errors with this extra alone (a GCS-only
    install once failed here, its error path importing botocore)."""
    with refusing_server() as endpoint:
        options = dict(SERVER["options"])
        if EXTRA == "azure":
            account = "devstoreaccount1"
            options["connection_string"] = (
                f"DefaultEndpointsProtocol=http;AccountName={account};"
                f"AccountKey={SERVER['account_key']};BlobEndpoint={endpoint}/{account};"
            )
        else:
            options["endpoint_url"] = endpoint
        store = open_store(f"{SERVER['url']}/refused", **options)
        with pytest.raises(CommitStoreError):
            store.put_bytes("step_0001.pt", b"never published")


if EXTRA in ("s3", "gcs", "azure"):  # object stores only: the endpoint_url option
    test_refused_request_is_a_commitstore_error = _refused_request_is_a_commitstore_error
