"""Backends and the registry that picks one for a URL.

A backend owns one root and its storage's single "make it visible" step (its commit strategy).
Backends come in two families, each sharing one sink:

- ``rename/``: filesystems with a rename (local disks, mounted bridges, SMB shares). Bytes go to a
  staging name beside the destination, are flushed and checked, then renamed into place.
- ``object/``: object stores without a rename (S3, GCS, Azure). The upload's own completion is the
  commit; nothing is visible before it.

=========================  ===================  ==============================================
URL                        strategy             commit point
=========================  ===================  ==============================================
``/path``, ``file://...``  ``local-rename``     fsync file, rename (no-replace or replace),
                                                fsync directory
  ... on 9p/drvfs/CIFS/    ``bridge-checked``   the same, plus fresh-stat size check, read-back
  NFS/FUSE mounts                               digest, rename retries, size after rename,
                                                dir-fsync errors reported, not fatal
``smb://host/share/...``   ``smb-checked``      SMB2 FLUSH, fresh-stat size check, optional
                                                read-back digest, rename / replace
``s3://bucket/prefix``     ``s3-multipart``     CompleteMultipartUpload (or one PutObject),
                                                create-only where honoured, fresh HEAD size
``gs://bucket/prefix``     ``gcs-resumable``    the resumable upload's final request; size and
                                                CRC32C checked
``az://container/prefix``  ``azure-blocklist``  ``commit_block_list`` of blocks staged under
                                                writer-unique IDs
``memory://name``          ``memory-swap``      one swap into the store under a lock
``sftp://[u@]host/path``   ``fsspec-checked``   sshfs: fsync@openssh.com, fresh-stat size
                                                check, optional read-back digest, SFTP rename
                                                (create-only) / posix-rename (atomic replace,
                                                probed)
``webdav+https://h/path``  ``fsspec-checked``   webdav4: the staged body PUT, fresh-stat size
                                                check, MOVE Overwrite F / T (replace declared
                                                not atomic)
any other fsspec scheme,   ``fsspec-checked``   the filesystem's own ``mv`` (copy-then-delete
or ``strategy="fsspec"``                        filesystems refused unless allow_copy_move);
                                                replace moves the old entry aside first
=========================  ===================  ==============================================

Other schemes come from third-party packages: :func:`register` at run time, or an entry point in
the group ``commitstore.backends`` (name: the scheme; value: ``"module:factory"``). A factory is
``factory(url: str, options: dict[str, Any]) -> Backend``; :func:`take_options` checks its options.
The facade never looks at URL schemes: this table is the one place a store is chosen from.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from commitstore.backends.base import (
    Backend,
    Capabilities,
    CommitInfo,
    DirSink,
    FileInfo,
    FileSink,
    PendingUpload,
    PutMode,
    Rereadable,
    StagingTaken,
    take_options,
)
from commitstore.backends.localsource import (
    OURS,
    Pinned,
    below,
    check_folder,
    entry_of,
    opened_below,
    pin,
    scan,
    store_holding,
)
from commitstore.backends.localtree import hash_and_sync_tree
from commitstore.errors import CommitStoreError, ConfigurationError

__all__ = [
    "ENTRY_POINT_GROUP",
    "OURS",
    "Backend",
    "Capabilities",
    "CommitInfo",
    "DirSink",
    "Factory",
    "FileInfo",
    "FileSink",
    "PendingUpload",
    "Pinned",
    "PutMode",
    "Rereadable",
    "StagingTaken",
    "below",
    "check_folder",
    "entry_of",
    "hash_and_sync_tree",
    "local_error",
    "local_folder",
    "opened_below",
    "pin",
    "register",
    "resolve",
    "scan",
    "schemes",
    "store_holding",
    "take_options",
    "unregister",
]

Factory = Callable[[str, dict[str, Any]], Backend]
"""``factory(url, options) -> Backend``: opens the backend for ``url`` with its storage options."""

ENTRY_POINT_GROUP = "commitstore.backends"
"""Entry-point group through which installed packages add URL schemes."""


@dataclass(frozen=True, slots=True)
class _Builtin:
    target: str
    """``"module:attribute"`` of the factory, imported on first use."""
    extra: str | None
    """The pip extra that brings its dependencies."""


_BUILTIN: dict[str, _Builtin] = {
    "": _Builtin("commitstore.backends.rename.posix.bridge:factory", None),
    "file": _Builtin("commitstore.backends.rename.posix.bridge:factory", None),
    "memory": _Builtin("commitstore.backends.memory:factory", None),
    "smb": _Builtin("commitstore.backends.rename.smb.backend:factory", "smb"),
    "s3": _Builtin("commitstore.backends.object.s3.backend:factory", "s3"),
    "gs": _Builtin("commitstore.backends.object.gcs.backend:factory", "gcs"),
    "gcs": _Builtin("commitstore.backends.object.gcs.backend:factory", "gcs"),
    "az": _Builtin("commitstore.backends.object.azure.backend:factory", "azure"),
    "abfs": _Builtin("commitstore.backends.object.azure.backend:factory", "azure"),
    "sftp": _Builtin("commitstore.backends.rename.fsspec.urls:sftp_factory", "sftp"),
    "ssh": _Builtin("commitstore.backends.rename.fsspec.urls:sftp_factory", "sftp"),
    "webdav": _Builtin("commitstore.backends.rename.fsspec.urls:webdav_factory", "webdav"),
    "webdav+http": _Builtin("commitstore.backends.rename.fsspec.urls:webdav_factory", "webdav"),
    "webdav+https": _Builtin("commitstore.backends.rename.fsspec.urls:webdav_factory", "webdav"),
    "dav": _Builtin("commitstore.backends.rename.fsspec.urls:webdav_factory", "webdav"),
}
"""The built-in schemes (the table above)."""

_GENERIC = "commitstore.backends.rename.fsspec.urls:generic_factory"
"""The ``fsspec-checked`` strategy over any fsspec filesystem: schemes fsspec knows that have
no strategy here, and any URL opened with ``strategy="fsspec"``."""

_registered: dict[str, Factory] = {}
_lock = threading.Lock()


def _check_scheme(scheme: str) -> str:
    if not isinstance(scheme, str) or not scheme.replace("+", "").replace("-", "").isalnum():
        raise ConfigurationError(f"a URL scheme is letters, digits, '+' and '-', not {scheme!r}")
    return scheme.lower()


def register(scheme: str, factory: Factory, *, replace: bool = False) -> None:
    """Serve ``scheme://`` URLs with ``factory`` from now on (in this process).

    A built-in scheme, or one already registered, is replaced only with ``replace=True``.

    Raises:
        ConfigurationError: a malformed scheme, or one taken and ``replace=False``.
    """
    key = _check_scheme(scheme)
    with _lock:
        if not replace and (key in _BUILTIN or key in _registered):
            raise ConfigurationError(f"{key}:// already has a backend (pass replace=True)")
        _registered[key] = factory


def unregister(scheme: str) -> None:
    """Forget a scheme given to :func:`register` (built-ins and entry points stay). Idempotent."""
    with _lock:
        _registered.pop(_check_scheme(scheme), None)


def _entry_point(scheme: str) -> Factory | None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() == scheme:
            try:
                loaded: Factory = ep.load()
            except ImportError as exc:
                raise ConfigurationError(
                    f"{scheme}:// backend {ep.value!r} could not be imported: {exc}"
                ) from exc
            return loaded
    return None


def _builtin(scheme: str) -> Factory | None:
    spec = _BUILTIN.get(scheme)
    if spec is None:
        return None
    module, _, attr = spec.target.partition(":")
    try:
        loaded: Factory = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ConfigurationError(_missing_extra(scheme, spec)) from exc
    return loaded


def _missing_extra(scheme: str, spec: _Builtin) -> str:
    return f"{scheme}:// needs the {spec.extra} extra: pip install 'commitstore[{spec.extra}]'"


def _generic(scheme: str, forced: bool) -> Factory | None:
    """The generic fsspec factory, if forced or if fsspec knows ``scheme``."""
    if not forced:
        from fsspec.registry import known_implementations, registry

        if scheme not in known_implementations and scheme not in registry:
            return None
    module, _, attr = _GENERIC.partition(":")
    loaded: Factory = getattr(importlib.import_module(module), attr)
    return loaded


def _forced(options: dict[str, Any]) -> bool:
    """Pop ``strategy="fsspec"`` (force the generic fsspec strategy); any other ``strategy``
    option is the backend's own (the local factory takes ``"local"`` / ``"bridge"``)."""
    if options.get("strategy") != "fsspec":
        return False
    del options["strategy"]
    return True


