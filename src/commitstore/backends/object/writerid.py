"""Who wrote an upload's proof of life, so that a restart on the same machine need not wait.

An upload's writer rewrites a marker every heartbeat while it lives; a later writer of the same
name resumes the upload only once the marker looks dead, which by age alone takes a few
heartbeats (minutes at the default heartbeat): a process restarted at once, after a SIGKILL or
a crash, would start over instead of resuming. The marker therefore also states its writer
(:func:`this_writer`: the boot, the PID namespace, the PID and the process's start time), and
:func:`known_dead` tells, from a statement made on this same boot and in this same PID
namespace, that its process is gone (no such PID, or a PID now held by a process started at
another time). Any other statement (another machine, another container, another boot, a
field missing or malformed, a platform without ``/proc``) tells nothing: the caller ages the
marker as before. A process is never judged dead while it runs, so a live upload is never
joined or aborted by this rule; a forged statement can at worst make a live writer's upload
look dead, which the age rule allowed after a few heartbeats anyway, and its writer's
completion then fails loudly (nothing is published).
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


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


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
    """This process as a marker states it: ``{"boot", "pidns", "pid", "started"}``; None where
    the platform does not tell (no ``/proc``)."""
    boot, pidns, pid = _boot_id(), _pid_namespace(), os.getpid()
    started = _started(pid)
    if boot is None or pidns is None or started is None:
        return None
    return {"boot": boot, "pidns": pidns, "pid": pid, "started": started}


def known_dead(stated: object) -> bool:
    """True only when ``stated`` (a marker's writer, untrusted) was made on this boot and in
    this PID namespace, and its process is gone: no process has its PID, or the one that has
    it started at another time. False whenever that cannot be known."""
    if not isinstance(stated, dict):
        return False
    here = this_writer()
    pid, started = stated.get("pid"), stated.get("started")
    if here is None or stated.get("boot") != here["boot"] or stated.get("pidns") != here["pidns"]:
        return False
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if not isinstance(started, int) or isinstance(started, bool):
        return False
    now = _started(pid)
    return now is None or now != started
