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

from commitstore._destination import store_holding
from commitstore._read import (
    ATTEMPTS,
    _attempt,
    _file_record,
    _open_data,
    _retry,
)
from commitstore._sinkwrite import write_sink
from commitstore._verify import pending_versions, resolve, served_version
from commitstore.backends import Backend, FileSink, PutMode, local_error, local_folder
from commitstore.digest import copy_hashed, hash_stream
from commitstore.errors import ConfigurationError, InsufficientSpaceError, IntegrityError
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
        ConfigurationError: not a str or path-like, empty, or holding a NUL.
    """
    if cache_dir is None:
        return default_cache_dir()
    if not isinstance(cache_dir, (str, os.PathLike)) or not os.fspath(cache_dir):
        raise ConfigurationError(f"cache_dir must be a local folder path, not {cache_dir!r}")
    if "\0" in str(os.fspath(cache_dir)):
        raise ConfigurationError(f"cache_dir {cache_dir!r} contains a NUL, which no path can")
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
        raise local_error(exc, "checking the cached copy", str(path)) from exc
    if not stat.S_ISREG(st.st_mode) or st.st_size != record.size:
        return False
    if not rehash:
        return True
    try:
        with open(path, "rb") as f:
            return hash_stream(f) == (record.size, record.digest)
    except OSError as exc:
        raise local_error(exc, "hashing the cached copy", str(path)) from exc


def fetch(
    backend: Backend, url: str, name: str, cache_dir: Path, *, rehash: bool = False
) -> tuple[Path, Record]:
    """The cached copy of ``name``'s committed version, made if missing (module docstring).

    Returns the path and the record of the version it holds: the name's record, or the pending
    version the name verifies as (a commit stopped after its data step; :func:`version_of`),
    with its own step and metadata. Raises what ``CommitStore.open`` raises (NotFoundError,
    IntegrityError: bytes that fail their record are never cached), a folder artifact is a
    ConfigurationError, and so is a ``cache_dir`` inside the store's own folder (before any
    I/O: a cached copy there would land among the store's names); local errors are typed
    (InsufficientSpaceError...).
    """
    root = store_holding(backend, cache_dir)
    if root is not None:
        raise ConfigurationError(
            f"cache_dir {cache_dir} is inside the store's own folder ({root}): cached copies "
            "there would land among the store's artifacts and records; choose a folder outside "
            "the store"
        )
    rec = _file_record(backend, url, name)
    version = version_of(backend, rec)
    path = cache_path(cache_dir, version)
    if _cached(path, version, rehash):
        return path, version
    # buffered writes: the copy is read next (module docstring)
    target = local_folder(cache_dir, reason="cache folder", make=True, direct_io=False)
    for attempt in range(ATTEMPTS):
        free = target.free_space(())
        if free is not None and free < version.size:
            raise InsufficientSpaceError(
                f"{cache_dir}: {version.size} bytes needed, {free} available",
                path=str(cache_dir),
                needed=version.size,
                available=free,
            )
        with _attempt(backend, attempt) as unheld:
            got = _copy(backend, rec, version, target, path)
        if isinstance(got, Path):
            return got, version
        if isinstance(got, Record):  # the bytes are another version of the name (resolved)
            version = got
        else:
            _retry(backend, rec, attempt, unheld, got)  # raises unless the record moved on
            rec = _file_record(backend, url, name)
            version = version_of(backend, rec)
        path = cache_path(cache_dir, version)
        if _cached(path, version, rehash):
            return path, version
    raise IntegrityError(
        f"{name}: its version kept changing while it was fetched; nothing cached",
        name=name,
        status="hash_mismatch",
    )


def version_of(backend: Backend, rec: Record) -> Record:
    """The version of file artifact ``rec`` a fetch serves: ``rec``, unless a pending version
    of the name exists (one small read; on object stores also one listing of the writer
    slots), then the version the stored bytes verify as (``_verify.resolve``, the one
    resolution every reader uses: it reads and hashes them), so a cached copy of the old
    version is never served for a name that verifies as the new one."""
    if not pending_versions(backend, rec):
        return rec
    result, version = resolve(backend, rec, "full")
    return version if result.status == "ok" and version.kind == "file" else rec


def _copy(
    backend: Backend, rec: Record, version: Record, target: Backend, path: Path
) -> Path | Record | IntegrityError:
    """One hashed read of ``rec``'s data into a staging file of ``target``, published as ``path``
    only if the bytes are ``version``'s (``rec`` or a pending version of it); else nothing is
    published and the answer is the version the bytes are (``_verify.served_version``), or the
    IntegrityError when they are none."""

    def fill(sink: FileSink) -> tuple[int, str]:
        with _open_data(backend, rec) as src:
            return copy_hashed(src, sink.write)

    def check(size: int, digest: str) -> bool:
        return (size, digest) == (version.size, version.digest)

    got = write_sink(target, (path.name,), PutMode.REPLACE, fill, check=check)
    if got.info is not None:
        return path
    try:
        return served_version(backend, rec, "full", size=got.size, digest=got.digest)
    except IntegrityError as exc:
        return exc
