"""The command line's targets: which URL each ``-o``/``-O`` storage option goes to, and opening
the primary with its mirrors.

Per-target options, as rclone keeps options per remote and ``aws s3 --endpoint-url`` applies to
the one remote side of a copy: ``-o KEY=VALUE`` goes to the primary (the first URL), ``-O
KEY=VALUE`` to every mirror (``sync``'s MIRROR..., ``restore --from``, ``--mirror``), and either
form with a URL prefix, ``-o URL_PREFIX:KEY=VALUE``, goes to every URL of the command line that
starts with that prefix (the key is the text between the prefix's last ``:`` and the first
``=``; option names never hold a ``:``). A prefix that matches no URL is a usage error, before
any I/O.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from commitstore import CommitStore, open_store
from commitstore.errors import ConfigurationError


def option_value(text: str) -> Any:
    """A ``-o KEY=VALUE`` value: a bool, an integer, a finite number, else the text (each
    backend then checks the kind it needs: ``readback=maybe`` stays text and is refused)."""
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


@dataclass(frozen=True, slots=True)
class Option:
    """One storage option of the command line and the URLs it is for."""

    prefix: str | None
    """URL prefix it is scoped to; None: the flag's default targets."""
    key: str
    value: Any


def parse_option(item: str) -> Option:
    """``[URL_PREFIX:]KEY=VALUE`` (ConfigurationError for anything else)."""
    head, sep, value = item.partition("=")
    prefix, colon, key = head.rpartition(":")
    if not sep or not key or (colon and not prefix) or not key.isidentifier():
        raise ConfigurationError(
            f"storage options look like KEY=VALUE or URL_PREFIX:KEY=VALUE, not {item!r}"
        )
    return Option(prefix if colon else None, key, option_value(value))


@dataclass(frozen=True, slots=True)
class TargetOptions:
    """The storage options of each URL of one command line."""

    primary: str
    mirrors: tuple[str, ...]
    for_primary: tuple[Option, ...]
    """``-o``: unscoped ones go to the primary."""
    for_mirrors: tuple[Option, ...]
    """``-O``: unscoped ones go to every mirror."""

    def check(self) -> None:
        """Every scoped option matches at least one URL (ConfigurationError, before any I/O)."""
        urls = (self.primary, *self.mirrors)
        for opt in (*self.for_primary, *self.for_mirrors):
            if opt.prefix is not None and not any(u.startswith(opt.prefix) for u in urls):
                raise ConfigurationError(
                    f"option {opt.prefix}:{opt.key}=... matches none of the URLs "
                    f"({', '.join(urls)})"
                )

    def of(self, url: str, *, primary: bool) -> dict[str, Any]:
        """The options for ``url`` (later ones win, as in a shell's repeated flags)."""
        out: dict[str, Any] = {}
        for opts, default in ((self.for_primary, primary), (self.for_mirrors, not primary)):
            for opt in opts:
                if (opt.prefix is None and default) or (
                    opt.prefix is not None and url.startswith(opt.prefix)
                ):
                    out[opt.key] = opt.value
        return out


def target_options(
    primary: str, mirrors: Sequence[str], raw: Any, raw_mirror: Any
) -> TargetOptions:
    """Parse and check the ``-o`` (``raw``) and ``-O`` (``raw_mirror``) lists of a command."""
    opts = TargetOptions(
        primary,
        tuple(mirrors),
        tuple(parse_option(i) for i in raw or []),
        tuple(parse_option(i) for i in raw_mirror or []),
    )
    opts.check()
    return opts


def local_path(url: str) -> str | None:
    """The folder a local-path or ``file://`` URL names; None for other schemes."""
    if url.startswith("file://"):
        from urllib.parse import unquote, urlsplit

        return unquote(urlsplit(url).path)
    return None if "://" in url else os.path.expanduser(url)


def open_target(
    url: str,
    mirrors: Sequence[str],
    raw_options: Any,
    raw_mirror_options: Any,
    *,
    existing: bool = True,
) -> CommitStore:
    """open_store for ``url`` with its options and each mirror opened with its own (mirrors
    replicate before a command returns). ``existing``: the store must exist already (a mistyped
    path or URL is a usage error; nothing is created)."""
    opts = target_options(url, mirrors, raw_options, raw_mirror_options)
    path = local_path(url)
    if existing and path is not None and not os.path.isdir(path):
        what = "is not a folder" if os.path.exists(path) else "does not exist"
        raise ConfigurationError(f"no store at {url}: {path} {what}")
    opened = [open_store(m, **opts.of(m, primary=False)) for m in mirrors]
    store = open_store(url, mirrors=opened, mirror_mode="sync", **opts.of(url, primary=True))
    if existing and path is None and not store.exists():
        raise ConfigurationError(f"no store at {store.url}: nothing there (nothing was created)")
    return store
