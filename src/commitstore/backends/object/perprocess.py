"""An object store's client, made again in a child process after ``fork()``.

fsspec's asynchronous file systems (s3fs, gcsfs) run their requests on an event loop of the
process that made them and refuse to run in another ("This class is not fork-safe"): a store
opened before a ``fork()`` (a DataLoader worker, a launcher that forks ranks) would fail in the
child with that untyped error. :class:`PerProcess` hands out the client made in this process:
in a child, the first use makes a new one with the same settings (its own connections and
loop), and the parent's is left alone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from commitstore.errors import ConfigurationError

__all__ = ["PerProcess"]

T = TypeVar("T")

_LOCK = [threading.Lock()]
"""Serialises the making of clients in a child; made anew in every child (a thread of the
parent may hold it at the fork, making a client of its own)."""


def _fresh_lock() -> None:
    _LOCK[0] = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock)


class PerProcess(Generic[T]):
    """``client`` for this process, ``make()`` for any other (None: a client given by the
    caller, which a child cannot make again: ConfigurationError there)."""

    def __init__(self, client: T, make: Callable[[], T] | None, what: str) -> None:
        self._client = client
        self._make = make
        self._what = what
        self._pid = os.getpid()

    def get(self) -> T:
        """The client of this process (made now, once, in a child)."""
        pid = os.getpid()
        if pid == self._pid:
            return self._client
        with _LOCK[0]:
            if pid != self._pid:
                if self._make is None:
                    raise ConfigurationError(
                        f"{self._what}: its client was made in another process (before a "
                        "fork()) and cannot be made again here: open the store in this process"
                    )
                self._client, self._pid = self._make(), pid
        return self._client
