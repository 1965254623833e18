"""A gate pickled inside a saved object: it blocks ``torch.save`` on the store's worker thread
until the test opens it, so a test can look at the state between a snapshot and its commit."""

from __future__ import annotations

import threading
from typing import Any


class Gate:
    """``entered`` is set once pickling reached the gate (on the worker thread); pickling then
    waits for ``release``. A snapshot (deep copy) keeps the gate itself."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.thread: str | None = None
        """The name of the thread that pickled it."""

    def __reduce__(self) -> tuple[Any, ...]:
        self.thread = threading.current_thread().name
        self.entered.set()
        assert self.release.wait(120), "the test never opened the gate"
        return (int, (7,))

    def __deepcopy__(self, memo: dict[int, Any]) -> Gate:
        return self
