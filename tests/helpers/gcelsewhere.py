"""``gc(min_age=0)`` of a store run in a separate process: a real other process, holding none
of the test's locks, judges the test's writers (alive or dead) as a second host's gc would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

import commitstore

SRC = Path(commitstore.__file__).resolve().parent.parent
ENV = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
"""The environment of a child Python that imports this checkout's commitstore and nothing of
the test's process."""


class GcReport(TypedDict):
    """What the other process's gc did: the paths it removed and, for each entry it kept, the
    path and the reason, both sorted."""

    removed: list[str]
    kept: list[list[str]]


def _code(root: Path) -> str:
    return (
        "import json, commitstore; "
        f"r = commitstore.open_store({str(root)!r}).gc(min_age=0); "
        "print(json.dumps({'removed': sorted(i.path for i in r.removed), "
        "'kept': sorted([i.path, i.reason] for i in r.kept)}))"
    )


def gc_started(root: Path) -> subprocess.Popen[str]:
    """Start ``gc(min_age=0)`` of the store at ``root`` in another process; :func:`gc_result`
    waits for it."""
    return subprocess.Popen(
        [sys.executable, "-c", _code(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def gc_result(proc: subprocess.Popen[str], timeout: float = 300) -> GcReport:
    """The report of a gc :func:`gc_started` started (it must succeed)."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-2000:]
    report: GcReport = json.loads(out)
    return report


def gc_elsewhere(root: Path) -> GcReport:
    """``gc(min_age=0)`` of the store at ``root`` in another process, waited for."""
    return gc_result(gc_started(root))


def kept_reasons(report: GcReport) -> list[str]:
    """The reasons of the entries the gc kept."""
    return [reason for _path, reason in report["kept"]]
