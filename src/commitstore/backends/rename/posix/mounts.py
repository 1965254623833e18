"""Which filesystem a local path is on, from ``/proc/self/mountinfo``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

BRIDGE_TYPES = frozenset({"9p", "drvfs", "cifs", "smb3", "smbfs", "nfs", "nfs4", "fuse", "fuseblk"})
"""Mount types that look local but behave like network storage (plus every ``fuse.*``)."""

SINGLE_HOST_BRIDGES = frozenset({"fuseblk"})
"""Bridge types whose storage only this host reaches (a FUSE driver over a local block device,
such as ntfs-3g): what this host's kernel and daemon serialise is all there is."""


@dataclass(frozen=True, slots=True)
class Mount:
    """The mount that contains a path."""

    mount_point: str
    fstype: str

    @property
    def is_bridge(self) -> bool:
        """True for network and FUSE filesystems mounted as local paths."""
        return self.fstype in BRIDGE_TYPES or self.fstype.startswith("fuse.")

    @property
    def single_host(self) -> bool:
        """True when no other host can write the same files: a local filesystem, or a bridge
        over a local device (:data:`SINGLE_HOST_BRIDGES`). False for 9p, drvfs, CIFS/SMB, NFS and
        FUSE file systems in general (sshfs, rclone, gcsfuse: a remote side others may write)."""
        return not self.is_bridge or self.fstype in SINGLE_HOST_BRIDGES


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Mount points and types, in the order listed (later entries shadow earlier ones)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mounts.append(Mount(_unescape(fields[4]), right.split()[0]))
    return mounts


def mount_of(path: str, mountinfo: str | None = None) -> Mount | None:
    """The mount containing ``path`` (which need not exist yet), or None if unknown."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                mountinfo = f.read()
        except OSError:
            return None
    real = os.path.realpath(path)  # resolves the part that exists, keeps the rest
    best: Mount | None = None
    for m in parse_mountinfo(mountinfo):
        mp = m.mount_point.rstrip("/") or "/"
        inside = real == mp or real.startswith(mp + "/") or mp == "/"
        if inside and (best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/")):
            best = m
    return best
