"""A faster timestamp parser for botocore's responses.

botocore parses every timestamp of a response (each key's ``LastModified`` in a listing) with
``dateutil``'s general parser: most of the client's CPU time in a listing of many keys. S3 sends
them as ISO 8601 (``2026-12-01T17:13:04.000Z``), which :meth:`datetime.fromisoformat` parses
directly; anything else (RFC 822 dates in headers, epoch numbers) goes to botocore's own parser.

Guarantee: the same instant botocore's parser returns, as an aware datetime (UTC for ``Z``).
"""

from __future__ import annotations

import datetime
from typing import Any

from botocore.utils import parse_timestamp as _botocore_parse


def parse_timestamp(value: Any) -> datetime.datetime:
    """``value`` as an aware datetime: ISO 8601 with a zone directly, else botocore's parser."""
    if isinstance(value, str) and len(value) >= 20 and value[10:11] == "T":
        try:
            parsed = datetime.datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed
    result: datetime.datetime = _botocore_parse(value)
    return result


def fast_session() -> Any:
    """An aiobotocore session whose clients parse timestamps with :func:`parse_timestamp`."""
    import aiobotocore.session

    session = aiobotocore.session.AioSession()
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_timestamp
    )
    session.register("before-send.s3", _no_expect_continue)
    return session


def _no_expect_continue(request: Any, **_: Any) -> None:
    """Send every body without ``Expect: 100-continue`` (botocore adds it to file-like bodies).

    The HTTP client waits for the ``100 Continue`` with no timeout at all: an endpoint that
    accepts the connection and never answers (a hung gateway) held a PutObject or UploadPart,
    and so a commit or a mirror copy, forever, whatever ``read_timeout`` said. Without the
    header the body is sent at once and the answer is awaited under ``read_timeout``. The
    header is not signed, so dropping it here, just before sending, is safe."""
    request.headers.pop("Expect", None)
