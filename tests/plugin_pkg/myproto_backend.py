"""``myproto:///path``: a third-party commitstore backend (the local POSIX one, renamed)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from commitstore import ConfigurationError
from commitstore.backends import take_options
from commitstore.backends.rename.posix import LocalBackend


class MyprotoBackend(LocalBackend):
    """A local folder, published by rename; only the strategy name is its own."""

    strategy = "myproto-rename"


def factory(url: str, options: dict[str, Any]) -> MyprotoBackend:
    """``myproto:///absolute/path`` -> the folder ``/absolute/path``; takes no options."""
    take_options(options, {})
    parsed = urlsplit(url)
    if parsed.scheme != "myproto" or parsed.netloc or not parsed.path.startswith("/"):
        raise ConfigurationError(f"myproto URLs look like myproto:///absolute/path, not {url!r}")
    return MyprotoBackend(unquote(parsed.path), reason="myproto:// URL (plugin, local rename)")
