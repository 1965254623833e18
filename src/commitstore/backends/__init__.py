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
=========================  ===================  ==============================================

Other schemes come from third-party packages: :func:`register` at run time, or an entry point in
the group ``commitstore.backends`` (name: the scheme; value: ``"module:factory"``). A factory is
``factory(url: str, options: dict[str, Any]) -> Backend``; :func:`take_options` checks its options.
The facade never looks at URL schemes: this table is the one place a store is chosen from.
"""

from __future__ import annotations

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
    take_options,
)
from commitstore.errors import CommitStoreError, ConfigurationError

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "Capabilities",
    "CommitInfo",
    "DirSink",
    "Factory",
    "FileInfo",
    "FileSink",
    "PendingUpload",
    "PutMode",
    "register",
    "resolve",
    "schemes",
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
    "": _Builtin("commitstore.backends.rename.bridge:factory", None),
    "file": _Builtin("commitstore.backends.rename.bridge:factory", None),
    "memory": _Builtin("commitstore.backends.memory:factory", None),
    "smb": _Builtin("commitstore.backends.rename.smb:factory", "smb"),
    "s3": _Builtin("commitstore.backends.object.s3:factory", "s3"),
    "gs": _Builtin("commitstore.backends.object.gcs:factory", "gcs"),
    "gcs": _Builtin("commitstore.backends.object.gcs:factory", "gcs"),
    "az": _Builtin("commitstore.backends.object.azure:factory", "azure"),
    "abfs": _Builtin("commitstore.backends.object.azure:factory", "azure"),
}
"""The built-in schemes (the table above)."""

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


def schemes() -> list[str]:
    """Every scheme a URL may use: built-in, registered and installed through entry points."""
    names = set(_BUILTIN) | set(_registered)
    names |= {ep.name.lower() for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(s for s in names if s)


def resolve(url: str | os.PathLike[str], options: dict[str, Any]) -> Backend:
    """The backend for ``url``: registered first, then built-in, then entry points.

    Raises:
        ConfigurationError: unknown scheme (with the known ones), a missing extra (with the pip
            command), or an option the backend does not take; all before any I/O.
    """
    text = os.fspath(url)
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    with _lock:
        factory = _registered.get(scheme)
    if factory is None:
        factory = _builtin(scheme) or _entry_point(scheme)
    if factory is None:
        known = ", ".join(f"{s}://" for s in schemes())
        raise ConfigurationError(f"no commit strategy for {scheme}:// URLs (known: {known})")
    spec = _BUILTIN.get(scheme)
    try:
        return factory(text, dict(options))
    except CommitStoreError:
        raise
    except ImportError as exc:  # a dependency imported by the factory itself
        if spec is not None and spec.extra is not None:
            raise ConfigurationError(_missing_extra(scheme, spec)) from exc
        raise ConfigurationError(f"{scheme}:// backend could not be imported: {exc}") from exc
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{scheme}:// options are not valid: {exc}") from exc