def local_folder(
    path: str | os.PathLike[str], *, reason: str, make: bool = False, direct_io: bool = True
) -> Backend:
    """The local commit protocol (``local-rename``) over the folder ``path``, for a local copy
    the core writes outside any store (a fetch cache, a ``get_file`` destination); ``reason``
    names it in messages. ``make``: create the folder and its parents first. ``direct_io=False``:
    never write with ``O_DIRECT`` (a copy read right after stays in the page cache).

    Raises:
        CommitStoreError: with ``make``, the folder could not be made (typed as the local
            commit protocol types it: InsufficientSpaceError, StoragePathError...).
    """
    from commitstore.backends.rename.posix._localfs import os_error
    from commitstore.backends.rename.posix.backend import LocalBackend

    if make:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise os_error(exc, f"creating the {reason}", os.fspath(path)) from exc
    root = os.path.realpath(path)
    return LocalBackend(root, reason=reason, direct_io=direct_io)


def local_error(exc: Exception, what: str, path: str) -> Exception:
    """An OSError of a local file operation (``what`` on ``path``) typed as the local commit
    protocol types it (InsufficientSpaceError, StoragePathError, BackendUnavailableError,
    CommitError); anything else returned unchanged."""
    from commitstore.backends.rename.posix._localfs import os_error

    return os_error(exc, what, path)


