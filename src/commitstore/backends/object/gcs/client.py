"""gcsfs with deadlines: every request of a GCS store is bounded by the store's
``connect_timeout`` and ``read_timeout`` (an aiohttp ``ClientTimeout`` given to each request:
gcsfs's own default is no timeout at all) and tried at most ``retries`` times in all (gcsfs's
own count, 6, is fixed when its class is defined). What is tried again, and the backoff between
tries, are gcsfs's own (``gcsfs.retry``). Imported only with a ``gs://`` URL."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
from gcsfs.core import GCSFileSystem
from gcsfs.retry import HttpError, is_retriable

# gcsfs's own class, whatever ``gcsfs.GCSFileSystem`` names: from gcsfs 2026.x that is an
# experimental subclass (hierarchical namespaces, probed over gRPC) unless
# GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT is false when gcsfs is first imported, which another import
# in the process may have done before this one
_REQUEST = GCSFileSystem._request.__wrapped__
_GET_FILE_REQUEST = GCSFileSystem._get_file_request.__wrapped__


def client_timeout(connect: float, read: float) -> aiohttp.ClientTimeout:
    """No bound on a whole request (a large chunk may take long to send), ``connect`` seconds
    to open a connection, ``read`` seconds of silence at most while an answer is awaited."""
    return aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)


def _not_found(exc: BaseException) -> bool:
    if isinstance(exc, aiohttp.ClientResponseError) and exc.status == 404:
        return True
    return isinstance(exc, HttpError) and exc.code == 404


class TimedGCSFileSystem(GCSFileSystem):  # type: ignore[misc]
    """A ``GCSFileSystem`` whose requests are tried at most :attr:`attempts` times."""

    attempts: int = 5

    async def _retrying(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(min(random.random() + 2 ** (attempt - 1), 32))
            try:
                return await fn(self, *args, **kwargs)
            except Exception as exc:
                if attempt == self.attempts - 1 or _not_found(exc) or not is_retriable(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover - attempts >= 1

    async def _request(self, *args: Any, **kwargs: Any) -> Any:
        return await self._retrying(_REQUEST, args, kwargs)

    async def _get_file_request(self, *args: Any, **kwargs: Any) -> Any:
        return await self._retrying(_GET_FILE_REQUEST, args, kwargs)
