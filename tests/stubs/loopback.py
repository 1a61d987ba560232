"""What every local HTTP stub of the tests is made of: a handler that keeps no access log
and a server on a free loopback port, serving from a thread of its own."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


def loopback_server(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer on 127.0.0.1, port 0 (the kernel picks a free one); requests
    are answered on daemon threads, which never keep the test run from ending."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server


def serve_in_background(server: ThreadingHTTPServer) -> ThreadingHTTPServer:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
