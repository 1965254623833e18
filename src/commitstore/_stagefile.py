"""The writable side of a commit: every byte goes through the hasher on its way to the sink
(``_sinkwrite.HashedWriter``); the commit itself is ``Committer.publish_file``."""

from __future__ import annotations

import io
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from commitstore._sinkwrite import HashedWriter
from commitstore.errors import CommitError

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from commitstore.backends import FileSink, Rereadable
    from commitstore.records import Record


class Stage(io.RawIOBase):
    """A writable binary file whose bytes become an artifact only on :meth:`commit`.

    Guarantees: until ``commit()`` returns, nothing is visible under the artifact's name. A clean
    exit of ``with`` commits; an exception aborts. ``close()`` without ``commit()`` aborts too:
    a stage never publishes by accident. ``commit()`` checks that the bytes the storage accepted
    equal the bytes hashed before anything is published.
    """

    def __init__(
        self,
        name: str,
        sink: FileSink,
        finish: Callable[[FileSink, int, str], Record],
        *,
        after: Callable[[Record], None] | None = None,
        precheck: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self._precheck = precheck
        self._sink: FileSink | None = sink
        """Until committed or aborted."""
        self._w = HashedWriter(sink)
        self._finish = finish
        self._after = after
        self.record: Record | None = None
        """The committed record, after :meth:`commit`."""
        self.durable: bool | None = None
        """After commit: ``record.outcome.durable``: False when a step after the data's publish
        failed or could not be confirmed (a directory fsync refused on a network bridge, the
        record's write); the commit itself succeeded (the name verifies as the new version)."""
        self.notes: tuple[str, ...] = ()
        """After commit: what the commit strategy had to work around (retries, refusals)."""

    def __repr__(self) -> str:
        state = "committed" if self.record else ("aborted" if self._sink is None else "open")
        return f"<Stage {self.name!r} {state}, {self._w.count} bytes>"

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._w.count

    def write(self, b: Buffer) -> int:
        if self._sink is None:
            raise ValueError(
                f"write to a stage that is {'committed' if self.record else 'aborted'}"
            )
        try:
            return self._w.write(b)
        except BaseException:
            self.abort()
            raise

    def offer_source(self, source: Rereadable, size: int) -> bool:
        """Before the first write: ``source`` holds the very bytes about to be written
        (``FileSink.reread_from``; an S3 or Azure upload then sends its parts from it and may
        resume an upload an earlier attempt left). True when the sink took it: the caller keeps
        ``source`` open until the commit returns or the stage aborts."""
        if self._sink is None:
            return False
        try:
            return self._w.offer(source, size)
        except BaseException:
            self.abort()
            raise

    def flush(self) -> None:
        """Does nothing visible: bytes become durable and visible only at :meth:`commit`."""

    def check(self) -> None:
        """Run now, publishing nothing and aborting nothing, the checks :meth:`commit` makes
        before anything is published: the bytes the storage accepted equal the bytes hashed,
        the name's place in the hierarchy, and (``overwrite=False``) that the name is still
        free. A pass does not reserve the name: :meth:`commit` checks again, atomically. (What
        a transaction of ``commit://`` runs on every file before committing any.)

        Raises:
            CommitError: the stage was aborted, or the byte counts differ.
            AlreadyExistsError, NameConflictError: the name is taken or in conflict.
        """
        if self.record is not None:
            return
        if self._sink is None:
            raise CommitError(f"{self.name}: stage was aborted")
        self._w.done(self.name)
        if self._precheck is not None:
            self._precheck()

    def commit(self) -> Record:
        """Publish the artifact and its record; return the record. Idempotent after success.

        The outcome is binary: a raise means the name holds what it held before; once the new
        data is published and verifies, a later failure (the record's write, a folder sync) is
        returned, not raised: ``record.outcome.durable`` (and :attr:`durable`) False, the step
        in the notes, a warning logged.

        Raises:
            AlreadyExistsError: the name was committed meanwhile and ``overwrite=False``.
            InsufficientSpaceError, CommitError: nothing was published.
        """
        if self.record is not None:
            return self.record
        if self._sink is None:
            raise CommitError(f"{self.name}: stage was aborted")
        try:
            size, digest = self._w.done(self.name)
            self.record = self._finish(self._sink, size, digest)
            if self.record.outcome is not None:
                self.durable, self.notes = self.record.outcome.durable, self.record.outcome.notes
        except BaseException:
            self.abort()
            raise
        self._sink = None
        super().close()
        if self._after is not None:
            self._after(self.record)  # e.g. replication; the artifact is committed either way
        return self.record

    def abort(self) -> None:
        """Discard everything written; publish nothing. Idempotent."""
        if self._sink is not None:
            sink, self._sink = self._sink, None
            self._w.discard()
            sink.abort()
        if not self.closed:
            super().close()

    def close(self) -> None:
        """Abort unless already committed (closing is never a commit)."""
        if self.record is None:
            self.abort()
        elif not self.closed:
            super().close()

    def __enter__(self) -> Stage:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def __del__(self) -> None:
        # Never commit from a finaliser; only free the staging location.
        try:
            if self._sink is not None:
                self.abort()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
