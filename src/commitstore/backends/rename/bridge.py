"""Bridge strategy for network filesystems mounted as local paths (9p/drvfs, CIFS, NFS, FUSE).

Same staging-file-and-rename recipe as ``local-rename``, but nothing the filesystem says is taken on
trust: after fsync and close, a fresh stat of the staging file must show every byte written, the
file is re-read past the client cache and its digest compared (``readback=True``, the default), the
rename is retried on EACCES/EPERM/EBUSY (never replaced by a copy), the final name's size is checked
again, and a directory fsync refused with EINVAL/ENOTSUP/EIO is reported as "durability
unconfirmed" instead of failing the commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, BinaryIO

from commitstore.backends.base import Capabilities
from commitstore.backends.rename._localfs import BRIDGE_POLICY, CommitPolicy
from commitstore.backends.rename.mounts import Mount
from commitstore.backends.rename.posix import LocalBackend
from commitstore.layout import Parts


class BridgeBackend(LocalBackend):
    """A folder on a mounted network or FUSE filesystem."""

    strategy = "bridge-checked"
    capabilities = Capabilities(
        atomic_replace=True,
        exclusive_create=True,
        dir_fsync=False,
        atomic_dir_publish=True,
        free_space=True,
    )

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

    def __repr__(self) -> str:
        return f"BridgeBackend({self.root!r})"

    def open_read(self, parts: Parts) -> BinaryIO:
        """Open for reading with the client's cached pages of the file dropped first, so checks
        see what the far side holds."""
        f = super().open_read(parts)
        with contextlib.suppress(OSError):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return f

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["mount"] = (
            {"mount_point": self.mount.mount_point, "fstype": self.mount.fstype}
            if self.mount
            else None
        )
        info["checks"] = {
            "fresh_stat": self.policy.fresh_stat,
            "readback": self.policy.readback,
            "rename_attempts": self.policy.rename_attempts,
            "size_after_rename": self.policy.check_after_rename,
            "dir_fsync_errors_tolerated": ["EINVAL", "ENOTSUP", "EIO"],
        }
        return info
