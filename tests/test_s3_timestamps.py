"""The S3 client's timestamp parser (``backends/object/s3/timestamps.py``): the same instants as
botocore's own parser for every format S3-compatible servers send, and the one a real listing's
times go through."""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.utils import parse_timestamp as botocore_parse

from commitstore import open_store
from commitstore.backends.object.s3.timestamps import parse_timestamp

from .helpers.s3servers import BUCKET, MotoServer

SAMPLES = [
    "2026-12-01T17:13:04.000Z",
    "2026-12-01T17:13:04Z",
    "2026-12-01T17:13:04.123456Z",
    "2026-12-01T17:13:04.5+02:00",
    "2026-02-28T23:59:59.999-05:30",
    "2026-12-01T17:13:04",  # no zone: botocore's rule (local/UTC), not ours
    "Tue, 01 Dec 2026 17:13:04 GMT",
    "1764609184",
    1764609184,
    1764609184.25,
]


@pytest.mark.parametrize("value", SAMPLES, ids=[repr(v) for v in SAMPLES])
def test_same_instant_as_botocore(value: Any) -> None:
    ours, theirs = parse_timestamp(value), botocore_parse(value)
    assert (ours.tzinfo is None) == (theirs.tzinfo is None)
    assert ours.timestamp() == theirs.timestamp()


def test_malformed_iso_goes_to_botocore_and_fails_the_same_way() -> None:
    with pytest.raises(ValueError):
        botocore_parse("2026-13-45T99:99:99Z")
    with pytest.raises(ValueError):
        parse_timestamp("2026-13-45T99:99:99Z")


def test_the_store_client_parses_with_it_and_listing_times_are_right(moto: MotoServer) -> None:
    prefix = f"ts{time.monotonic_ns()}"
    client = moto.client()
    for i in range(3):
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/f{i}", Body=b"x")
    backend: Any = open_store(f"s3://{BUCKET}/{prefix}", **moto.options())._backend
    listed = backend.list_objects(())
    truth = {
        o["Key"]: o["LastModified"].timestamp()
        for o in client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")["Contents"]
    }
    assert {o.key: o.mtime for o in listed} == truth
    # the parser the client's endpoint makes for each response is ours
    factory = backend.fs.s3._endpoint._response_parser_factory
    assert factory.create_parser("rest-xml")._timestamp_parser is parse_timestamp
