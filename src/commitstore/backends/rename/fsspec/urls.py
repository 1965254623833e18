"""Factories of the ``fsspec-checked`` strategy: ``sftp://`` / ``ssh://`` (sshfs),
``webdav+http://`` / ``webdav+https://`` / ``webdav://`` / ``dav://`` (webdav4), and any other
scheme fsspec knows, or any URL opened with ``strategy="fsspec"`` (the filesystem's own ``mv``).

Every factory checks its options and URL before any I/O (ConfigurationError), then connects,
creates the root and probes what the move guarantees (``_moves.py``). Passwords come
from the options, the URL or ``COMMITSTORE_SFTP_PASSWORD`` / ``COMMITSTORE_WEBDAV_PASSWORD``,
and never appear in messages, ``describe()`` or reprs.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from commitstore.backends.base import Backend, take_options
from commitstore.backends.rename.fsspec._moves import Mover, translate
from commitstore.backends.rename.fsspec.backend import FsspecBackend
from commitstore.errors import BackendUnavailableError, CommitStoreError, ConfigurationError
from commitstore.layout import redact_url

_DEFAULT = object()


def _split(url: str, shape: str) -> tuple[SplitResult, str, int | None]:
    try:
        parsed = urlsplit(url)
        host, port = parsed.hostname, parsed.port
    except ValueError as exc:
        raise ConfigurationError(f"{shape} ({exc})") from exc
    if not host:
        raise ConfigurationError(shape)
    return parsed, host, port


def _secret(opts: dict[str, Any], parsed: SplitResult, env: str) -> tuple[str | None, str | None]:
    user = opts["username"] or (unquote(parsed.username) if parsed.username else None)
    password = (
        opts["password"]
        or (unquote(parsed.password) if parsed.password else None)
        or os.environ.get(env)
    )
    return user, password


def _connect(what: str, shown: str, fn: Any) -> Any:
    """Run a connecting call; authentication failures are permanent, the rest retryable."""
    try:
        return fn()
    except CommitStoreError:
        raise
    except PermissionError as exc:
        denied = BackendUnavailableError(f"{what} {shown}: authentication failed")
        denied.retryable = False
        raise denied from exc
    except Exception as exc:
        if type(exc).__name__ == "HostKeyNotVerifiable":
            untrusted = BackendUnavailableError(
                f"{what} {shown}: the server's host key is not in known_hosts (pass "
                "known_hosts=<file> or known_hosts=None to accept any key)"
            )
            untrusted.retryable = False
            raise untrusted from exc
        raise translate(exc, what, shown) from exc


def sftp_factory(url: str, options: dict[str, Any]) -> Backend:
    """``sftp://[user@]host[:port]/absolute/path`` through sshfs. Options: ``username``,
    ``password``, ``port``, ``client_keys``, ``passphrase``, ``known_hosts`` (asyncssh's: by
    default ``~/.ssh/known_hosts`` must know the server; None accepts any host key),
    ``readback``, ``timeout``."""
    opts = take_options(
        options,
        {
            "username": None,
            "password": None,
            "port": None,
            "client_keys": None,
            "passphrase": None,
            "known_hosts": _DEFAULT,
            "readback": False,
            "timeout": 30.0,
        },
        kinds={"port": (int, None)},
    )
    parsed, host, url_port = _split(url, "SFTP URLs look like sftp://[user@]host[:port]/path")
    user, password = _secret(opts, parsed, "COMMITSTORE_SFTP_PASSWORD")
    try:
        port = int(opts["port"] or url_port or 22)
        timeout = float(opts["timeout"])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"the port and timeout options must be numbers ({exc})") from exc
    root = "/" + unquote(parsed.path).strip("/")
    from sshfs import SSHFileSystem  # the sftp extra

    from commitstore.backends.rename.fsspec._moves import SftpMover

    kwargs: dict[str, Any] = {"port": port, "timeout": timeout, "connect_timeout": timeout}
    for key, value in (("username", user), ("password", password)):
        if value is not None:
            kwargs[key] = value
    for key in ("client_keys", "passphrase"):
        if opts[key] is not None:
            kwargs[key] = opts[key]
    checked = opts["known_hosts"] is not None
    kwargs["known_hosts"] = () if opts["known_hosts"] is _DEFAULT else opts["known_hosts"]
    shown = f"sftp://{user + '@' if user else ''}{host}:{port}{root.rstrip('/')}"

    def connect() -> FsspecBackend:
        fs = SSHFileSystem(host, skip_instance_cache=True, **kwargs)
        # The root is made now: SftpMover probes posix-rename with two files inside it.
        fs.makedirs(root, exist_ok=True)
        backend = FsspecBackend(
            fs,
            root,
            SftpMover(fs, root),
            shown=shown,
            readback=bool(opts["readback"]),
            reason="sftp:// URL (sshfs; fsync, fresh-stat size check, SFTP rename/posix-rename)",
        )
        backend.extra = {"user": user, "host_key_checked": checked}
        return backend

    backend: FsspecBackend = _connect("connecting to", shown, connect)
    return backend


def webdav_factory(url: str, options: dict[str, Any]) -> Backend:
    """``webdav+http://[user@]host[:port]/path`` (and ``webdav+https://``; ``webdav://`` and
    ``dav://`` mean https) through webdav4. Options: ``username``, ``password``, ``readback``,
    ``timeout``, ``verify`` (TLS certificate check, default True)."""
    opts = take_options(
        options,
        {"username": None, "password": None, "readback": False, "timeout": 30.0, "verify": True},
        kinds={"verify": (bool, str)},
    )
    shape = "WebDAV URLs look like webdav+https://[user@]host[:port]/path"
    parsed, host, port = _split(url, shape)
    scheme = parsed.scheme.lower()
    http = "http" if scheme == "webdav+http" else "https"
    user, password = _secret(opts, parsed, "COMMITSTORE_WEBDAV_PASSWORD")
    try:
        timeout = float(opts["timeout"])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"the timeout option must be a number ({exc})") from exc
    netloc = f"[{host}]" if ":" in host else host
    base = f"{http}://{netloc}{f':{port}' if port else ''}"
    root = unquote(parsed.path).strip("/")
    from webdav4.fsspec import WebdavFileSystem  # the webdav extra

    from commitstore.backends.rename.fsspec._moves import WebdavMover

    auth = (user, password) if user is not None else None
    shown = f"{scheme}://{user + '@' if user else ''}{netloc}{f':{port}' if port else ''}/{root}"

    def connect() -> FsspecBackend:
        fs = WebdavFileSystem(
            base,
            auth=auth,
            timeout=timeout,
            verify=opts["verify"],
            retry=False,
            skip_instance_cache=True,
        )
        resp = fs.client.http.request("OPTIONS", fs.client.join_url(""))
        if resp.status_code in (401, 403):
            denied = BackendUnavailableError(
                f"connecting to {shown}: authentication failed (HTTP {resp.status_code})"
            )
            denied.retryable = False
            raise denied
        if resp.status_code >= 500:
            raise BackendUnavailableError(f"connecting to {shown}: HTTP {resp.status_code}")
        dav = {c.strip() for c in resp.headers.get("DAV", "").split(",") if c.strip()}
        if "1" not in dav:
            raise ConfigurationError(
                f"{shown}: the server does not speak WebDAV (no DAV class 1 in its OPTIONS "
                f"answer, HTTP {resp.status_code})"
            )
        backend = FsspecBackend(
            fs,
            root or "/",
            WebdavMover(fs),
            shown=shown.rstrip("/"),
            readback=bool(opts["readback"]),
            reason="webdav URL (webdav4; fresh-stat size check, MOVE)",
        )
        backend.extra = {"user": user, "dav": sorted(dav)}
        return backend

    backend: FsspecBackend = _connect("connecting to", shown, connect)
    return backend


def _native_move(fs: Any) -> bool:
    """True when the filesystem class defines its own move (not fsspec's copy, then delete)."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.spec import AbstractFileSystem

    cls = type(fs)
    if cls.mv is not AbstractFileSystem.mv:
        return True
    own = getattr(cls, "_mv", None)
    return own is not None and own is not getattr(AsyncFileSystem, "_mv", None)


def generic_factory(url: str, options: dict[str, Any]) -> Backend:
    """Any URL fsspec can open, with the filesystem's own ``mv`` as the commit. Options:
    ``readback``, ``allow_copy_move`` (accept a filesystem whose move copies, then deletes);
    every other option goes to the fsspec filesystem."""
    ours = {k: options.pop(k) for k in ("readback", "allow_copy_move") if k in options}
    readback, allow_copy = bool(ours.get("readback")), bool(ours.get("allow_copy_move"))
    shown = redact_url(url)
    from fsspec.core import url_to_fs

    try:
        fs, root = url_to_fs(url, skip_instance_cache=True, **options)
    except ImportError as exc:
        raise ConfigurationError(f"{shown}: {exc}") from exc
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{shown}: the fsspec options are not valid ({exc})") from exc
    except Exception as exc:
        raise translate(exc, "connecting to", shown) from exc
    mover = Mover(fs)
    if not _native_move(fs):
        if not allow_copy:
            raise ConfigurationError(
                f"{shown}: {type(fs).__name__} moves by copying, then deleting, so a commit "
                "there is not one step; pass allow_copy_move=True to accept that"
            )
        mover.kind = "fsspec mv (copy, then delete)"
        mover.notes.append(
            "the move copies, then deletes: a crash mid-move leaves a partial file under the "
            "name (it never verifies: its size or digest differs from every record)"
        )
    mover.notes += [
        "replace: the old entry is moved aside (.commitstore.old.<name>) first, then the new "
        "one is moved in: between the two another host may find nothing under the name (a "
        "crash there leaves the old version aside; readers serve it, gc moves it back)",
        "create-only: existence is checked, then the move is made; not atomic",
        "durability: flushed and closed through fsspec; the filesystem's own guarantee",
    ]

    def connect() -> FsspecBackend:
        return FsspecBackend(
            fs,
            root,
            mover,
            shown=shown,
            readback=readback,
            reason=f"{type(fs).__name__} through fsspec (no dedicated strategy, or forced)",
        )

    backend: FsspecBackend = _connect("opening", shown, connect)
    return backend
