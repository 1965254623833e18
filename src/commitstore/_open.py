"""``open_store``: the one entry point that picks a commit strategy and wires mirrors."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from commitstore._background import check_inflight
from commitstore._commit import check_flag
from commitstore.backends import Backend, resolve
from commitstore.errors import ConfigurationError, NotFoundError
from commitstore.layout import redact_url
from commitstore.maintenance.retention import Retention
from commitstore.mirrors.replicator import check_mirror_options
from commitstore.options import MirrorMode, MirrorPolicy
from commitstore.store import CommitStore

__all__ = ["open_store"]


def open_store(
    url: str | os.PathLike[str],
    *,
    mirrors: Sequence[str | os.PathLike[str] | CommitStore] = (),
    mirror_mode: MirrorMode = "background",
    mirror_policy: MirrorPolicy = "best_effort",
    mirror_queue: int = 8,
    retention: Retention | None = None,
    create: bool = True,
    async_inflight: int = 1,
    **storage_options: Any,
) -> CommitStore:
    """Open the store at ``url`` (a local path or any supported URL), with optional mirrors.

    The commit strategy is chosen from one table by the URL (see ``describe()``).
    ``storage_options`` go to the primary; give a mirror that needs options as a
    :class:`CommitStore`. After each primary commit every mirror receives the artifact through its
    own commit strategy: in the background (``mirror_mode="background"``, at most
    ``mirror_queue`` artifacts queued per mirror, then commits wait) or before ``commit()``
    returns (``"sync"``). ``mirror_policy="required"`` turns a mirror failure into a MirrorError.
    ``retention`` prunes every target after each successful commit (never before it is durable).
    ``async_inflight`` bounds the snapshots of asynchronous commits (``commit_async``,
    ``commitstore.torch.save_async``) that exist at once; a further one waits for a slot.

    Opening and reading create nothing: the first write creates the store's root. A read that
    finds nothing where no root exists warns (``UserWarning`` and a log warning) that the store
    does not exist, so a mistyped URL is not taken for an empty store. ``create=False`` asks
    for an existing store: its root is looked up now (one stat or one listing request).

    Raises:
        ConfigurationError: unknown scheme, option, mode or policy, ``mirrors`` given as one
            URL rather than a list, a ``retention`` that is not a Retention, a ``create`` that
            is not a bool, an ``async_inflight`` outside [1, 64], a missing extra (with the pip
            command), or a mirror that overlaps the primary or another mirror (the same folder
            or bucket prefix, or one inside the other: :func:`check_separate`), before any I/O.
        NotFoundError: ``create=False`` and the store's root does not exist.
    """
    check_mirror_options(mirror_mode, mirror_policy, mirror_queue)
    if isinstance(mirrors, str | bytes | os.PathLike):
        raise ConfigurationError(
            f"mirrors must be a list of URLs or stores, not one URL ({mirrors!r}, which would "
            "be taken as one mirror per character): write mirrors=[url]"
        )
    if retention is not None and not isinstance(retention, Retention):
        raise ConfigurationError(
            f"retention must be a commitstore.Retention or None, not {retention!r}"
        )
    check_flag(create, "create")
    check_inflight(async_inflight)
    backend = resolve(url, storage_options)
    if not create and not backend.root_exists():
        raise NotFoundError(f"no store at {redact_url(os.fspath(url))}: its root does not exist")
    opened = [m if isinstance(m, CommitStore) else open_store(m) for m in mirrors]
    check_separate(backend, redact_url(os.fspath(url)), opened)
    return CommitStore(
        backend,
        url=redact_url(os.fspath(url)),
        mirrors=opened,
        mirror_mode=mirror_mode,
        mirror_policy=mirror_policy,
        mirror_queue=mirror_queue,
        retention=retention,
        async_inflight=async_inflight,
    )


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """True when one place is the other or lies inside it."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def check_separate(primary: Backend, url: str, mirrors: Sequence[CommitStore]) -> None:
    """Raise ConfigurationError when a mirror is the primary, lies inside it or holds it, or
    overlaps another mirror (``Backend.place``: the same local folder, symlinks resolved, or
    the same bucket prefix on the same server): a store's copies would land among its own
    names, where replication, gc and retention of one would reach into the other's."""
    seen: list[tuple[str, tuple[str, ...]]] = []
    own = primary.place()
    if own is not None:
        seen.append((f"the primary {url}", own))
    for m in mirrors:
        place = m._backend.place()
        if place is None:
            continue
        for what, other in seen:
            if _overlap(place, other):
                raise ConfigurationError(
                    f"mirror {m.url} overlaps {what} (the same folder or prefix, or one "
                    "inside the other): a mirror must be a separate store"
                )
        seen.append((f"the mirror {m.url}", place))
