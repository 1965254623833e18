"""Run a call that must not block: it runs in a daemon thread, and the test fails (rather than
hanging) when it has not ended in time."""

from __future__ import annotations

import threading
from collections.abc import Callable


def within(seconds: float, call: Callable[[], object], blocked: str) -> BaseException | None:
    """Run ``call`` in a thread; fail with ``blocked`` if it has not ended after ``seconds``,
    else return what it raised (None if it returned)."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), blocked
    return out[0]
