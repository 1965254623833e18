"""A staged file or folder committed whole: the lifecycle after the sink is open, owned once.

:class:`FileCommits` is the part of :class:`~commitstore._commit.Committer` that owns a staged
artifact from its filled sink to its committed record: ``version`` names the record its bytes
are, the sink is aborted on any failure, its publish is the data step of ``Committer.commit``
(pending record, data, record). Writers, mirror copies and ``restore`` say only how their bytes
are produced (a ``fill``, a ``Stage``, a filled folder) and, where they differ, pass it as an
option: a record body copied verbatim (mirrors), a guard under the publish lock, publish slots.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from commitstore._delete import Deletes
from commitstore._sinkwrite import Fill, aborting, fill_sink
from commitstore.backends import CommitInfo, DirSink, FileSink, PutMode
from commitstore.layout import Parts
from commitstore.records import Record

Version = Callable[[int, str], Record]
"""The record a staged file's bytes are, from their size and digest (``publish_file``); what it
raises publishes nothing."""

PublishData = Callable[[], tuple[Record, CommitInfo | None]]
"""A commit's data step (``Committer.commit``): publishes the data, returns its record and what
the publish did (None if nothing was published there)."""


@dataclass(frozen=True, slots=True)
class Options:
    """What every staged commit may be given besides its bytes.

    ``guard``: called under the publish lock right before the data step (what it raises
    publishes nothing); ``slots``: held around the commit (not the fill); ``started``: as
    :meth:`~commitstore._commit.Committer.commit`'s."""

    guard: Callable[[], None] | None = None
    slots: contextlib.AbstractContextManager[object] | None = None
    started: float | None = None


NO_OPTIONS = Options()


class FileCommits(Deletes):
    """The staged-artifact commits of :class:`~commitstore._commit.Committer`."""

    if TYPE_CHECKING:

        def open_file(self, parts: Parts, mode: PutMode) -> FileSink: ...

        def commit(
            self,
            parts: Parts,
            mode: PutMode,
            publish_data: PublishData,
            *,
            intent: Record | None = None,
            body: bytes | None = None,
            started: float | None = None,
        ) -> Record: ...

    def write_file(
        self,
        parts: Parts,
        mode: PutMode,
        fill: Fill,
        version: Version,
        *,
        body: Callable[[Record], bytes] | None = None,
        options: Options = NO_OPTIONS,
    ) -> Record:
        """Commit a file artifact whose bytes ``fill`` writes: :meth:`open_file` (its early
        checks), ``fill(sink)`` (hashed: returns size and digest; the storage must have accepted
        them all, CommitError otherwise), then :meth:`publish_file` (``version``, ``body`` and
        the :class:`Options`: there). On any failure the sink is aborted; the outcome is
        :meth:`commit`'s."""
        sink = self.open_file(parts, mode)
        with aborting(sink):
            hashed = fill_sink(sink, fill, "/".join(parts))
            return self.publish_file(parts, mode, sink, hashed, version, body=body, options=options)

    def publish_file(
        self,
        parts: Parts,
        mode: PutMode,
        sink: FileSink,
        hashed: tuple[int, str],
        version: Version,
        *,
        body: Callable[[Record], bytes] | None = None,
        options: Options = NO_OPTIONS,
    ) -> Record:
        """Commit the filled ``sink`` (its bytes ``hashed``: size, digest), the owner of its
        lifecycle from here (aborted on any failure): ``version(size, digest)`` (the record its
        bytes are; what it raises publishes nothing), ``sink.prepare()``, then :meth:`commit`
        with that record as the pending record and the sink's publish as the data step.
        ``body``: the exact record bytes of that version (a mirror's copy of the source's
        record); ``options``: :class:`Options`."""
        size, digest = hashed
        with aborting(sink):
            record = version(size, digest)
            raw = body(record) if body is not None else None
            sink.prepare()  # e.g. the data's fsync, while the pending record is written

            def data() -> tuple[Record, CommitInfo]:
                return record, sink.publish(size=size, digest=digest)

            return self._publish(parts, mode, data, intent=record, body=raw, options=options)

    def publish_dir(
        self,
        parts: Parts,
        mode: PutMode,
        sink: DirSink,
        intent: Record,
        changed: Callable[[list[tuple[str, int, str]]], Record],
        *,
        body: bytes | None = None,
        options: Options = NO_OPTIONS,
    ) -> Record:
        """Commit the filled folder ``sink`` whose files were hashed as ``intent`` (the pending
        record), the owner of its lifecycle from here (aborted on any failure): :meth:`commit`
        with the sink's publish as the data step. The sink hashes again as it publishes; files
        other than ``intent``'s are ``changed(files)``: the record of what was published, or
        what it raises. ``body``: the exact record bytes; ``options``: :class:`Options`."""
        with aborting(sink):

            def data() -> tuple[Record, CommitInfo]:
                info = sink.publish()
                sent = sorted((f.path, f.size, f.digest) for f in intent.files)
                return (intent if sorted(info.files) == sent else changed(info.files)), info

            return self._publish(parts, mode, data, intent=intent, body=body, options=options)

    def _publish(
        self,
        parts: Parts,
        mode: PutMode,
        data: Callable[[], tuple[Record, CommitInfo]],
        *,
        intent: Record,
        body: bytes | None,
        options: Options,
    ) -> Record:
        """:meth:`commit` of ``intent`` whose data step is ``options``' guard, then ``data``,
        within its slots."""
        guard = options.guard

        def publish_data() -> tuple[Record, CommitInfo]:
            if guard is not None:
                guard()
            return data()

        with options.slots or contextlib.nullcontext():
            return self.commit(
                parts, mode, publish_data, intent=intent, body=body, started=options.started
            )
