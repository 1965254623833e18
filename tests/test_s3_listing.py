"""S3 listings that list a prefix's folders side by side (``backends/object/s3/listing.py``): the
same keys as boto3's paged listing, in S3's order, with the folders' pages overlapped. Pages of
three keys (``PAGE_KEYS``) so a few dozen objects make many pages."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from commitstore import open_store
from commitstore.backends.object.s3 import listing as s3list

from .helpers.s3servers import BUCKET, MotoServer

KEYS = [
    *(f"ckpt/step_{i:03d}.pt" for i in range(14)),
    *(f".commitstore/records/ckpt/step_{i:03d}.pt.json" for i in range(11)),
    ".commitstore/cache/records/0a.json.gz",
    "top-level-a",
    "top-level-b",
    "empty/",
    "deep/er/still/x",
    "unicode/é/ü",
    "unicode/z",
]


def _boto_keys(moto: MotoServer, prefix: str) -> list[str]:
    client = moto.client()
    out: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


@pytest.fixture
def seeded(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    monkeypatch.setattr(s3list, "PAGE_KEYS", 3)
    prefix = f"listing{time.monotonic_ns()}"
    client = moto.client()
    for key in KEYS:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=key.encode())
    return open_store(f"s3://{BUCKET}/{prefix}", **moto.options())._backend, prefix


def _watch(backend: Any) -> dict[str, Any]:
    """Count listing requests and the most in flight at once."""
    seen: dict[str, Any] = {"requests": 0, "inflight": 0, "peak": 0, "delimited": 0}
    original = backend.listing_call

    async def watched(parts: Any, **kwargs: Any) -> Any:
        seen["requests"] += 1
        seen["delimited"] += "Delimiter" in kwargs
        seen["inflight"] += 1
        seen["peak"] = max(seen["peak"], seen["inflight"])
        try:
            await asyncio.sleep(0.01)  # hold the slot so overlapping requests are visible
            return await original(parts, **kwargs)
        finally:
            seen["inflight"] -= 1

    backend.listing_call = watched
    return seen


def test_a_long_listing_lists_folders_side_by_side_with_the_same_keys(
    seeded: tuple[Any, str], moto: MotoServer
) -> None:
    backend, prefix = seeded
    seen = _watch(backend)
    got = [o.key for o in backend.list_objects(())]
    assert got == _boto_keys(moto, f"{prefix}/"), "same keys, same (S3) order"
    assert seen["delimited"] >= 1, "the long listing was split at its folders"
    assert seen["peak"] >= 2, "folder listings overlapped"
    assert seen["peak"] <= s3list.LISTING_CONCURRENCY
    walked = {"/".join(rel) for rel, _info in backend.walk(())}
    assert walked == {k for k in KEYS if not k.endswith("/")}


def test_a_listing_of_one_page_makes_one_request(moto: MotoServer) -> None:
    prefix = f"short{time.monotonic_ns()}"
    moto.client().put_object(Bucket=BUCKET, Key=f"{prefix}/a/b", Body=b"x")
    backend: Any = open_store(f"s3://{BUCKET}/{prefix}", **moto.options())._backend
    seen = _watch(backend)
    assert [o.key for o in backend.list_objects(())] == [f"{prefix}/a/b"]
    assert seen["requests"] == 1 and seen["delimited"] == 0


def test_one_folder_goes_on_from_the_first_page(seeded: tuple[Any, str], moto: MotoServer) -> None:
    backend, prefix = seeded
    seen = _watch(backend)
    got = [o.key for o in backend.list_objects(("ckpt",))]
    assert got == _boto_keys(moto, f"{prefix}/ckpt/")
    # the first page of 3, then the delimiter request: all 14 keys, no folder to list
    assert (seen["requests"], seen["delimited"]) == (2, 1)


def test_a_single_folder_is_not_listed_again(seeded: tuple[Any, str], moto: MotoServer) -> None:
    backend, prefix = seeded
    seen = _watch(backend)
    got = [o.key for o in backend.list_objects((".commitstore", "records"))]
    assert got == _boto_keys(moto, f"{prefix}/.commitstore/records/")
    # 11 keys at 3 a page: the first page, the probe that found the one folder they are in,
    # then that folder from the first page's last key on (3 pages): no key listed twice
    assert (seen["requests"], seen["delimited"], seen["peak"]) == (5, 1, 1)


def test_a_first_level_too_long_for_one_request_is_listed_page_after_page(
    seeded: tuple[Any, str], moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, prefix = seeded
    monkeypatch.setattr(s3list, "PROBE_KEYS", 2)
    seen = _watch(backend)
    assert [o.key for o in backend.list_objects(())] == _boto_keys(moto, f"{prefix}/")
    assert seen["delimited"] == 1 and seen["peak"] == 1


def test_a_limited_listing_is_one_request(seeded: tuple[Any, str]) -> None:
    backend, _prefix = seeded
    seen = _watch(backend)
    got = backend.list_objects((), limit=2)
    assert len(got) == 2 and seen["requests"] == 1
