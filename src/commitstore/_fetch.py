"""A verified local copy of an artifact, cached by digest (``CommitStore.fetch``).

One read of the artifact, hashed on the way, into ``<cache_dir>/<digest hex>.<size><suffix>``
through the local commit protocol (a staging name, fsync, rename, folder fsync): the cached file
appears only if its bytes matched the record. A cached file is trusted by its name and size: a
second fetch of the same version reads the record (one small read) and ``lstat``\\ s the cached
file, and reads none of the artifact. What is checked on a hit: the name (derived from the
record's digest), a regular file (not a symlink), the recorded size; the bytes are not hashed
again (``rehash=True`` does). A cache folder is as trusted as the user who owns it. A fetch killed
midway leaves only a staging file (``.commitstore.tmp.*``), never a file under a digest's name.

The copy is written through the page cache, never with direct I/O: it is made to be read (and
mapped, ``commitstore.torch.load(mmap=True)``) right away, and buffered writes leave it resident
in large page-cache folios, where a direct write would leave nothing cached and a later read
would fill the cache in small readahead pieces, each a page fault for a mapping.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from commitstore._check import compare
from commitstore._read import ATTEMPTS, _attempt, _file_record, _open_data, _record_changed
from commitstore.backends import Backend, PutMode
from commitstore.backends.rename._localfs import os_error
from commitstore.backends.rename.posix import LocalBackend
from commitstore.digest import copy_hashed, hash_stream
from commitstore.errors import ConfigurationError, InsufficientSpaceError
from commitstore.records import Record

__all__ = ["cache_path", "default_cache_dir", "fetch"]

_SUFFIX = re.compile(r"\.[A-Za-z0-9_-]{1,16}$")


def default_cache_dir() -> Path:
    """``$COMMITSTORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/commitstore/fetch``, else
    ``~/.cache/commitstore/fetch``."""
    explicit = os.environ.get("COMMITSTORE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commitstore" / "fetch"


def check_cache_dir(cache_dir: object) -> Path:
    """``cache_dir`` as a Path (None: :func:`default_cache_dir`), before any I/O.

    Raises:
        ConfigurationError: not a str or path-like, or empty.
    """
    if cache_dir is None:
        return default_cache_dir()
    if not isinstance(cache_dir, (str, os.PathLike)) or not os.fspath(cache_dir):
        raise ConfigurationError(f"cache_dir must be a local folder path, not {cache_dir!r}")
    return Path(os.fspath(cache_dir))


def cache_path(cache_dir: Path, record: Record, digest: str | None = None) -> Path:
    """Where the version with ``digest`` (default: the record's) of ``record`` is cached."""
    hexpart = (digest or record.digest).split(":", 1)[1]
    found = _SUFFIX.search(record.name.rsplit("/", 1)[-1])
    return cache_dir / f"{hexpart}.{record.size}{found.group(0) if found else ''}"


def _cached(path: Path, record: Record, rehash: bool) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise os_error(exc, "checking the cached copy", str(path)) from exc
    if not stat.S_ISREG(st.st_mode) or st.st_size != record.size:
        return False
    if not rehash:
        return True
    try:
        with open(path, "rb") as f:
            return hash_stream(f) == (record.size, record.digest)
    except OSError as exc:
        raise os_error(exc, "hashing the cached copy", str(path)) from exc


def fetch(
    backend: Backend, url: str, name: str, cache_dir: Path, *, rehash: bool = False
) -> tuple[Path, Record]:
    """The cached copy of ``name``'s committed version, made if missing (module docstring).

    Returns the path and the record it matches. Raises what ``CommitStore.open`` raises
    (NotFoundError, IntegrityError: bytes that fail their record are never cached), a folder
    artifact is a ConfigurationError; local errors are typed (InsufficientSpaceError...).
    """
    rec = _file_record(backend, url, name)
    path = cache_path(cache_dir, rec)
    if _cached(path, rec, rehash):
        return path, rec
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, "creating the cache folder", str(cache_dir)) from exc
    target = LocalBackend(cache_dir.resolve(), reason="fetch cache folder")
    target.direct_io = False  # the copy is read next (module docstring)
    for attempt in range(ATTEMPTS):
        free = target.free_space(())
        if free is not None and free < rec.size:
            raise InsufficientSpaceError(
                f"{cache_dir}: {rec.size} bytes needed, {free} available",
                path=str(cache_dir),
                needed=rec.size,
                available=free,
            )
        with _attempt(backend, attempt):
            got = _copy(backend, rec, target, path)
        if isinstance(got, Path):
            return got, rec
        if attempt + 1 == ATTEMPTS or not _record_changed(backend, rec):
            raise got
        rec = _file_record(backend, url, name)
        path = cache_path(cache_dir, rec)
        if _cached(path, rec, rehash):
            return path, rec
    raise AssertionError("unreachable")  # pragma: no cover


def _copy(backend: Backend, rec: Record, target: LocalBackend, path: Path) -> Path | Exception:
    """One hashed read of ``rec``'s data into a staging file of ``target``, published as ``path``
    only if the bytes are the record's; else the IntegrityError (nothing published)."""
    sink = target.open_sink((path.name,), mode=PutMode.REPLACE)
    try:
        with _open_data(backend, rec) as src:
            size, digest = copy_hashed(src, sink.write)
        if (size, digest) != (rec.size, rec.digest):
            sink.abort()
            found = compare(
                rec.size, rec.digest, found_size=size, found_digest=digest, level="full"
            )
            assert found is not None
            return found.error(rec.name)
        sink.publish(size=size, digest=digest)
    except BaseException:
        sink.abort()
        raise
    return path
