"""``commitstore demo``: a small simulated training run that shows the contract at work.

1. Train, checkpointing every 10 steps into a local store.
2. A real child process is SIGKILLed in the middle of writing a checkpoint: nothing appears under
   that checkpoint's name; only a staging file is left.
3. Resume from the last whole step (``latest()``), train on.
4. One checkpoint is damaged on disk on purpose: ``verify`` names it, ``latest()`` skips it,
   ``open()`` refuses to hand out its bytes.

Needs no extras and no cloud account. Exit status 0 when every step behaved as promised.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from commitstore import IntegrityError, open_store
from commitstore.layout import META_DIR, STAGING_PREFIX

CKPT_BYTES = 8 * 1024 * 1024
CRASH_BYTES = 256 * 1024 * 1024
CHUNK = 4 * 1024 * 1024
EVERY = 10


def _state(step: int, size: int) -> bytes:
    """Deterministic "model state" for a step (stands in for torch.save output)."""
    block = hashlib.shake_256(f"weights@{step}".encode()).digest(64 * 1024)
    return (block * (size // len(block) + 1))[:size]


def _child(root: str, name: str) -> None:
    """The process that gets killed: writes a large checkpoint slowly, reporting progress."""
    import time

    store = open_store(root)
    block = _state(40, CHUNK)
    with store.stage(name, overwrite=True) as st:
        for i in range(CRASH_BYTES // CHUNK):
            st.write(block)
            print(f"wrote {(i + 1) * CHUNK}", flush=True)
            time.sleep(0.01)


def _say(out: list[str], line: str, quiet: bool) -> None:
    out.append(line)
    if not quiet:
        print(line, flush=True)


def run_demo(directory: str | os.PathLike[str], *, as_json: bool = False) -> int:
    """Run the demo in ``directory`` (its ``store`` subfolder is recreated). Returns exit status."""
    base = Path(directory).resolve()
    root = base / "store"
    if root.exists():
        if not (root / META_DIR).exists():
            print(
                f"commitstore: error: {root} exists and is not a commitstore demo store",
                file=sys.stderr,
            )
            return 1
        shutil.rmtree(root)
    store = open_store(root)
    lines: list[str] = []
    checks: dict[str, bool] = {}
    q = as_json

    _say(lines, f"store: {root} (strategy {store.describe()['strategy']})", q)
    _say(lines, "-- 1. training, checkpoint every 10 steps", q)
    for step in range(EVERY, 31, EVERY):
        with store.stage(f"step_{step:04d}.ckpt", metadata={"loss": round(1 / step, 4)}) as f:
            f.write(_state(step, CKPT_BYTES))
        _say(lines, f"   step {step}: committed step_{step:04d}.ckpt ({CKPT_BYTES} bytes)", q)

    _say(lines, "-- 2. a writer process is killed (SIGKILL) in the middle of step_0040.ckpt", q)
    proc = subprocess.Popen(
        [sys.executable, "-m", "commitstore.demo", "--child", str(root), "step_0040.ckpt"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    written = 0
    for line in proc.stdout:
        written = int(line.split()[1])
        if written >= CRASH_BYTES * 2 // 5:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    staging = [p for p in root.iterdir() if p.name.startswith(STAGING_PREFIX)]
    final_exists = (root / "step_0040.ckpt").exists()
    checks["killed writer left nothing under the final name"] = not final_exists
    checks["killed writer left only a staging file"] = len(staging) == 1
    _say(
        lines,
        f"   killed after {written} of {CRASH_BYTES} bytes; step_0040.ckpt exists: "
        f"{final_exists}; leftover staging: {[p.name for p in staging]}",
        q,
    )

    _say(lines, "-- 3. restart: resume from the newest whole checkpoint", q)
    resumed = open_store(root)
    latest = resumed.latest()
    checks["resumed from step 30"] = latest is not None and latest.step == 30
    start = latest.step if latest is not None and latest.step is not None else 0
    _say(lines, f"   latest() = {latest.name if latest else None}; resuming at step {start}", q)
    state = resumed.read_bytes(latest.name) if latest else b""
    checks["resumed bytes match the committed state"] = state == _state(start, CKPT_BYTES)
    for step in range(start + EVERY, start + 2 * EVERY + 1, EVERY):
        resumed.put_bytes(f"step_{step:04d}.ckpt", _state(step, CKPT_BYTES), overwrite=True)
        _say(lines, f"   step {step}: committed step_{step:04d}.ckpt", q)

    _say(lines, "-- 4. a checkpoint is damaged on disk (one byte flipped in step_0050.ckpt)", q)
    victim = root / "step_0050.ckpt"
    with open(victim, "r+b") as fh:
        fh.seek(CKPT_BYTES // 2)
        byte = fh.read(1)
        fh.seek(CKPT_BYTES // 2)
        fh.write(bytes([byte[0] ^ 0x01]))
    report = resumed.verify()
    bad = {r.name: r.status for r in report.results if r.status != "ok"}
    checks["verify found the damaged checkpoint"] = bad == {"step_0050.ckpt": "hash_mismatch"}
    _say(lines, f"   verify(): {bad}", q)
    latest = resumed.latest()
    checks["latest() skipped it"] = latest is not None and latest.name == "step_0040.ckpt"
    _say(lines, f"   latest() = {latest.name if latest else None}", q)
    try:
        resumed.open("step_0050.ckpt")
        refused = False
    except IntegrityError as exc:
        refused = True
        _say(lines, f"   open('step_0050.ckpt') refused: {exc}", q)
    checks["open() refused the damaged bytes"] = refused

    ok = all(checks.values())
    _say(lines, "-- report", q)
    for what, passed in checks.items():
        _say(lines, f"   [{'ok' if passed else 'FAILED'}] {what}", q)
    _say(lines, "demo: all guarantees held" if ok else "demo: A GUARANTEE FAILED", q)
    if as_json:
        doc: dict[str, Any] = {"ok": ok, "store": str(root), "checks": checks, "log": lines}
        print(json.dumps(doc, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3])
