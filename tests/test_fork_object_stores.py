"""A store on S3 or GCS opened (and used) before ``fork()`` works in the child.

Was a bug: s3fs and gcsfs run requests on an event loop of the process that made them and
refuse any other (``RuntimeError: This class is not fork-safe``): in a forked child (a
DataLoader worker, a launcher that forks ranks) ``put_bytes`` and ``list`` raised that untyped
error and ``read_bytes`` a misleading ``CommitError``. Now each process makes its own client
with the store's settings (``backends/object/perprocess.py``). Real servers, a real forked
child; what it committed is read back by the parent.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from typing import Any

import pytest

from commitstore import open_store

_WAIT = 60


def _child_ops(store: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for what, op in (
        ("put_bytes", lambda: store.put_bytes("child.bin", b"c" * 100).name),
        ("list", lambda: sorted(r.name for r in store.list())),
        ("read_bytes", lambda: store.read_bytes("parent.bin").decode()),
    ):
        try:
            out[what] = op()
        except BaseException as exc:
            out[what] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    return out


@pytest.mark.parametrize("server", ["moto", "gcs"])
def test_a_store_opened_before_fork_works_in_the_child(
    request: pytest.FixtureRequest, server: str
) -> None:
    srv = request.getfixturevalue(server)
    store = open_store(srv.url(f"fork-{uuid.uuid4().hex[:8]}"), **srv.options())
    store.put_bytes("parent.bin", b"p" * 10)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        signal.alarm(_WAIT)
        try:
            out = _child_ops(store)
        except BaseException as exc:
            out = {"error": repr(exc)}
        os.write(write_end, json.dumps(out).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        got = json.loads(r.read() or b"{}")
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert got == {
        "put_bytes": "child.bin",
        "list": ["child.bin", "parent.bin"],
        "read_bytes": "p" * 10,
    }
    assert store.read_bytes("child.bin") == b"c" * 100  # the parent's client still works
    assert store.verify().ok


def test_a_fork_while_another_thread_makes_the_client_does_not_hang_the_grandchild(
    moto: Any,
) -> None:
    """A forked child in which one thread is making its S3 client (holding the lock that
    makes clients one at a time) while another thread forks: the grandchild's first request
    must not wait for that lock forever (its thread is not in the grandchild). Was a bug: it
    hung. Here the making thread is stood in for by holding the lock itself."""
    from commitstore.backends.object import perprocess

    store = open_store(moto.url(f"fork-{uuid.uuid4().hex[:8]}"), **moto.options())
    store.put_bytes("parent.bin", b"p")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        signal.alarm(_WAIT)
        held, forked = threading.Event(), threading.Event()

        def maker() -> None:
            with perprocess._LOCK[0]:
                held.set()
                forked.wait(_WAIT)

        t = threading.Thread(target=maker)
        t.start()
        held.wait(_WAIT)
        grand = os.fork()
        if grand == 0:
            signal.alarm(_WAIT)
            names = sorted(r.name for r in store.list())
            os._exit(0 if names == ["parent.bin"] else 3)
        forked.set()
        t.join()
        _, status = os.waitpid(grand, 0)
        os.write(write_end, json.dumps({"grandchild": status}).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        got = json.loads(r.read() or b"{}")
    _, status = os.waitpid(pid, 0)
    assert status == 0 and got == {"grandchild": 0}, got
