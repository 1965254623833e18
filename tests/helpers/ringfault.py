"""Child process of the direct ring's fault tests: ``python -m tests.helpers.ringfault SHIM``,
started with ``LD_PRELOAD=SHIM`` (``tests/faultshim``), one JSON case a line on stdin, one JSON
reply a line on stdout; each case runs in a fork of this warm process.

A case ``{"dir", "k", "err", "gate"}`` stages 96 KiB through the direct writer (8 KiB buffered,
then 8 KiB aligned buffers written by its worker thread) in 3 KiB writes, with the shim armed to
fail the ``k``-th call on the store's files with errno ``err`` (``k == 0``: count and log them;
``err == -9``: SIGKILL the process there). ``gate``: the worker's ``gate``-th buffer write
starts only once the caller has queued the buffer after it, so the fault hits a write with the
next one waiting behind it. The reply: what the stage raised (type, errno of its cause), the
worker threads still alive, the descriptors still open on the store's files, and whether the
gated write saw the next buffer queued (and the shim's call count just before its write).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from commitstore import open_store
from commitstore.backends.rename.posix import _direct
from commitstore.backends.rename.posix import backend as posix
from tests.faultshim.worker import load

KiB = 1024
DATA = bytes(range(256)) * 384  # 96 KiB


def _gated(shim: Any, gate: int, seen: dict[str, Any]) -> type[_direct.DirectWriter]:
    class Gated(_direct.DirectWriter):
        writes = 0
        queued = 0
        cond = threading.Condition()

        def _submit(self, length: int) -> None:
            # _submit queues the buffer, then waits for the next one to be free: count the
            # queueing before that wait (the gated write may be what it waits for)
            pool_submit = self._pool.submit

            def counted(*a: Any, **k: Any) -> Any:
                fut = pool_submit(*a, **k)
                with Gated.cond:
                    Gated.queued += 1
                    Gated.cond.notify_all()
                return fut

            self._pool.submit = counted  # type: ignore[method-assign]
            try:
                super()._submit(length)
            finally:
                self._pool.submit = pool_submit  # type: ignore[method-assign]

        def _write(self, buf: Any, length: int, offset: int) -> None:
            Gated.writes += 1
            if Gated.writes == gate:
                with Gated.cond:
                    Gated.cond.wait_for(lambda: Gated.queued > gate)
                    seen["next_queued"] = Gated.queued > gate
                seen["count_at_gate"] = int(shim.shim_count())  # its write is the next call
            super()._write(buf, length, offset)

    return Gated


def _open_under(root: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            out.append(target)
    return out


def case(shim: Any, req: dict[str, Any]) -> dict[str, Any]:
    root = Path(req["dir"]) / "store"
    store = open_store(root)
    store.put_bytes("w.bin", b"old version")
    posix.DIRECT_AFTER = _direct.BUFFER = 8 * KiB
    # one write in flight by default, so the k-th libc call on the store's files is the same
    # write in the counting run and the armed one; "depth" 2 for a fault at the first direct
    # write, which is the same call at any depth (the calls before it are the caller's alone)
    _direct.DEPTH = int(req.get("depth", 1))
    seen: dict[str, Any] = {}
    setattr(posix, "DirectWriter", _gated(shim, int(req["gate"]), seen))  # noqa: B010
    reply: dict[str, Any] = {}
    shim.shim_arm(str(root).encode(), int(req["k"]), int(req["err"]))
    try:
        with store.stage("w.bin", overwrite=True) as st:
            for i in range(0, len(DATA), 3 * KiB):
                st.write(DATA[i : i + 3 * KiB])
        reply["outcome"] = "ok"
    except BaseException as exc:
        cause = exc.__cause__
        reply["outcome"] = "raised"
        reply["raised"] = type(exc).__name__
        reply["message"] = str(exc)[:300]
        reply["cause_errno"] = getattr(cause, "errno", None)
    finally:
        shim.shim_disarm()
    reply["fired"] = bool(shim.shim_fired())
    reply["calls"] = shim.shim_log().decode(errors="replace").splitlines()
    reply["threads"] = [t.name for t in threading.enumerate() if "direct" in t.name]
    reply["open"] = _open_under(root)
    reply.update(seen)
    return reply


def main() -> None:
    shim = load(sys.argv[1])
    for line in sys.stdin:
        req = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, json.dumps(case(shim, req)).encode())
            os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
        os.close(r)
        _, status = os.waitpid(pid, 0)
        reply = json.loads(data) if data else {"outcome": "killed"}
        reply["killed"] = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
