"""Who wrote an upload's proof of life, so that a restart on the same machine need not wait.

An upload's writer rewrites a marker every heartbeat while it lives; a later writer of the same
name resumes the upload only once the marker looks dead, which by age alone takes a few
heartbeats (minutes at the default heartbeat): a process restarted at once, after a SIGKILL or
a crash, would start over instead of resuming. The marker therefore also states its writer
(:func:`this_writer`: the boot, the PID and time namespaces, the PID and the process's start
time), and :func:`known_dead` tells, from a statement made on this same boot and in these same
namespaces, that its process is gone: the kernel has no process with its PID (``kill(pid, 0)``
fails with ``ESRCH``), or the process holding it now started at another time (read where
``/proc`` shows it; start times are only compared within one time namespace, which shifts them).
Any other statement (another machine, another container, another boot or time namespace, a
field missing or malformed, a platform without ``/proc``) tells nothing, and neither does a
process ``/proc`` hides (``hidepid``) or a PID the kernel will not signal (another user's):
the caller ages the marker as before. A process is never judged dead while it runs, so a live
upload is never joined or aborted by this rule; a forged statement can at worst make a live
writer's upload look dead, which the age rule allowed after a few heartbeats anyway, and its
writer's completion then fails loudly (nothing is published).
"""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["known_dead", "this_writer"]


@functools.lru_cache(maxsize=1)
def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _namespace(kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None


def _exists(pid: int) -> bool:
    """False only when the kernel has no process ``pid`` (in this PID namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process, alive
        return True
    return True


def _started(pid: int) -> int | None:
    """The start time (clock ticks after boot) of process ``pid``; None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    try:
        return int(fields[19])  # field 22 of proc_pid_stat(5)
    except (IndexError, ValueError):
        return None


def this_writer() -> dict[str, Any] | None:
    """This process as a marker states it: ``{"boot", "pidns", "timens", "pid", "started"}``
    (``timens`` None on a kernel without time namespaces); None where the platform does not
    tell (no ``/proc``)."""
    boot, pidns, pid = _boot_id(), _namespace("pid"), os.getpid()
    started = _started(pid)
    if boot is None or pidns is None or started is None:
        return None
    return {
        "boot": boot,
        "pidns": pidns,
        "timens": _namespace("time"),
        "pid": pid,
        "started": started,
    }


def known_dead(stated: object) -> bool:
    """True only when ``stated`` (a marker's writer, untrusted) was made on this boot and in
    these PID and time namespaces, and its process is gone: the kernel has no process with its
    PID, or ``/proc`` shows the one that has it started at another time. False whenever that
    cannot be known (a process ``/proc`` hides is alive as far as this can tell)."""
    if not isinstance(stated, dict):
        return False
    here = this_writer()
    pid, started = stated.get("pid"), stated.get("started")
    if here is None or any(stated.get(k) != here[k] for k in ("boot", "pidns", "timens")):
        return False
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if not isinstance(started, int) or isinstance(started, bool):
        return False
    if not _exists(pid):
        return True
    now = _started(pid)
    return now is not None and now != started
