"""S3 listings (ListObjectsV2) that overlap their pages.

A listing is one request per 1,000 keys, each waiting for the one before it (the next page's
token comes with the previous page). A listing longer than one page is therefore split at the
prefix's first level of folders (one request with ``Delimiter="/"``, when that level fits in one
page), and those folders are listed side by side, at most ``LISTING_CONCURRENCY`` at a time, on
s3fs's event loop: on a remote endpoint the round trips overlap, and on any server the client's
parsing of one page overlaps the server's work on another. A store with training checkpoints
under ``ckpt/`` and its records under ``.commitstore/`` lists as two streams.

Guarantees: the same keys a plain paged listing returns (the first page, then what follows its
last key: the rest of the folder it ends in, the later folders whole, and the first level's own
keys from the delimiter request), sorted by key as S3 orders them.
Like any S3 listing it is no snapshot: a key written or deleted meanwhile may or may not be in it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from commitstore.backends.object.upload import ObjectStat

if TYPE_CHECKING:
    from commitstore.layout import Parts

LISTING_CONCURRENCY = 8
PAGE_KEYS = 1000
"""Keys asked for per page (S3's maximum, and its default)."""
PROBE_KEYS = 1000
"""Entries of the one delimiter request; a prefix with more keys and folders at its first level
is listed page after page (the probe then costs one request, the only one wasted)."""


class _Lister(Protocol):
    async def listing_call(self, parts: Parts, **kwargs: Any) -> dict[str, Any]: ...

    def stat_of(self, entry: dict[str, Any]) -> ObjectStat: ...


async def _all_pages(b: _Lister, parts: Parts, **kwargs: Any) -> list[ObjectStat]:
    out: list[ObjectStat] = []
    kwargs["MaxKeys"] = PAGE_KEYS
    while True:
        page = await b.listing_call(parts, **kwargs)
        out += [b.stat_of(o) for o in page.get("Contents", [])]
        if not page.get("IsTruncated"):
            return out
        kwargs["ContinuationToken"] = page.get("NextContinuationToken")


async def list_prefix(b: _Lister, parts: Parts, prefix: str, limit: int | None) -> list[ObjectStat]:
    """Every object under ``prefix`` (the first ``limit`` only, in one request, with ``limit``)."""
    kwargs: dict[str, Any] = {"Prefix": prefix, "MaxKeys": limit or PAGE_KEYS}
    page = await b.listing_call(parts, **kwargs)
    first = [b.stat_of(o) for o in page.get("Contents", [])]
    if limit:
        return first[:limit]
    if not page.get("IsTruncated"):
        return first
    probe = await b.listing_call(parts, Prefix=prefix, Delimiter="/", MaxKeys=PROBE_KEYS)
    keys = [b.stat_of(o) for o in probe.get("Contents", [])]
    folders = [str(p["Prefix"]) for p in probe.get("CommonPrefixes", [])]
    if probe.get("IsTruncated"):  # a flat folder of many keys: nothing to list side by side
        token = page.get("NextContinuationToken")
        return first + await _all_pages(b, parts, Prefix=prefix, ContinuationToken=token)
    # The first page holds every key up to its last one: keep it, and list only what follows
    # it (the folder it ends in, from there on; the folders after it, whole).
    last = _order(first[-1].key)
    out = first + [o for o in keys if _order(o.key) > last]
    todo: list[dict[str, Any]] = []
    for folder in folders:
        if last.startswith(_order(folder)):
            todo.append({"Prefix": folder, "StartAfter": first[-1].key})
        elif _order(folder) > last:
            todo.append({"Prefix": folder})
    gate = asyncio.Semaphore(LISTING_CONCURRENCY)

    async def one(kwargs: dict[str, Any]) -> list[ObjectStat]:
        async with gate:
            return await _all_pages(b, parts, **kwargs)

    for listed in await asyncio.gather(*(one(kw) for kw in todo)):
        out += listed
    out.sort(key=lambda o: _order(o.key))
    return out


def _order(key: str) -> bytes:
    """S3's order of keys: by their UTF-8 bytes."""
    return key.encode("utf-8", "surrogatepass")
