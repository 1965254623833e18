"""The mounted-bridge strategy (``bridge-checked``: 9p, drvfs, CIFS, NFS, FUSE mounts) and the
factory that picks it or ``local-rename`` from the path's mount (``mounts.py``).

The bridge is the local recipe with every check a network filesystem needs (fresh stat,
read-back digest, rename retries, size after the rename, directory-fsync errors reported rather
than fatal): :data:`BRIDGE_POLICY`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
from typing import Any
from urllib.parse import unquote, urlsplit

from commitstore.backends.base import Backend, Capabilities, CommitInfo, PutMode, take_options
from commitstore.backends.rename.ops import CommitPolicy
from commitstore.backends.rename.posix._waitlock import LOCK_TIMEOUT
from commitstore.backends.rename.posix.backend import LocalBackend
from commitstore.backends.rename.posix.mounts import Mount, mount_of
from commitstore.errors import ConfigurationError
from commitstore.layout import Parts

BRIDGE_POLICY = CommitPolicy(
    rename_attempts=6,
    fresh_stat=True,
    readback=True,
    check_after_rename=True,
    dir_fsync_tolerated=(errno.EINVAL, errno.ENOTSUP, errno.EIO),
)


class BridgeBackend(LocalBackend):
    """A folder on a mounted network or FUSE filesystem."""

    strategy = "bridge-checked"
    capabilities = Capabilities(
        atomic_replace=True,
        exclusive_create=False,
        dir_fsync=False,
        atomic_dir_publish=True,
        free_space=True,
    )
    """``exclusive_create`` is declared per mount (:meth:`__init__`): True only where no other
    host writes the same files (:attr:`Mount.single_host`)."""
    direct_io = False
    """Bridges write through the page cache: what ``O_DIRECT`` means on a FUSE or network
    filesystem varies (some ignore it, some bypass their own consistency with it)."""
    rereads_locally = False
    """Reads go to the far side of the mount (its cached pages are dropped first): a second
    read is a second transfer."""

    def publish_small_from(self, src: Parts, dst: Parts, *, mode: PutMode) -> CommitInfo | None:
        """None: a bridge writes a record anew (``Backend.publish_small_from``), with every
        check of :data:`BRIDGE_POLICY` (fresh stat, read-back, size after the rename) on the
        record's own bytes; a rename on a FUSE or network mount is not taken as the local one."""
        return None

    def put_pending(self, parts: Parts, body: bytes) -> CommitInfo | None:
        """None: a bridge writes the pending record with the staged, checked write of every
        small file (``Backend.put_pending``)."""
        return None

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        reason: str,
        mount: Mount | None,
        readback: bool = True,
    ) -> None:
        super().__init__(root, reason=reason)
        self.mount = mount
        self.policy: CommitPolicy = dataclasses.replace(BRIDGE_POLICY, readback=readback)
        # renameat2(RENAME_NOREPLACE), link() and the flock publish lock are atomic on this
        # host's kernel; on a share other hosts write (9p, drvfs, CIFS, NFS, FUSE in general)
        # neither the no-replace rename (often refused, then link or check-then-rename) nor
        # flock is guaranteed to reach the far side, so create-only is not declared there.
        exclusive = mount is not None and mount.single_host
        self.capabilities = dataclasses.replace(type(self).capabilities, exclusive_create=exclusive)

    def __repr__(self) -> str:
        return f"BridgeBackend({self.root!r})"

    def drop_cached(self, fd: int) -> None:
        """Every file opened to read (``open_read``, a scan's records) has the client's cached
        pages of it dropped first, so checks see what the far side holds."""
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def describe_more(self) -> dict[str, Any]:
        m, p = self.mount, self.policy
        return {
            "mount": {"mount_point": m.mount_point, "fstype": m.fstype} if m else None,
            "checks": {
                "fresh_stat": p.fresh_stat,
                "readback": p.readback,
                "rename_attempts": p.rename_attempts,
                "size_after_rename": p.check_after_rename,
                "dir_fsync_errors_tolerated": [errno.errorcode[e] for e in p.dir_fsync_tolerated],
            },
        }


def factory(url: str, options: dict[str, Any]) -> Backend:
    opts = take_options(
        options,
        {"strategy": "auto", "readback": True, "lock_timeout": LOCK_TIMEOUT},
        choices={"strategy": ("auto", "local", "bridge")},
    )
    lock_timeout = float(opts["lock_timeout"])
    if not math.isfinite(lock_timeout) or lock_timeout <= 0:
        raise ConfigurationError(
            f"lock_timeout must be a number of seconds > 0, not {lock_timeout!r}"
        )
    if url.startswith("file://"):
        parsed = urlsplit(url)
        if parsed.netloc not in ("", "localhost"):
            raise ConfigurationError(f"file:// URL with a remote host is not supported: {url!r}")
        path, how = unquote(parsed.path), "file:// URL"
    else:
        path, how = os.path.expanduser(url), "local path"
    strategy = opts["strategy"]
    if strategy not in ("auto", "local", "bridge"):
        raise ConfigurationError(f"strategy must be 'auto', 'local' or 'bridge', not {strategy!r}")
    mount = mount_of(path)
    where = f"on {mount.fstype} mounted at {mount.mount_point}" if mount else "mount unknown"
    if strategy == "bridge" or (strategy == "auto" and mount is not None and mount.is_bridge):
        why = "strategy='bridge' requested" if strategy == "bridge" else "network/FUSE mount"
        backend: LocalBackend = BridgeBackend(
            path, reason=f"{how} {where} ({why})", mount=mount, readback=bool(opts["readback"])
        )
    else:
        why = "strategy='local' requested" if strategy == "local" else "local filesystem"
        backend = LocalBackend(path, reason=f"{how} {where} ({why})")
    if lock_timeout != LOCK_TIMEOUT:
        backend.lock_timeout = lock_timeout
    return backend
