"""Local disks and mounted bridges (``local-rename``, ``bridge-checked``): ``backend`` holds the
POSIX strategy, ``bridge`` the mounted-bridge strategy and the factory that picks one from the
path's mount (``mounts``), the private modules the POSIX plumbing (error translation, walks,
direct I/O, mapped hashing, liveness locks, descriptor-relative reads, raw syscalls)."""

from commitstore.backends.rename.posix.backend import LocalBackend
from commitstore.backends.rename.posix.bridge import BridgeBackend

__all__ = ["BridgeBackend", "LocalBackend"]
