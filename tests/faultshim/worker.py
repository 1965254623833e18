"""The warm worker of the syscall fault matrix: ``python -m tests.faultshim.worker SHIM``, started
with ``LD_PRELOAD=SHIM``, commitstore already imported.

Reads one JSON request a line on stdin, ``{"op", "dir", "k", "err"}``, and forks a child per
request: the child sets the operation's store up under ``dir/store`` with the shim disarmed,
arms it (``k == 0``: count and log the calls; else fail the k-th with errno ``err``, or SIGKILL
itself at it for ``err == -9``), runs the operation, disarms, and reports what happened through
a pipe. The worker answers one JSON line on stdout: the child's report, and whether it was killed.
Forking a warm process costs a few milliseconds, where starting an interpreter costs a second.
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

from commitstore import CommitStoreError
from commitstore.backends.rename import _syscalls

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


def chain(exc: BaseException) -> list[list[Any]]:
    """``[type name, errno, typed]`` of the exception and each one it was raised from."""
    out: list[list[Any]] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 8:
        out.append(
            [type(seen).__name__, getattr(seen, "errno", None), isinstance(seen, CommitStoreError)]
        )
        seen = seen.__cause__ or seen.__context__
    return out


def child(shim: ctypes.CDLL, req: dict[str, Any]) -> dict[str, Any]:
    op = OPS[req["op"]]
    root = Path(req["dir"]) / "store"
    store = op.setup(root)
    report: dict[str, Any] = {}
    shim.shim_arm(str(root).encode(), int(req["k"]), int(req["err"]))
    try:
        report["summary"] = op.run(store, lambda on: shim.shim_pause(int(on)))
        report["outcome"] = "ok"
    except BaseException as exc:  # the report says what escaped
        report["outcome"] = "raised"
        report["chain"] = chain(exc)
        report["message"] = str(exc)[:500]
    finally:
        shim.shim_disarm()
    report["count"] = shim.shim_count()
    report["fired"] = bool(shim.shim_fired())
    if int(req["k"]) == 0:
        report["calls"] = shim.shim_log().decode(errors="replace").splitlines()
    return report


def run_case(shim: ctypes.CDLL, req: dict[str, Any]) -> dict[str, Any]:
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
    shim = load(sys.argv[1])
    for line in sys.stdin:
        reply = run_case(shim, json.loads(line))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
