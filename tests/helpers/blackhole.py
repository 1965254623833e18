"""A blackholed endpoint: a TCP server on 127.0.0.1 that accepts every connection and never
answers (a hung NAS or gateway). It reads and discards what it is sent, so a request's body is
delivered whole and the client then waits for an answer that never comes; connections stay open
until :meth:`Blackhole.stop`."""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any


class Blackhole:
    """``with Blackhole() as hole:`` then ``hole.url`` (``http://127.0.0.1:<port>``)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted = 0
        """Connections accepted so far."""
        self.received = 0
        """Bytes received (and dropped) so far."""
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="blackhole", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    try:
                        conn, _ = sock.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(False)
                    self.accepted += 1
                    self._sel.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(1 << 16)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data:
                    self.received += len(data)
                else:  # the client gave up: forget the connection
                    self._sel.unregister(sock)
                    sock.close()
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def within(fn: Callable[[], Any], bound: float) -> Any:
    """Run ``fn`` in a thread; fail if it has not returned (or raised) within ``bound`` seconds
    (an outer bound against a hang, never a speed check). Returns or raises what ``fn`` did."""
    done = threading.Event()
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(bound), f"{fn} did not return within {bound}s"
    if errors:
        raise errors[0]
    return out[0]