def schemes() -> list[str]:
    """Every scheme a URL may use: built-in, registered and installed through entry points."""
    names = set(_BUILTIN) | set(_registered)
    names |= {ep.name.lower() for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(s for s in names if s)


def resolve(url: str | os.PathLike[str], options: dict[str, Any]) -> Backend:
    """The backend for ``url``: registered first, then built-in, then entry points, then the
    generic ``fsspec-checked`` strategy for a scheme fsspec knows (``strategy="fsspec"`` in
    ``options`` forces that one).

    Raises:
        ConfigurationError: an empty URL, an unknown scheme (with the known ones), a missing
            extra (with the pip command), or an option the backend does not take; all before
            any I/O.
    """
    text = os.fspath(url)
    if not isinstance(text, str) or not text.strip():
        # an unset variable (open_store(os.environ.get("CKPT", ""))) must not open the
        # current folder as a store
        raise ConfigurationError(
            f"the store URL is empty ({text!r}): give a folder path or a URL such as s3://bucket"
        )
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    given = dict(options)
    options = dict(options)
    forced = _forced(options)
    with _lock:
        factory = None if forced else _registered.get(scheme)
    if factory is None and not forced:
        factory = _builtin(scheme) or _entry_point(scheme)
    if factory is None:
        factory = _generic(scheme, forced)
    if factory is None:
        known = ", ".join(f"{s}://" for s in schemes())
        raise ConfigurationError(f"no commit strategy for {scheme}:// URLs (known: {known})")
    spec = None if forced else _BUILTIN.get(scheme)
    try:
        backend = factory(text, options)
    except CommitStoreError:
        raise
    except ImportError as exc:  # a dependency imported by the factory itself
        if spec is not None and spec.extra is not None:
            raise ConfigurationError(_missing_extra(scheme, spec)) from exc
        raise ConfigurationError(f"{scheme}:// backend could not be imported: {exc}") from exc
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{scheme}:// options are not valid: {exc}") from exc
    with contextlib.suppress(AttributeError):  # a plugin's backend may not take attributes
        backend.opened_from = (text, given)
    return backend
