"""An HTTP/1.1 fault proxy of the project's own that works request by request (the byte-level
proxy in ``faultproxy.py`` cannot tell requests apart on a kept-alive connection).

Every request head is parsed (its body is forwarded by ``Content-Length``), counted and logged as
``"METHOD /path?query"``. Armed with ``fail(n, how, sticky)``: the n-th request (1-based), and
with ``sticky`` every later one, is not forwarded; the client gets ``how == "error"`` a
``500 InternalError`` answer (an S3 error document; the SDK retries it), or ``how == "drop"`` its
connection closed with no answer (bodies are streamed after the head, so a client waiting for
``100 Continue`` gets it from the server). Responses are relayed unparsed (a client sends its
next request on a connection only after reading the answer, so the count is the order the client
sent them).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from .samba import free_port

ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s"
)
ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>injected by the request fault proxy</Message></Error>"
)


class RequestProxy:
    """Listens on ``self.port``, forwards to ``upstream_port`` on 127.0.0.1."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self.log: list[str] = []
        self.hit: list[str] = []
        """The requests a fault was applied to."""
        self.relayed = 0
        """Bytes relayed from the server to clients (answers' heads and bodies) since the last
        ``count()``/``fail()``."""
        self._n = 0
        self._fail_at: int | None = None
        self._how = "error"
        self._sticky = False
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", self.port))
        self._sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self) -> None:
        """Count and log from now on, failing nothing."""
        self.fail(None)

    def fail(self, n: int | None, how: str = "error", *, sticky: bool = False) -> None:
        with self._lock:
            self._n, self._fail_at, self._how, self._sticky = 0, n, how, sticky
            self.log, self.hit, self.relayed = [], [], 0

    def _relayed(self, n: int) -> None:
        with self._lock:
            self.relayed += n

    def _claim(self, line: str) -> str | None:
        """Count a request; the fault to apply to it, or None."""
        with self._lock:
            self._n += 1
            self.log.append(line)
            at = self._fail_at
            if at is None or self._n < at or (self._n > at and not self._sticky):
                return None
            self.hit.append(line)
            return self._how

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        server: socket.socket | None = None
        try:
            reader = client.makefile("rb")
            while True:
                head = _read_head(reader)
                if head is None:
                    return
                length = _content_length(head)
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                method, target = [*line.split(" "), "", ""][:2]
                fault = self._claim(f"{method} {target}")
                if fault == "drop":
                    return
                if fault == "error":
                    client.sendall(ERROR % (len(ERROR_BODY), ERROR_BODY))
                    return
                if server is None:
                    server = socket.create_connection(self.upstream)
                    threading.Thread(
                        target=_relay, args=(server, client, self._relayed), daemon=True
                    ).start()
                # The head goes first: a client that sent "Expect: 100-continue" waits for the
                # server's answer to it before it sends the body.
                server.sendall(head)
                while length > 0:
                    chunk = reader.read1(min(length, 1 << 16))
                    if not chunk:
                        return
                    server.sendall(chunk)
                    length -= len(chunk)
        except OSError:
            return
        finally:
            for s in (client, server):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        s.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


def _read_head(reader: object) -> bytes | None:
    lines = []
    while True:
        line = reader.readline(65537)  # type: ignore[attr-defined]
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return int(value.strip())
        if key.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            raise OSError("chunked request bodies are not supported by the request proxy")
    return 0


def _relay(
    src: socket.socket, dst: socket.socket, counted: Callable[[int], None] | None = None
) -> None:
    try:
        while data := src.recv(65536):
            if counted is not None:
                counted(len(data))
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)


SMB2_COMMANDS = (
    "NEGOTIATE",
    "SESSION_SETUP",
    "LOGOFF",
    "TREE_CONNECT",
    "TREE_DISCONNECT",
    "CREATE",
    "CLOSE",
    "FLUSH",
    "READ",
    "WRITE",
    "LOCK",
    "IOCTL",
    "CANCEL",
    "ECHO",
    "QUERY_DIRECTORY",
    "CHANGE_NOTIFY",
    "QUERY_INFO",
    "SET_INFO",
    "OPLOCK_BREAK",
)


class SmbMessageProxy:
    """The same per message of SMB2 over TCP (each one framed by a 4-byte length): counted and
    logged by command (``CREATE``, ``WRITE``, ``SET_INFO``...; a compound counts once, by its
    first command), and ``fail(n)`` drops both connections instead of forwarding the n-th (the
    client reconnects; what it retries is its own business)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self.log: list[str] = []
        self.hit: list[str] = []
        self._n = 0
        self._fail_at: int | None = None
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", self.port))
        self._sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self) -> None:
        self.fail(None)

    def fail(self, n: int | None) -> None:
        with self._lock:
            self._n, self._fail_at, self.log, self.hit = 0, n, [], []

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        server: socket.socket | None = None
        try:
            server = socket.create_connection(self.upstream)
            threading.Thread(target=_relay, args=(server, client), daemon=True).start()
            reader = client.makefile("rb")
            while True:
                frame = reader.read(4)
                if len(frame) < 4:
                    return
                body = reader.read(int.from_bytes(frame[1:4], "big"))
                kind = "encrypted"
                if body[:4] == b"\xfeSMB" and len(body) >= 14:
                    code = int.from_bytes(body[12:14], "little")
                    kind = SMB2_COMMANDS[code] if code < len(SMB2_COMMANDS) else str(code)
                with self._lock:
                    self._n += 1
                    self.log.append(kind)
                    drop = self._n == self._fail_at
                    if drop:
                        self.hit.append(kind)
                if drop:
                    return
                server.sendall(frame + body)
        except OSError:
            return
        finally:
            for s in (client, server):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        s.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
