"""The SMB strategy's sinks and reader (see ``smb.py``)."""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import smbclient

from commitstore.backends.base import CommitInfo, DirSink, FileSink
from commitstore.backends.localtree import hash_and_sync_tree
from commitstore.backends.rename._smbconn import SmbConnection, call, translate
from commitstore.errors import CommitError
from commitstore.layout import Parts, staging_part

if TYPE_CHECKING:
    from commitstore.backends.rename.smb import SmbBackend


class SmbReader(io.RawIOBase):
    """Raw reader that translates SMB errors into the error tree."""

    def __init__(self, raw: Any, conn: SmbConnection, shown: str) -> None:
        super().__init__()
        self._raw = raw
        self._conn = conn
        self._shown = shown

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            n: int = self._raw.readinto(b)
            return n
        except Exception as exc:
            raise translate(exc, "reading", self._shown) from exc

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        pos: int = self._raw.seek(offset, whence)
        return pos

    def tell(self) -> int:
        pos: int = self._raw.tell()
        return pos

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._raw.close()
        super().close()


class SmbFileSink(FileSink):
    """Staging file on the share, flushed, checked, renamed into place."""

    def __init__(self, backend: SmbBackend, parts: Parts, *, overwrite: bool) -> None:
        self._b = backend
        self._parts = parts
        self._tmp = (*parts[:-1], staging_part(parts[-1]))
        self._overwrite = overwrite
        self.bytes_written = 0
        self._f: Any = call(
            backend.conn,
            "creating the staging file for",
            backend.shown(parts),
            lambda: smbclient.open_file(
                backend.unc(self._tmp), mode="xb", buffering=0, **backend.kw()
            ),
            attempts=1,
        )
        self._done = False

    def write(self, data: memoryview) -> None:
        assert self._f is not None, "write after publish/abort"
        view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        try:
            while view.nbytes:
                n = self._f.write(view)
                self.bytes_written += n
                view = view[n:]
        except Exception as exc:
            err = translate(exc, "writing", self._b.shown(self._parts))
            self.abort()
            raise err from exc

    def publish(self, *, size: int, digest: str) -> CommitInfo:
        assert self._f is not None, "publish after publish/abort"
        b = self._b
        info = CommitInfo(self.bytes_written, notes=["SMB has no directory fsync"])
        try:
            if size != self.bytes_written:
                raise CommitError(
                    f"{b.shown(self._parts)}: {self.bytes_written} written, {size} expected"
                )
            f, self._f = self._f, None
            try:
                f.flush()  # SMB2 FLUSH: the server fsyncs the file
                f.close()
            except Exception as exc:
                raise translate(exc, "flushing", b.shown(self._parts)) from exc
            b.check_size(self._tmp, self.bytes_written, "on a fresh stat")
            if b.readback:
                b.check_digest(self._tmp, digest)
            b.move(self._tmp, self._parts, overwrite=self._overwrite)
            self._done = True
            try:
                b.check_size(self._parts, self.bytes_written, "after the rename")
            except CommitError:
                with contextlib.suppress(Exception):
                    smbclient.remove(b.unc(self._parts), **b.kw())
                raise
            return info
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        if self._f is not None:
            with contextlib.suppress(Exception):
                self._f.close()
            self._f = None
        if not self._done:
            self._done = True
            # A dead connection leaves the staging file as an orphan; gc removes it later.
            with contextlib.suppress(Exception):
                smbclient.remove(self._b.unc(self._tmp), **self._b.kw())


class SmbDirSink(DirSink):
    """A local folder, uploaded into a staging folder on the share, renamed into place."""

    def __init__(self, backend: SmbBackend, parts: Parts, *, overwrite: bool) -> None:
        self._b = backend
        self._parts = parts
        self._overwrite = overwrite
        self._tmp = (*parts[:-1], staging_part(parts[-1]))
        self.local_path = Path(tempfile.mkdtemp(prefix=".commitstore.tmp."))
        self._remote_created = False

    def publish(self) -> CommitInfo:
        b = self._b
        try:
            files = hash_and_sync_tree(self.local_path)
            b.ensure_dir(self._tmp)
            self._remote_created = True
            for rel, size, digest in files:
                rparts = (*self._tmp, *rel.split("/"))
                b.ensure_dir(rparts[:-1])
                b.upload(rparts, self.local_path / rel)
                b.check_size(rparts, size, "on a fresh stat")
                if b.readback:
                    b.check_digest(rparts, digest)
            if self._overwrite and b.stat(self._parts) is not None:
                old = (*self._parts[:-1], staging_part(self._parts[-1]))
                b.move(self._parts, old, overwrite=False)
                b.move(self._tmp, self._parts, overwrite=False)
                b.remove(old)
            else:
                b.move(self._tmp, self._parts, overwrite=False)
            self._remote_created = False
            return CommitInfo(
                sum(s for _, s, _ in files), files=files, notes=["SMB has no directory fsync"]
            )
        except BaseException:
            self.abort()
            raise
        finally:
            shutil.rmtree(self.local_path, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.local_path, ignore_errors=True)
        if self._remote_created:
            self._remote_created = False
            with contextlib.suppress(Exception):
                self._b.remove(self._tmp)
