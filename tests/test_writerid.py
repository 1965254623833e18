"""When a marker's writer is known to be gone (``backends/object/writerid.py``), and when not.

Real processes: a child that runs, one killed with SIGKILL and reaped, one killed but not yet
reaped (a zombie still holds its PID). Statements from elsewhere (another boot, another PID
namespace) or malformed ones never tell that a writer is dead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from commitstore.backends.object.writerid import known_dead, this_writer


def _stated_by_child() -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    code = (
        "import json, sys; from commitstore.backends.object.writerid import this_writer; "
        "print(json.dumps(this_writer()), flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    stated = json.loads(proc.stdout.readline())
    assert isinstance(stated, dict)
    return proc, stated


@pytest.fixture
def child() -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    proc, stated = _stated_by_child()
    try:
        yield proc, stated
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def test_this_process_states_itself() -> None:
    me = this_writer()
    assert me is not None
    assert me["pid"] == os.getpid()
    assert not known_dead(me)


def test_a_running_writer_is_never_dead(
    child: tuple[subprocess.Popen[bytes], dict[str, Any]],
) -> None:
    proc, stated = child
    assert stated["pid"] == proc.pid
    assert not known_dead(stated)


def test_a_killed_and_reaped_writer_is_dead(
    child: tuple[subprocess.Popen[bytes], dict[str, Any]],
) -> None:
    proc, stated = child
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert known_dead(stated)


def test_a_killed_writer_not_yet_reaped_is_not_known_dead(
    child: tuple[subprocess.Popen[bytes], dict[str, Any]],
) -> None:
    """A zombie keeps its PID and start time: it is judged by age, as before."""
    proc, stated = child
    os.kill(proc.pid, signal.SIGKILL)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped
    assert not known_dead(stated)


def test_a_running_writer_hidden_by_proc_is_never_dead(
    child: tuple[subprocess.Popen[bytes], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a bug: ``/proc`` mounted with ``hidepid`` (another user's processes unlisted) made a
    running writer's ``/proc/<pid>/stat`` unreadable, which was taken for "no such process":
    its upload was joined or aborted while it ran. Now the kernel is asked whether the PID is
    held; a hidden process is alive as far as anyone can tell."""
    from commitstore.backends.object import writerid

    proc, stated = child
    read = writerid._started
    monkeypatch.setattr(writerid, "_started", lambda pid: None if pid == proc.pid else read(pid))
    assert not known_dead(stated)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert known_dead(stated)  # gone: the kernel says so, /proc or not


def test_a_writer_in_another_time_namespace_is_never_dead() -> None:
    """Was a bug: a writer in a time namespace (``unshare -T --boottime``, as restored or
    containerised processes run) states a start time shifted by its namespace's offset; read
    from outside it differed, so the running writer was taken for a PID reused. Statements
    from another time namespace tell nothing now."""
    code = (
        "import json, sys; from commitstore.backends.object.writerid import this_writer; "
        "print(json.dumps(this_writer()), flush=True); sys.stdin.read()"
    )
    argv = ["unshare", "-T", "--boottime", "100000", "-f", sys.executable, "-c", code]
    if not os.path.exists("/proc/self/ns/time"):
        pytest.skip("this kernel has no time namespaces: no writer can run in another one")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        stated = json.loads(proc.stdout.readline())
        me = this_writer()
        assert me is not None and stated["timens"] != me["timens"]
        assert not known_dead(stated)
        from commitstore.backends.object.writerid import _started

        assert _started(stated["pid"]) != stated["started"]  # read from here: shifted
    finally:
        proc.kill()
        proc.wait(30)


def test_a_pid_held_by_a_process_started_at_another_time_is_dead() -> None:
    me = this_writer()
    assert me is not None
    assert known_dead({**me, "started": me["started"] + 1})


@pytest.mark.parametrize(
    "edit",
    [
        {"boot": "00000000-0000-0000-0000-000000000000"},
        {"pidns": "pid:[1]"},
        {"timens": "time:[1]"},
        {"pid": "1"},
        {"pid": True},
        {"pid": -5},
        {"started": None},
        {"started": 1.5},
    ],
    ids=[
        "other-boot",
        "other-pidns",
        "other-timens",
        "pid-text",
        "pid-bool",
        "pid-negative",
        "no-start",
        "float",
    ],
)
def test_a_statement_from_elsewhere_or_malformed_tells_nothing(
    child: tuple[subprocess.Popen[bytes], dict[str, Any]], edit: dict[str, Any]
) -> None:
    proc, stated = child
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert known_dead(stated)  # the statement as made: dead
    assert not known_dead({**stated, **edit})


@pytest.mark.parametrize("stated", [None, [], "x", {}, {"pid": 1}])
def test_no_statement_tells_nothing(stated: object) -> None:
    assert not known_dead(stated)
