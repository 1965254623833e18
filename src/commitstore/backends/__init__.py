"""The strategy table: which backend (commit strategy) serves which URL, chosen in one place.

=========================  ==================  ==============================================
URL                        strategy            commit point
=========================  ==================  ==============================================
``/path``, ``file://...``  ``local-rename``    fsync file, rename (no-replace or replace),
                                               fsync directory
  ... on 9p/drvfs/CIFS/    ``bridge-checked``  the same, plus fresh-stat size check, read-back
  NFS/FUSE mounts                              digest, rename retries, size after rename,
                                               dir-fsync errors reported, not fatal
``memory://...``           ``memory-swap``     one swap into the store under a lock
``smb://host/share/...``   ``smb-checked``     SMB2 FLUSH, fresh-stat size check, optional
                                               read-back digest, rename / replace
``s3://bucket/prefix``     ``s3-multipart``    CompleteMultipartUpload (or one PutObject),
                                               create-only where honoured, fresh HEAD size
=========================  ==================  ==============================================

Network shares and object stores add rows here; the facade never looks at URL schemes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from commitstore.backends.base import (
    Backend,
    Capabilities,
    CommitInfo,
    DirSink,
    FileInfo,
    FileSink,
    PendingUpload,
    PutMode,
)
from commitstore.backends.memory import MemoryBackend
from commitstore.backends.rename.bridge import BridgeBackend
from commitstore.backends.rename.mounts import mount_of
from commitstore.backends.rename.posix import LocalBackend
from commitstore.errors import CommitStoreError, InvalidNameError

__all__ = [
    "STRATEGIES",
    "Backend",
    "Capabilities",
    "CommitInfo",
    "DirSink",
    "FileInfo",
    "FileSink",
    "PendingUpload",
    "PutMode",
    "resolve",
]


def _take(options: dict[str, Any], allowed: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InvalidNameError(f"unknown storage options {unknown}; known: {sorted(allowed)}")
    return {**allowed, **options}


def _local(url: str, options: dict[str, Any]) -> Backend:
    opts = _take(options, {"strategy": "auto", "readback": True})
    if url.startswith("file://"):
        parsed = urlsplit(url)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidNameError(f"file:// URL with a remote host is not supported: {url!r}")
        path, how = unquote(parsed.path), "file:// URL"
    else:
        path, how = os.path.expanduser(url), "local path"
    strategy = opts["strategy"]
    if strategy not in ("auto", "local", "bridge"):
        raise InvalidNameError(f"strategy must be 'auto', 'local' or 'bridge', not {strategy!r}")
    mount = mount_of(path)
    where = f"on {mount.fstype} mounted at {mount.mount_point}" if mount else "mount unknown"
    if strategy == "bridge" or (strategy == "auto" and mount is not None and mount.is_bridge):
        why = "strategy='bridge' requested" if strategy == "bridge" else "network/FUSE mount"
        return BridgeBackend(
            path, reason=f"{how} {where} ({why})", mount=mount, readback=bool(opts["readback"])
        )
    why = "strategy='local' requested" if strategy == "local" else "local filesystem"
    return LocalBackend(path, reason=f"{how} {where} ({why})")


def _smb(url: str, options: dict[str, Any]) -> Backend:
    opts = _take(
        options,
        {"username": None, "password": None, "port": None, "readback": False, "timeout": 30.0},
    )
    parsed = urlsplit(url)
    host = parsed.hostname
    path = [p for p in unquote(parsed.path).split("/") if p]
    if not host or not path:
        raise InvalidNameError("SMB URLs look like smb://[user@]host[:port]/share[/path]")
    try:
        from commitstore.backends.rename._smbconn import SmbConnection
        from commitstore.backends.rename.smb import SmbBackend
    except ImportError as exc:
        raise CommitStoreError(
            "smb:// needs the smb extra: pip install 'commitstore[smb]'"
        ) from exc
    username = (
        opts["username"]
        or (unquote(parsed.username) if parsed.username else None)
        or os.environ.get("COMMITSTORE_SMB_USERNAME")
    )
    password = (
        opts["password"]
        or (unquote(parsed.password) if parsed.password else None)
        or os.environ.get("COMMITSTORE_SMB_PASSWORD")
    )
    port = int(opts["port"] or parsed.port or 445)
    conn = SmbConnection(host, port, path[0], username, password, float(opts["timeout"]))
    return SmbBackend(
        conn,
        "/".join(path[1:]),
        readback=bool(opts["readback"]),
        reason="smb:// URL (smbprotocol; flush, fresh-stat size check, rename/replace)",
    )


def _s3(url: str, options: dict[str, Any]) -> Backend:
    opts = _take(
        options,
        {
            "endpoint_url": None,
            "key": None,
            "secret": None,
            "token": None,
            "part_size": 8 * 1024 * 1024,
            "max_inflight": 4,
            "single_put_max": 64 * 1024 * 1024,
            "sign_payload": False,
            "conditional_writes": None,
        },
    )
    if not isinstance(opts["sign_payload"], bool):
        raise InvalidNameError(f"sign_payload must be True or False, not {opts['sign_payload']!r}")
    parsed = urlsplit(url)
    if not parsed.netloc:
        raise InvalidNameError("S3 URLs look like s3://bucket[/prefix]")
    try:
        import s3fs

        from commitstore.backends.object.s3 import S3Backend
    except ImportError as exc:
        raise CommitStoreError("s3:// needs the s3 extra: pip install 'commitstore[s3]'") from exc
    endpoint = (
        opts["endpoint_url"]
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    fs = s3fs.S3FileSystem(
        key=opts["key"],
        secret=opts["secret"],
        token=opts["token"],
        endpoint_url=endpoint,
        skip_instance_cache=True,
        config_kwargs={
            # botocore >= 1.36 checksums break several S3-compatible servers (s3fs#931)
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
            # Bodies carry a Content-MD5 instead of a SHA-256 signature unless asked (backends/s3)
            "s3": {"payload_signing_enabled": bool(opts["sign_payload"])},
        },
    )
    return S3Backend(
        fs,
        parsed.netloc,
        unquote(parsed.path),
        endpoint=endpoint,
        part_size=int(opts["part_size"]),
        max_inflight=int(opts["max_inflight"]),
        single_put_max=int(opts["single_put_max"]),
        sign_payload=bool(opts["sign_payload"]),
        conditional_writes=opts["conditional_writes"],
        reason="s3:// URL (multipart upload completion is the commit)",
    )


def _gcs(url: str, options: dict[str, Any]) -> Backend:
    opts = _take(
        options,
        {
            "endpoint_url": None,
            "token": None,
            "project": None,
            "chunk_size": 64 * 1024 * 1024,
            "conditional_writes": None,
        },
    )
    parsed = urlsplit(url)
    if not parsed.netloc:
        raise InvalidNameError("GCS URLs look like gs://bucket[/prefix]")
    # gcsfs otherwise probes every bucket over gRPC/TLS first (hangs against plain-HTTP servers)
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    try:
        import gcsfs

        from commitstore.backends.object.gcs import GcsBackend
    except ImportError as exc:
        raise CommitStoreError("gs:// needs the gcs extra: pip install 'commitstore[gcs]'") from exc
    endpoint = opts["endpoint_url"] or os.environ.get("STORAGE_EMULATOR_HOST")
    kw: dict[str, Any] = {"skip_instance_cache": True}
    if endpoint:
        kw["endpoint_url"] = endpoint
    if opts["token"] is not None:
        kw["token"] = opts["token"]
    if opts["project"] is not None:
        kw["project"] = opts["project"]
    fs = gcsfs.GCSFileSystem(**kw)
    return GcsBackend(
        fs,
        parsed.netloc,
        unquote(parsed.path),
        chunk_size=int(opts["chunk_size"]),
        conditional_writes=opts["conditional_writes"],
        reason="gs:// URL (the resumable upload's final request is the commit)",
    )


def _azure(url: str, options: dict[str, Any]) -> Backend:
    opts = _take(
        options,
        {
            "connection_string": None,
            "account_url": None,
            "credential": None,
            "block_size": 8 * 1024 * 1024,
            "max_inflight": 4,
            "conditional_writes": None,
            "client_options": {},
        },
    )
    client_options = dict(opts["client_options"])  # e.g. retry_total, initial_backoff
    parsed = urlsplit(url)
    if not parsed.netloc:
        raise InvalidNameError("Azure URLs look like az://container[/prefix]")
    try:
        from azure.storage.blob import BlobServiceClient

        from commitstore.backends.object.azure import AzureBackend
    except ImportError as exc:
        raise CommitStoreError(
            "az:// needs the azure extra: pip install 'commitstore[azure]'"
        ) from exc
    conn = opts["connection_string"] or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if conn:
        service = BlobServiceClient.from_connection_string(conn, **client_options)
    elif opts["account_url"]:
        service = BlobServiceClient(
            opts["account_url"], credential=opts["credential"], **client_options
        )
    else:
        raise InvalidNameError(
            "az:// needs connection_string= (or AZURE_STORAGE_CONNECTION_STRING) or account_url="
        )
    return AzureBackend(
        service.get_container_client(parsed.netloc),
        unquote(parsed.path),
        block_size=int(opts["block_size"]),
        max_inflight=int(opts["max_inflight"]),
        conditional_writes=opts["conditional_writes"],
        reason="az:// URL (commit_block_list is the commit)",
    )


def _memory(url: str, options: dict[str, Any]) -> Backend:
    _take(options, {})
    return MemoryBackend(url[len("memory://") :])


STRATEGIES: dict[str, Callable[[str, dict[str, Any]], Backend]] = {
    "": _local,
    "file": _local,
    "memory": _memory,
    "smb": _smb,
    "s3": _s3,
    "gs": _gcs,
    "gcs": _gcs,
    "az": _azure,
    "abfs": _azure,
}
"""URL scheme -> backend factory. The one table every store is chosen from."""


def resolve(url: str | os.PathLike[str], options: dict[str, Any]) -> Backend:
    """Pick the backend for ``url`` from :data:`STRATEGIES`.

    Raises:
        InvalidNameError: unknown scheme (with the list of known ones), before any I/O.
    """
    text = os.fspath(url)
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    factory = STRATEGIES.get(scheme)
    if factory is None:
        known = ", ".join(f"{s}://" for s in sorted(STRATEGIES) if s)
        raise InvalidNameError(f"no commit strategy for {scheme}:// URLs (known: {known})")
    return factory(text, dict(options))
