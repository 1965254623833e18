"""The warm worker of the fault matrices: ``python -m tests.faultshim.worker [SHIM]``, started
with ``LD_PRELOAD=SHIM`` for the syscall matrix (no argument: the FUSE request matrix, whose
faults faultfs injects).

Reads one JSON request a line on stdin, ``{"op", "dir", "k", "err"}`` (plus ``"control"`` and
``"match"`` for faultfs), and forks a child per request: the child sets the operation's store up
under ``dir/store`` with no fault armed, arms the shim or faultfs (``k == 0``: count and log the
calls or requests; else fail the k-th with errno ``err``, or SIGKILL the child at it for
``err == -9``), runs the operation, disarms, and reports what happened through a pipe. The worker
answers one JSON line on stdout: the child's report, and whether it was killed. Forking a warm
process costs a few milliseconds, where starting an interpreter costs a second.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from commitstore import open_store
from commitstore.backends.rename.posix import _syscalls

from .check import chain
from .ops import OPS


def load(shim_path: str) -> ctypes.CDLL:
    """The preloaded shim, and commitstore's ctypes calls routed through it: ``_syscalls`` looks
    renameat2 and sync_file_range up in libc's own handle, which an LD_PRELOAD library does not
    interpose; the shim's exported functions forward to libc's."""
    shim = ctypes.CDLL(shim_path, use_errno=True)
    shim.shim_log.restype = ctypes.c_char_p
    shim.shim_count.restype = ctypes.c_long
    shim.shim_arm.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int]
    for name in ("_renameat2", "_sync_file_range"):
        original = getattr(_syscalls, name)
        if original is not None:
            fn = getattr(shim, name[1:])
            fn.argtypes, fn.restype = original.argtypes, original.restype
            setattr(_syscalls, name, fn)
    return shim


class ShimFaults:
    """Faults from the preloaded shim: every libc call on the store's files."""

    def __init__(self, shim: ctypes.CDLL, req: dict[str, Any], root: Path) -> None:
        self.shim, self.req, self.root = shim, req, root

    def arm(self) -> None:
        self.shim.shim_arm(str(self.root).encode(), int(self.req["k"]), int(self.req["err"]))

    def pause(self, on: bool) -> None:
        self.shim.shim_pause(int(on))

    def disarm(self, report: dict[str, Any]) -> None:
        self.shim.shim_disarm()
        report["count"] = self.shim.shim_count()
        report["fired"] = bool(self.shim.shim_fired())
        if int(self.req["k"]) == 0:
            report["calls"] = self.shim.shim_log().decode(errors="replace").splitlines()


ERRNO_NAMES = {5: "EIO", 28: "ENOSPC", 13: "EACCES", -9: "SIGKILL"}


class FuseFaults:
    """Faults from faultfs (``nth_request``): every request the kernel sends it for the case's
    folder (``match``). Its control file is switched by rewriting it with a new mtime."""

    def __init__(self, req: dict[str, Any]) -> None:
        self.req = req
        self.control = Path(req["control"])
        self.log = Path(str(self.control) + ".log")
        self.start = self.log.stat().st_size if self.log.exists() else 0
        self.marks: list[int] = []

    def _set(self, faults: dict[str, Any]) -> None:
        self.control.write_text(json.dumps(faults))
        stamp = os.stat(self.control).st_mtime_ns + 1_000_000
        os.utime(self.control, ns=(stamp, stamp))

    def arm(self) -> None:
        k = int(self.req["k"])
        fault = {
            "match": self.req["match"],
            "n": k,
            "errno": ERRNO_NAMES.get(int(self.req["err"]), "EIO"),
        }
        self._set({"nth_request": {**fault, "log": k == 0}})

    def pause(self, on: bool) -> None:
        """The caller's own writes into a staging folder go through the mount too: they are
        counted and may be failed (faultfs cannot tell them apart), so the log offsets of the
        caller's stretch are noted: a fault hit there is the caller's own error."""
        self.marks.append(self.log.stat().st_size)

    def disarm(self, report: dict[str, Any]) -> None:
        self._set({})
        with open(self.log, "rb") as f:
            f.seek(self.start)
            raw = f.read()
        events = [json.loads(line) for line in raw.decode().splitlines() if line]
        if self.marks:  # a failed caller write never reached pause(False)
            a, b = (m - self.start for m in [*self.marks, self.start + len(raw)][:2])
            report["hit_in_caller"] = b'"op": "nth_request"' in raw[a:b]
        requests = [e for e in events if e["op"] == "request"]
        report["count"] = len(requests)
        report["hit_pids"] = [e["pid"] for e in events if e["op"] == "nth_request"]
        report["fired"] = bool(report["hit_pids"])
        if int(self.req["k"]) == 0:
            report["calls"] = [f"{e['kind']} {e['path']}" for e in requests]


def child(shim: ctypes.CDLL | None, req: dict[str, Any]) -> dict[str, Any]:
    op = OPS[req["op"]]
    root = Path(req["dir"]) / "store"
    store = open_store(root, strategy=op.strategy)
    op.setup(store, root)
    faults = ShimFaults(shim, req, root) if shim is not None else FuseFaults(req)
    report: dict[str, Any] = {}
    faults.arm()
    try:
        report["summary"] = op.run(store, faults.pause)
        report["outcome"] = "ok"
    except BaseException as exc:  # the report says what escaped
        report["outcome"] = "raised"
        report["chain"] = chain(exc)
        report["message"] = str(exc)[:500]
    finally:
        faults.disarm(report)
    return report


def run_case(shim: ctypes.CDLL | None, req: dict[str, Any]) -> dict[str, Any]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the worker's loop
        os.close(r)
        try:
            report = child(shim, req)
        except BaseException:
            report = {"outcome": "setup failed", "message": traceback.format_exc()}
        os.write(w, json.dumps(report).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    reply: dict[str, Any] = json.loads(data) if data else {"outcome": "killed"}
    reply["killed"] = killed
    return reply


def main() -> None:
    shim = load(sys.argv[1]) if len(sys.argv) > 1 else None
    for line in sys.stdin:
        reply = run_case(shim, json.loads(line))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
