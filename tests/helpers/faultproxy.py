"""A small TCP fault proxy of the project's own, between a client and a server on 127.0.0.1.

Faults apply to the next ``faulty`` connections (then traffic passes untouched), or to all with
``faulty=None``: ``cut_after`` closes a connection after that many client-to-server bytes,
``reset_after`` resets it (RST), ``flip_every`` inverts one bit of every so many client-to-server
bytes (corruption in transit that TCP did not catch; at most ``flips`` in all, None: no limit),
``delay`` sleeps before forwarding each chunk. ``served`` counts the bytes the server sent back,
``received`` the bytes clients sent to the server.
``freeze()`` makes every connection, open or new, stop forwarding in both directions while
keeping it open (a server that hangs mid-session: a NAS that stopped answering); ``thaw()``
lets traffic pass again.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from commitstore import BackendUnavailableError
from commitstore.testing import Target, record_path, xxh

from .samba import free_port


class FaultProxy:
    """Listens on ``self.port``, forwards to ``upstream_port``."""

    def __init__(self, upstream_port: int, *, port: int | None = None) -> None:
        """``port``: where it listens (a free one by default)."""
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port() if port is None else port
        self.cut_after: int | None = None
        self.reset_after: int | None = None
        self.flip_every: int | None = None
        self.flips: int | None = None
        self.delay = 0.0
        self.faulty: int | None = 0
        self.faulted = 0
        """How many connections a fault was applied to."""
        self.served = 0
        """Bytes the server sent to clients, over all connections so far."""
        self.received = 0
        """Bytes clients sent to the server, over all connections so far."""
        self.frozen = threading.Event()
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", self.port))
        self._sock.listen(64)
        self._stop = threading.Event()
        self._cut = threading.Event()
        self._open: set[socket.socket] = set()
        """The sockets of the connections being forwarded (both ends)."""
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(
        self,
        *,
        cut_after: int | None = None,
        reset_after: int | None = None,
        flip_every: int | None = None,
        flips: int | None = None,
        delay: float = 0.0,
        faulty: int | None = 1,
    ) -> None:
        """Arm faults for the next ``faulty`` connections (None: every connection)."""
        with self._lock:
            self.cut_after, self.reset_after, self.delay = cut_after, reset_after, delay
            self.flip_every, self.flips = flip_every, flips
            self.faulty, self.faulted = faulty, 0

    def clear(self) -> None:
        self.set(faulty=0)

    def freeze(self) -> None:
        """Stop forwarding on every connection (they stay open, nothing is answered)."""
        self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()

    def _claim(self) -> tuple[int | None, int | None, int | None, float]:
        with self._lock:
            if self.faulty is not None and self.faulted >= self.faulty:
                return None, None, None, 0.0
            self.faulted += 1
            return self.cut_after, self.reset_after, self.flip_every, self.delay

    def _take_flip(self) -> bool:
        with self._lock:
            if self.flips is not None:
                if self.flips <= 0:
                    return False
                self.flips -= 1
            return True

    def _corrupt(self, data: bytes, sent: int, every: int) -> bytes:
        """Flip a bit at each multiple of ``every`` in stream offsets [sent, sent + len)."""
        out = bytearray(data)
        for at in range(-(-sent // every) * every or every, sent + len(data), every):
            if self._take_flip():
                out[at - sent] ^= 0x10
        return bytes(out)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pump, args=(client,), daemon=True).start()

    def _pump(self, client: socket.socket) -> None:
        cut, reset, every, delay = self._claim()
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        with self._lock:
            self._open.update((client, server))
        sent = 0
        idle = 0.0
        try:
            while not self._cut.is_set():
                if self.frozen.is_set():
                    if self._stop.wait(0.05):
                        return
                    continue
                ready, _, _ = select.select([client, server], [], [], 0.2)
                if not ready:
                    idle += 0.2
                    if idle >= 30:  # an idle connection is closed, as before
                        return
                    continue
                idle = 0.0
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    if src is client:
                        if delay:
                            time.sleep(delay)
                        limit = cut if cut is not None else reset
                        if limit is not None and sent + len(data) > limit:
                            server.sendall(data[: max(0, limit - sent)])
                            if reset is not None:
                                client.setsockopt(
                                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                                )
                            return
                        if every is not None:
                            data = self._corrupt(data, sent, every)
                        sent += len(data)
                        server.sendall(data)
                        with self._lock:
                            self.received += len(data)
                    else:
                        with self._lock:
                            self.served += len(data)
                        client.sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._open.difference_update((client, server))
            for s in (client, server):
                with contextlib.suppress(OSError):
                    s.close()

    def stop(self, *, cut: bool = False) -> None:
        """Stop accepting (the port is free once this returns); open connections forward what
        is left of their traffic, or with ``cut`` end at once (a killed client's bytes still
        queued here never reach the server)."""
        if cut:
            self._cut.set()
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept, which holds the socket
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            open_now = list(self._open) if cut else []
        for s in open_now:  # wakes a forwarder blocked in a send or a receive
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)


@contextlib.contextmanager
def through_proxy(
    upstream_port: int, target: Callable[[FaultProxy], Target]
) -> Iterator[tuple[Target, FaultProxy]]:
    """A fault proxy in front of ``upstream_port`` and ``target(proxy)``, a target whose store
    talks through it. ``step_0001.pt`` is committed first, through ``target.reopen()`` (the
    artifact the checks expect to survive); the proxy is stopped afterwards."""
    proxy = FaultProxy(upstream_port)
    try:
        t = target(proxy)
        t.reopen().put_bytes("step_0001.pt", b"whole")
        yield t, proxy
    finally:
        proxy.stop()


def check_transient_fault(t: Target, proxy: FaultProxy, fault: str, *, size: int, at: int) -> None:
    """The next two connections break (``fault`` after ``at`` bytes) mid-upload of ``size`` bytes:
    the commit still succeeds, with exactly the bytes written."""
    data = os.urandom(size)
    proxy.set(**{fault: at}, faulty=2)
    rec = t.store.put_bytes("step_0002.pt", data)
    assert proxy.faulted == 2
    assert t.door.read("step_0002.pt") == data
    assert rec.digest == xxh(data)


def check_persistent_fault(t: Target, proxy: FaultProxy, *, size: int, at: int) -> None:
    """Every connection dies after ``at`` bytes: BackendUnavailableError, nothing published, and
    the artifact committed before (``step_0001.pt``) is still the latest."""
    proxy.set(cut_after=at, faulty=None)
    with pytest.raises(BackendUnavailableError):
        t.store.put_bytes("step_0002.pt", os.urandom(size))
    proxy.clear()
    assert t.door.read("step_0002.pt") is None
    assert t.door.read(record_path("step_0002.pt")) is None
    latest = t.reopen().latest()
    assert latest is not None
    assert latest.name == "step_0001.pt"
