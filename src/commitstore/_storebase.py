"""What the facade's method groups (``_storereads``, ``_storeupkeep``) share: the attributes of a
store they read, set by ``CommitStore.__init__`` (``store.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from commitstore._commit import Committer
from commitstore.backends import Backend
from commitstore.maintenance.retention import Retention
from commitstore.mirrors.replicator import Replicator

Progress = Callable[[int], None]
"""A progress callback: called with the bytes copied so far."""


class StoreBase:
    """The state of a :class:`~commitstore.CommitStore` that its method groups use (declared
    here, set by its ``__init__``)."""

    _backend: Backend
    url: str
    _committer: Committer
    _replicator: Replicator | None
    retention: Retention | None
    _mirrors: Sequence[StoreBase]
    warn_missing: bool
