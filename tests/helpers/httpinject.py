"""An HTTP forwarder of the project's own, between a client and a real server on 127.0.0.1:
every request goes to the server and its answer comes back unchanged (``Location`` rewritten
to point here), except requests ``rule`` picks, which get the status ``rule`` returns instead,
without reaching the server. Used to make a real server's answer to one request another one."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Rule = Callable[[str, str, dict[str, str]], int | None]
"""``rule(method, path, headers)``: a status to answer instead, or None to forward."""


class AnswerInjector:
    def __init__(self, upstream_port: int, rule: Rule) -> None:
        self.upstream_port = upstream_port
        self.rule = rule
        self.injected: list[tuple[str, str, int]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = dict(self.headers.items())
                status = outer.rule(self.command, self.path, headers)
                if status is not None:
                    outer.injected.append((self.command, self.path, status))
                    doc = b'{"error": {"code": %d, "message": "injected"}}' % status
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    self.wfile.write(doc)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", outer.upstream_port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("content-length", "transfer-encoding", "connection"):
                        continue
                    here = f":{outer.port}"
                    shown = (
                        v.replace(f":{outer.upstream_port}", here) if k.lower() == "location" else v
                    )
                    self.send_header(k, shown)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
