"""A fault-injecting FUSE passthrough filesystem, for testing the bridge strategy.

``python -m commitstore.testing.faultfs BACKING MOUNTPOINT CONTROL [ATTR_TIMEOUT]`` mounts
BACKING at MOUNTPOINT (in the foreground, until unmounted) as ``fuse.commitstore-faultfs``.
ATTR_TIMEOUT (seconds, default 1 like libfuse) is how long the kernel caches attributes: with the
default, changes made to BACKING behind the mount's back show through it only after that long, as
on real network clients. Its behaviour is switched at run
time by writing JSON to CONTROL (re-read whenever it changes; counters reset then). Every fault
applies to paths containing its ``match`` string (default: all):

- ``write_eio``:    {"match", "after": N}  write() fails with EIO once a write reaches byte N
- ``write_enospc``: {"match", "after": N}  the same with ENOSPC
- ``short_write``:  {"match", "after": N}  bytes past N are dropped but reported as written
- ``flip_write``:   {"match", "at": N}     the byte at offset N lands flipped, write reports success
- ``write_delay``:  {"match", "seconds"}   each write() sleeps first
- ``read_eio``:     {"match"}              read() fails with EIO
- ``fsync_eio``:    {"match"}              fsync() of a file fails with EIO
- ``fsyncdir_eio``: {"match"}              fsync() of a folder fails with EIO
- ``rename_errno``: {"match", "errno": "EACCES", "times": 2}  the first N renames fail
- ``link_eperm``:   {"match"}              link() fails with EPERM (as on 9p/drvfs)
- ``mtime_zero``:   {"match"}              stat() reports st_mtime 0
- ``nth_request``:  {"match", "n": N, "errno": "EIO"}  the N-th request of any kind (getattr,
  open, write, fsync, rename, release...) on a matching path fails with that errno, or with
  ``"errno": "SIGKILL"`` the process that sent it is killed (SIGKILL; a request the kernel
  sent on its own, with no process, kills the sender of the next one) and the request fails
  with EIO; with ``"log": true`` every counted request is logged as {"op": "request", "path",
  "n", "kind"} (``n: 0`` counts and logs only). A request the fault hit is logged as
  {"op": "nth_request", "path", "kind", "pid"}.

Every operation that changes something is appended to CONTROL + ".log" as a JSON line
({"op", "path", ...}), so tests can prove what did (and did not) happen, e.g. no copy fallback.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from fuse import FUSE, FuseOSError, Operations, fuse_get_context

UNCOUNTED = frozenset({"init", "destroy"})


class FaultFS(Operations):  # type: ignore[misc]
    """Passthrough to a backing folder, with the faults described in the module docstring."""

    def __init__(self, backing: str, control: str) -> None:
        self.root = os.path.realpath(backing)
        self.control = control
        self._faults: dict[str, dict[str, Any]] = {}
        self._stamp: tuple[float, int] | None = None
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._log = open(control + ".log", "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    # -- control --------------------------------------------------------------------------
    def _fault(self, kind: str, path: str) -> dict[str, Any] | None:
        with self._lock:
            try:
                st = os.stat(self.control)
                stamp = (st.st_mtime, st.st_size)
            except FileNotFoundError:
                stamp = None
            if stamp != self._stamp:
                self._stamp = stamp
                self._counts = {}
                try:
                    with open(self.control, encoding="utf-8") as f:
                        self._faults = json.load(f) or {}
                except (FileNotFoundError, json.JSONDecodeError):
                    self._faults = {}
            fault = self._faults.get(kind)
        if fault is None or fault.get("match", "") not in path:
            return None
        return fault

    def _bump(self, kind: str) -> int:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            return self._counts[kind]

    def _event(self, op: str, path: str, **extra: Any) -> None:
        self._log.write(json.dumps({"op": op, "path": path, **extra}) + "\n")

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def __call__(self, op: str, *args: Any) -> Any:
        """Every request passes here first: ``nth_request`` counts them and fails one."""
        path = args[0] if args and isinstance(args[0], str) else ""
        fault = None if op in UNCOUNTED else self._fault("nth_request", path)
        if fault is not None:
            n = self._bump("nth_request")
            if fault.get("log"):
                self._event("request", path, n=n, kind=op)
            pid = fuse_get_context()[2]
            if n == int(fault.get("n", 0)) or (self._counts.get("kill_next") and pid > 0):
                code = str(fault.get("errno", "EIO"))
                self._event("nth_request", path, kind=op, pid=pid)
                if code == "SIGKILL":
                    # A request the kernel sends on its own (release after close: pid 0)
                    # kills the next process that sends one.
                    self._counts["kill_next"] = int(pid <= 0)
                    if pid > 0:
                        os.kill(pid, signal.SIGKILL)
                    code = "EIO"
                raise FuseOSError(getattr(errno, code))
        return super().__call__(op, *args)

    # -- metadata -------------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._full(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from exc
        keys = (
            "st_atime",
            "st_ctime",
            "st_gid",
            "st_mode",
            "st_mtime",
            "st_nlink",
            "st_size",
            "st_uid",
        )
        attrs = {k: getattr(st, k) for k in keys}
        if self._fault("mtime_zero", path) is not None:
            attrs["st_mtime"] = 0
        return attrs

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._full(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._full(path))

    def statfs(self, path: str) -> dict[str, Any]:
        sv = os.statvfs(self._full(path))
        keys = (
            "f_bavail",
            "f_bfree",
            "f_blocks",
            "f_bsize",
            "f_favail",
            "f_ffree",
            "f_files",
            "f_flag",
            "f_frsize",
            "f_namemax",
        )
        return {k: getattr(sv, k) for k in keys}

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> int:
        os.utime(self._full(path), times)
        return 0

    # -- namespace ------------------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        self._event("mkdir", path)
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        self._event("rmdir", path)
        os.rmdir(self._full(path))
        return 0

    def unlink(self, path: str) -> int:
        self._event("unlink", path)
        os.unlink(self._full(path))
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._full(target))
        return 0

    def link(self, target: str, source: str) -> int:
        if self._fault("link_eperm", target) is not None:
            raise FuseOSError(errno.EPERM)
        self._event("link", target, source=source)
        os.link(self._full(source), self._full(target))
        return 0

    def rename(self, old: str, new: str) -> int:
        fault = self._fault("rename_errno", new)
        if fault is not None and self._bump("rename_errno") <= int(fault.get("times", 1)):
            code = getattr(errno, str(fault.get("errno", "EACCES")))
            self._event("rename_refused", new, source=old, errno=code)
            raise FuseOSError(code)
        self._event("rename", new, source=old)
        os.rename(self._full(old), self._full(new))
        return 0

    # -- files ----------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        return os.open(self._full(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._event("create", path)
        return os.open(self._full(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        if self._fault("read_eio", path) is not None:
            raise FuseOSError(errno.EIO)
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        delay = self._fault("write_delay", path)
        if delay is not None:
            time.sleep(float(delay.get("seconds", 0.01)))
        end = offset + len(data)
        for kind, code in (("write_eio", errno.EIO), ("write_enospc", errno.ENOSPC)):
            fault = self._fault(kind, path)
            if fault is not None and end > int(fault["after"]):
                self._event(kind, path, offset=offset)
                raise FuseOSError(code)
        short = self._fault("short_write", path)
        if short is not None and end > int(short["after"]):
            keep = max(0, int(short["after"]) - offset)
            if keep:
                os.pwrite(fh, data[:keep], offset)
            self._event("short_write", path, offset=offset, kept=keep)
            return len(data)
        flip = self._fault("flip_write", path)
        if flip is not None and offset <= int(flip["at"]) < end:
            damaged = bytearray(data)
            damaged[int(flip["at"]) - offset] ^= 0x01
            self._event("flip_write", path, at=int(flip["at"]))
            return os.pwrite(fh, bytes(damaged), offset)
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with open(self._full(path), "r+b") as f:
            f.truncate(length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        if self._fault("fsync_eio", path) is not None:
            self._event("fsync_eio", path)
            raise FuseOSError(errno.EIO)
        os.fsync(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        if self._fault("fsyncdir_eio", path) is not None:
            self._event("fsyncdir_eio", path)
            raise FuseOSError(errno.EIO)
        return 0


def main() -> None:
    backing, mountpoint, control = sys.argv[1], sys.argv[2], sys.argv[3]
    timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    FUSE(
        FaultFS(backing, control),
        mountpoint,
        foreground=True,
        nothreads=False,
        fsname="faultfs",
        subtype="commitstore-faultfs",
        attr_timeout=timeout,
        entry_timeout=timeout,
        # The kernel sends RELEASE after close() returns, asynchronously: without hard_remove,
        # libfuse turns an unlink that overtakes it into a rename to ".fuse_hiddenNNNN" (seen as
        # a stray file by listings until the release lands). The backing file system unlinks
        # open files itself, so pass unlinks straight through.
        hard_remove=True,
    )


if __name__ == "__main__":
    main()
