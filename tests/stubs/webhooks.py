"""A webhook receiver of the alert tests: a real HTTP server on a loopback port (from
RESPAWN_TEST_PORTS) that records every request and answers with the codes it is given."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..servers import free_port


class Receiver:
    """A webhook receiver on a loopback port: answers with `codes` in turn (the last one
    repeats), waits `delay` seconds first; records every request."""

    def __init__(self, codes=(200,), delay: float = 0.0, port: int | None = None) -> None:
        self.codes = list(codes)
        self.delay = delay
        self.requests: list[tuple[dict[str, str], bytes, int]] = []
        self.port = port or free_port()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if receiver.delay:
                    time.sleep(receiver.delay)
                code = receiver.codes.pop(0) if len(receiver.codes) > 1 else receiver.codes[0]
                receiver.requests.append((dict(self.headers), body, code))
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def accepted(self) -> list[str]:
        """The delivery ids of the requests answered 2xx."""
        return [h["Respawn-Delivery"] for h, _, code in self.requests if 200 <= code < 300]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
