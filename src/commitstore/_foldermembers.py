"""The files of a multi-writer folder (``_folderwrite``): written hashed on the way, read back
checked.

:class:`FolderFile` is what :meth:`FolderWrite.open_file` returns; :func:`read_member` reads one
file of a committed folder artifact in full and checks it against its entry in the record.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from commitstore import _read
from commitstore._commit import Committer
from commitstore._sinkwrite import HashedWriter, aborting
from commitstore._verify import compare
from commitstore.backends import FileSink
from commitstore.digest import digest_bytes, hash_stream
from commitstore.errors import CommitError, IntegrityError, NotFoundError
from commitstore.layout import Parts, aside_parts, staged_parts, validate_name
from commitstore.records import FileRecord, Record

if TYPE_CHECKING:
    from typing_extensions import Buffer

T = TypeVar("T")


class FolderFile(io.RawIOBase):
    """One file of a folder being written: a writable binary file that hashes on the way.

    ``finish()`` (or a clean ``with`` exit) makes it durable in the staging area and returns its
    :class:`FileRecord`; an exception or ``abort()`` removes it. Never visible under the folder's
    name before the folder's commit."""

    def __init__(
        self,
        path: str,
        sink: FileSink,
        *,
        on_end: Callable[[], None] | None = None,
        after_publish: Callable[[FileRecord], None] | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self._sink: FileSink | None = sink
        """Until finished or aborted."""
        self._w = HashedWriter(sink)
        self._on_end = on_end
        """Called once when the file is finished or aborted (the writer's heartbeat stops)."""
        self._after_publish = after_publish
        """Called with the file's record once it is published, before :meth:`finish` returns
        it; what it raises, :meth:`finish` raises (object stores: the late-upload check)."""
        self.record: FileRecord | None = None
        """After :meth:`finish`."""

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._w.count

    def write(self, b: Buffer) -> int:
        if self._sink is None:
            raise ValueError(f"write to {self.path}, which is finished or aborted")
        try:
            return self._w.write(b)
        except BaseException:
            self.abort()
            raise

    def finish(self) -> FileRecord:
        """Publish the file into the staging area; its record (path, size, digest)."""
        if self.record is not None:
            return self.record
        if self._sink is None:
            raise CommitError(f"{self.path}: aborted")
        sink, self._sink = self._sink, None
        try:
            with aborting(sink):
                size, digest = self._w.done(self.path)
                sink.publish(size=size, digest=digest)
        except BaseException:
            self._end()
            raise
        self._end()
        record = FileRecord(self.path, size, digest)
        if self._after_publish is not None:
            try:
                self._after_publish(record)
            except BaseException:
                super().close()
                raise
        self.record = record
        super().close()
        return self.record

    def _end(self) -> None:
        end, self._on_end = self._on_end, None
        if end is not None:
            end()

    def abort(self) -> None:
        """Discard the file. Idempotent."""
        if self._sink is not None:
            sink, self._sink = self._sink, None
            self._w.discard()
            try:
                sink.abort()
            finally:
                self._end()
        if not self.closed:
            super().close()

    def close(self) -> None:
        """Abort unless finished (closing is never a publish)."""
        if self.record is None:
            self.abort()
        elif not self.closed:
            super().close()

    def __enter__(self) -> FolderFile:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            self.finish()
        else:
            self.abort()


def read_member(committer: Committer, record: Record, path: str) -> bytes:
    """All bytes of the file ``path`` of the committed folder ``record``, read once and checked
    against its entry (size and full digest), from the first of :func:`places` that holds them.

    Raises:
        NotFoundError: the record lists no such file. IntegrityError: missing, truncated or
            changed bytes (as found under the name).
    """

    def take(f: BinaryIO) -> tuple[bytes, int, str]:
        data = f.read()
        return data, len(data), digest_bytes(data)

    data, f = _first_whole(committer, record, path, take)
    f.close()
    return data


def places(record: Record, path: str) -> list[Parts]:
    """Where the bytes of file ``path`` of folder version ``record`` are looked for, in order:
    under the name; in the staged copy of an object-store folder replace stopped among its
    copies (it holds ``record`` whole until the final keys do: ``backends/object/dirsink``);
    in the aside entry of a move-aside replace stopped before the new folder was in
    (``backends/rename/aside.py``); under the name again (a replace that finished meanwhile
    removed its staged copy). The places ``verify`` resolves a folder version from, so a
    member read agrees with it; wherever they are read, the bytes are checked against
    ``record``'s entry before any is handed out."""
    name = validate_name(record.name)
    rel = validate_name(path, inside_folder=True)
    return [
        (*name, *rel),
        (*staged_parts(name, record.digest), *rel),
        (*aside_parts(name), *rel),
        (*name, *rel),
    ]


def _first_whole(
    committer: Committer,
    record: Record,
    path: str,
    take: Callable[[BinaryIO], tuple[T, int, str]],
) -> tuple[T, BinaryIO]:
    """``take``'s answer (read from an open file: its result, the size and digest it saw) and
    the open file, from the first of :func:`places` whose bytes match ``path``'s entry in
    ``record``; the caller closes the file. Every other file opened is closed.

    Raises:
        NotFoundError: the record lists no such file. IntegrityError: no place holds them;
            what was found under the name.
    """
    entry = next((f for f in record.files if f.path == path), None)
    if entry is None:
        raise NotFoundError(f"{record.name} has no file {path}", name=record.name)
    problem: IntegrityError | None = None
    for parts in places(record, path):
        try:
            f = _read._open_parts(committer.backend, record.name, parts)
        except IntegrityError as exc:
            problem = problem or exc
            continue
        try:
            got, size, digest = take(f)
            found = compare(
                entry.size, entry.digest, found_size=size, found_digest=digest, level="full"
            )
        except BaseException:
            f.close()
            raise
        if found is None:
            return got, f
        f.close()
        problem = problem or found.error(record.name, path)
    assert problem is not None
    raise problem


__all__ = ["FolderFile", "open_member", "places", "read_member"]


def open_member(committer: Committer, record: Record, path: str) -> BinaryIO:
    """The file ``path`` of the committed folder ``record``, hashed whole and checked against
    its entry (size and full digest) before any byte is handed out, then rewound; from the
    first of :func:`places` that holds it.

    Raises:
        NotFoundError: the record lists no such file. IntegrityError: missing, truncated or
            changed bytes (as found under the name).
    """
    _, f = _first_whole(committer, record, path, lambda f: (None, *hash_stream(f)))
    try:
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return f
