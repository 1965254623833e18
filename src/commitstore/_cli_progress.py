"""A minimal progress bar for long copies: shown on a terminal for copies of at least
:data:`MIN_BYTES`, or whenever asked for (``force``, the CLI's ``--progress``)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

MIN_BYTES = 32 * 1024 * 1024
"""Copies smaller than this show no bar."""


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


class ProgressBar:
    """Call with the running byte count; draws at most ten times a second on ``stream``, and
    always the final state (``done >= total``). ``force``: draw whatever the stream and size
    (``--progress``); ``enabled=False``: never draw (``--json`` keeps stderr machine-readable)."""

    def __init__(
        self,
        label: str,
        total: int,
        stream: TextIO | None = None,
        *,
        force: bool = False,
        enabled: bool = True,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and (force or (self.stream.isatty() and total >= MIN_BYTES))
        self._finished = False
        self._last = 0.0
        self._start = time.monotonic()

    def __call__(self, done: int) -> None:
        if not self.enabled or self._finished:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = min(1.0, done / self.total) if self.total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = done / max(now - self._start, 1e-6)
        self.stream.write(
            f"\r{self.label} [{bar}] {frac * 100:5.1f}% {_fmt(done)}/{_fmt(self.total)} "
            f"{_fmt(rate)}/s"
        )
        if done >= self.total:
            self.stream.write("\n")
            self._finished = True
        self.stream.flush()
