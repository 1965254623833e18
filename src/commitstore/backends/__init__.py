"""The strategy table: which backend (commit strategy) serves which URL, chosen in one place.

=========================  ==================  ==============================================
URL                        strategy            commit point
=========================  ==================  ==============================================
``/path``, ``file://...``  ``local-rename``    fsync file, rename (no-replace or replace),
                                               fsync directory
``memory://...``           ``memory-swap``     one swap into the store under a lock
=========================  ==================  ==============================================

Network shares and object stores add rows here; the facade never looks at URL schemes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import InvalidNameError
from ._base import Backend, Capabilities, CommitInfo, DirSink, FileInfo, FileSink
from .local import LocalBackend
from .memory import MemoryBackend

__all__ = [
    "STRATEGIES",
    "Backend",
    "Capabilities",
    "CommitInfo",
    "DirSink",
    "FileInfo",
    "FileSink",
    "resolve",
]


def _local(url: str, options: dict[str, Any]) -> Backend:
    if url.startswith("file://"):
        parsed = urlsplit(url)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidNameError(f"file:// URL with a remote host is not supported: {url!r}")
        path = unquote(parsed.path)
        return LocalBackend(path, reason="file:// URL")
    return LocalBackend(os.path.expanduser(url), reason="plain local path")


def _memory(url: str, options: dict[str, Any]) -> Backend:
    return MemoryBackend(url[len("memory://") :])


STRATEGIES: dict[str, Callable[[str, dict[str, Any]], Backend]] = {
    "": _local,
    "file": _local,
    "memory": _memory,
}
"""URL scheme -> backend factory. The one table every store is chosen from."""


def resolve(url: str | os.PathLike[str], options: dict[str, Any]) -> Backend:
    """Pick the backend for ``url`` from :data:`STRATEGIES`.

    Raises:
        InvalidNameError: unknown scheme (with the list of known ones), before any I/O.
    """
    text = os.fspath(url)
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    factory = STRATEGIES.get(scheme)
    if factory is None:
        known = ", ".join(f"{s}://" for s in sorted(STRATEGIES) if s)
        raise InvalidNameError(f"no commit strategy for {scheme}:// URLs (known: {known})")
    return factory(text, dict(options))
