"""One owner of a staged file's lifecycle: open a sink, fill it hashed, abort it on any failure,
publish it.

:func:`write_sink` is the whole lifecycle for a file that is no commit of its own (a record, the
record cache, a verified local copy: ``get``, ``fetch``); ``Committer.write_file`` is the same for
an artifact, with the record published after the data. A caller says only how its bytes are
produced: a ``fill(sink) -> (size, digest)`` that writes them (``digest.copy_hashed``, or a
:class:`HashedWriter`), and, where it must, a ``check`` of what was hashed before anything is
published. :class:`HashedWriter` is the push side (``Stage``, a folder's member files): bytes
handed in by the caller, hashed on their way to the sink.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from commitstore.backends import Backend, CommitInfo, DirSink, FileSink, PutMode, Rereadable
from commitstore.digest import Hasher, digest_bytes
from commitstore.errors import CommitError
from commitstore.layout import Parts

if TYPE_CHECKING:
    from typing_extensions import Buffer

WRITE_CHUNK = 4 * 1024 * 1024
"""Small writes are gathered up to this size before they reach the storage."""

Fill = Callable[[FileSink], tuple[int, str]]
"""Writes the bytes into the sink, hashing them on the way; returns (size, digest)."""

Check = Callable[[int, str], bool]
"""Called with what was hashed, before anything is published: True publishes, False aborts
(nothing published); what it raises aborts too and is raised."""


class Filled(NamedTuple):
    """What :func:`write_sink` wrote."""

    size: int
    """Bytes hashed (and accepted by the storage)."""
    digest: str
    """Their xxh3_128 digest."""
    info: CommitInfo | None
    """What the publish did; None when ``check`` refused the bytes (nothing published)."""


@contextlib.contextmanager
def aborting(sink: FileSink | DirSink) -> Iterator[None]:
    """Abort ``sink`` when the block raises (anything, ``KeyboardInterrupt`` included), then
    raise. A sink's abort is idempotent and harmless after its own failed publish."""
    try:
        yield
    except BaseException:
        sink.abort()
        raise


def accepted(sink: FileSink, size: int, shown: str) -> None:
    """Raise CommitError unless the storage accepted exactly the ``size`` bytes hashed."""
    if sink.bytes_written != size:
        raise CommitError(
            f"{shown}: storage accepted {sink.bytes_written} bytes, {size} were hashed"
        )


def fill_sink(sink: FileSink, fill: Fill, shown: str) -> tuple[int, str]:
    """``fill(sink)``, then the check that the storage accepted every byte hashed
    (:func:`accepted`). Does not abort: the caller owns the sink (:func:`aborting`)."""
    size, digest = fill(sink)
    accepted(sink, size, shown)
    return size, digest


def write_sink(
    backend: Backend, parts: Parts, mode: PutMode, fill: Fill, *, check: Check | None = None
) -> Filled:
    """Stage a file at ``parts`` of ``backend``, fill it, and publish it with the backend's
    one-step primitive: whole or absent under ``parts``. On any failure (or a ``check`` that
    refuses the bytes) the sink is aborted and nothing is published.

    Raises:
        What ``fill``, ``check`` and the backend's sink raise (CommitError when the storage
        accepted other than the bytes hashed; AlreadyExistsError for a taken name with
        ``PutMode.CREATE``).
    """
    sink = backend.open_sink(parts, mode=mode)
    with aborting(sink):
        size, digest = fill_sink(sink, fill, "/".join(parts))
        if check is not None and not check(size, digest):
            sink.abort()
            return Filled(size, digest, None)
        return Filled(size, digest, sink.publish(size=size, digest=digest))


def write_bytes(data: Buffer) -> Fill:
    """The fill of in-memory ``data``: one write of it as it is (not copied), hashed."""

    def fill(sink: FileSink) -> tuple[int, str]:
        view = memoryview(data).cast("B")
        sink.write(view)
        return view.nbytes, digest_bytes(view)

    return fill


class HashedWriter:
    """Bytes handed in by a caller, hashed on their way to ``sink``: small writes are gathered up
    to :data:`WRITE_CHUNK`, large ones go straight through (never copied). It never aborts the
    sink: what a write raises, the owner of the sink handles."""

    def __init__(self, sink: FileSink) -> None:
        self.sink = sink
        self._hasher = Hasher()
        self._buf = bytearray()

    @property
    def count(self) -> int:
        """Bytes hashed so far."""
        return self._hasher.count

    def write(self, b: Buffer) -> int:
        """Hash ``b`` and send it (or gather it); returns its length."""
        view = memoryview(b).cast("B")
        n = view.nbytes
        self._hasher.update(view)
        if len(self._buf) + n < WRITE_CHUNK:
            self._buf += view
            return n
        self.drain()
        self.sink.write(view)
        return n

    def offer(self, source: Rereadable, size: int) -> bool:
        """Before the first write: ``FileSink.reread_from`` (False once a byte was written)."""
        if self._hasher.count or self._buf:
            return False
        return self.sink.reread_from(source, size)

    def drain(self) -> None:
        """Send the gathered bytes."""
        if self._buf:
            with memoryview(self._buf) as pending:
                self.sink.write(pending)
            self._buf = bytearray()

    def discard(self) -> None:
        """Drop the gathered bytes (the sink is being aborted)."""
        self._buf = bytearray()

    def done(self, shown: str = "") -> tuple[int, str]:
        """Send what is gathered and check the storage accepted every byte hashed
        (CommitError otherwise); the (size, digest) to publish. Publishes nothing."""
        self.drain()
        accepted(self.sink, self._hasher.count, shown or "staged file")
        return self._hasher.count, self._hasher.digest()
