"""What each object store gives the upload sink (``upload.py``): an upload session
(:class:`Upload`: parts, completion, whole-object put, abort), the few calls the sink makes on the
store itself (:class:`Store`), and the store's answers (:class:`ObjectStat`, :class:`Written`)."""

from __future__ import annotations

import abc
import concurrent.futures
import io
from dataclasses import dataclass
from typing import Any, Protocol

from commitstore.backends.base import Capabilities, Rereadable
from commitstore.backends.object.bodies import SourceWindow
from commitstore.layout import Parts


@dataclass(frozen=True, slots=True)
class ObjectStat:
    """One object as the store reports it (a fresh stat or a listing entry)."""

    key: str
    size: int
    mtime: float | None
    tag: str | None
    """ETag (S3, Azure) or generation (GCS): changes whenever the object is replaced."""
    checksum: str | None = None
    """The server's checksum of the content, in the encoding :meth:`Upload.checksum` uses."""


@dataclass(frozen=True, slots=True)
class Written:
    """What the store answered to the completion (or whole-object put)."""

    tag: str | None
    checksum: str | None = None


class Upload(abc.ABC):
    """One object's upload session: created without I/O, started by its first part."""

    part_size: int
    """Bytes of the next part (read before each part is filled: it may grow)."""
    max_inflight: int = 1
    """Parts in flight at once; 1 sends them one after the other, in order."""
    max_parts: int | None = None

    @abc.abstractmethod
    def send_part(
        self, number: int, body: io.BytesIO, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        """Send part ``number`` (from 1): ``body``, ``length`` bytes, positioned at 0 (the sink
        never touches it again; the session keeps it as long as the request needs it). ``final``:
        the last part. The future's result is the part's receipt for :meth:`complete`; its
        exception, a translated error."""

    @abc.abstractmethod
    def complete(self, receipts: list[Any]) -> Written:
        """The commit: make the parts (receipts in part order) the object, in one step."""

    @abc.abstractmethod
    def put_whole(self, body: io.BytesIO, length: int) -> Written:
        """The commit of a small object: ``body`` (``length`` bytes, at 0) in one request."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop the session if it was started (may raise; the sink ignores errors)."""

    def send_window(
        self, number: int, body: SourceWindow, length: int, *, final: bool
    ) -> concurrent.futures.Future[Any]:
        """:meth:`send_part` of a body read again from the sink's source (only where the store
        says ``reread_bodies``; its MD5 is always given first)."""
        raise NotImplementedError

    def put_window(self, body: SourceWindow, length: int) -> Written:
        """:meth:`put_whole` of a body read again from the sink's source (as ``send_window``)."""
        raise NotImplementedError

    def given_md5(self, number: int, md5: bytes) -> None:
        """The MD5 of the body of part ``number`` (0: the whole object), computed by the sink
        while it filled the body, given just before :meth:`send_part` (:meth:`put_whole`) when
        the store asks for them (``Store.md5_bodies``). Default: ignored."""
        del number, md5

    def resume(self, identity: dict[str, Any], source: Rereadable) -> None:
        """Called once, before the first part, when the bytes come from ``source``, a local file
        of ``identity`` (``resume.source_identity``): a session that resumes finds the state an
        earlier attempt left (``backends/object/resume.py``) and the parts its server holds, or
        starts over. Default: nothing (every part is sent)."""
        del identity, source

    def reuse(self, number: int, md5: bytes, length: int) -> Any | None:
        """The receipt of part ``number`` when the server already holds exactly these bytes
        (``length`` of them, of MD5 ``md5``, computed from the bytes written) from an attempt
        :meth:`resume` found; None: send it. Default: None."""
        del number, md5, length
        return None

    def checksum(self) -> str | None:
        """The checksum of every byte sent, to compare with :attr:`ObjectStat.checksum`."""
        return None

    def attested(self, written: Written) -> bool:
        """True when the store's answer to the completion (or whole-object put) itself shows the
        object is exactly the bytes sent, so no fresh stat is needed (S3: an ETag derived from
        the bodies' server-checked MD5s). False (the default) means: stat to find out."""
        return False


def done(result: Any) -> concurrent.futures.Future[Any]:
    """A future already holding ``result`` (for a part sent synchronously)."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.set_result(result)
    return fut


class Store(Protocol):
    """What the sink needs of its backend (an :class:`ObjectBackend`)."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def whole_max(self) -> int: ...

    @property
    def md5_bodies(self) -> bool:
        """True when each body's MD5 is needed (S3's Content-MD5): the sink computes it while
        the body fills, so the send starts the moment the body is complete."""
        ...

    @property
    def reread_bodies(self) -> bool:
        """True when the sink may send bodies read again from a source it is offered
        (:meth:`ObjectFileSink.reread_from`) instead of buffers it owns: only stores whose server
        checks each body against the MD5 the sink computed from the bytes written."""
        ...

    def shown(self, parts: Parts) -> str: ...

    def head(self, parts: Parts) -> ObjectStat | None: ...

    def new_upload(self, parts: Parts, *, create_only: bool) -> Upload: ...

    def delete_version(self, parts: Parts, tag: str) -> None: ...
