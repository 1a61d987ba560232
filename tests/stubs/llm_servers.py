"""Local HTTP servers that speak just enough of the OpenAI and Anthropic protocols for the
real SDKs to talk to them. Each records every request (headers and raw body) and answers
with the replies a test scripted, in order; nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from .loopback import QuietHandler, loopback_server

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP response; `delay` seconds pass before it is sent."""

    status: int = 200
    body: Any = None  # a dict or list is sent as JSON, str or bytes as they are
    content_type: str = "application/json"
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body).encode()


@dataclass(frozen=True)
class Recorded:
    """One request as the stub received it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


class StubServer:
    """A ThreadingHTTPServer on 127.0.0.1, port 0, serving one POST path from a thread."""

    def __init__(self, path: str, respond: Callable[[Recorded], Reply] | None = None) -> None:
        self.path = path
        # Answers a request when no scripted reply is left (a stub that decides from what
        # it was sent, for runs whose number of calls a crash changes).
        self.respond = respond
        self.requests: list[Recorded] = []
        self._replies: list[Reply] = []
        self._lock = threading.Lock()
        # Set on stop, so a reply that is still sleeping (a timeout test) ends at once.
        self._stopping = threading.Event()
        self._server = loopback_server(self._handler())
        self._thread = threading.Thread(
            # A short poll: shutdown() waits for the loop's next look at its flag.
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"stub{path}",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def script(self, *replies: Reply) -> None:
        """Queue replies; each request takes the next one."""
        with self._lock:
            self._replies.extend(replies)

    def bodies(self) -> list[Any]:
        return [r.json for r in self.requests]

    def start(self) -> StubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_reply(self, recorded: Recorded) -> Reply:
        with self._lock:
            self.requests.append(recorded)
            if recorded.path != self.path:
                return Reply(404, {"error": {"message": f"stub serves only {self.path}"}})
            if not self._replies and self.respond is not None:
                return self.respond(recorded)
            if not self._replies:
                return Reply(500, {"error": {"message": "stub: no scripted reply left"}})
            return self._replies.pop(0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                recorded = Recorded(
                    method="POST",
                    path=self.path.split("?", 1)[0],
                    headers={k.lower(): v for k, v in self.headers.items()},
                    raw=self.rfile.read(length),
                )
                reply = stub._next_reply(recorded)
                if reply.delay and stub._stopping.wait(reply.delay):
                    return
                body = reply.encoded()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(body)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): nothing to answer

        return Handler


# --- Protocol replies -------------------------------------------------------------------


def openai_reply(
    text: str | None = None,
    tool_calls: tuple[tuple[str, str, Any], ...] = (),
    *,
    usage: tuple[int, int] | None = (12, 5),
    model: str = "gpt-4o-mini",
) -> Reply:
    """A Chat Completions response; tool call arguments given as str are sent verbatim."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for call_id, name, args in tool_calls
        ]
    body: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
    }
    if usage is not None:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        }
    return Reply(body=body)


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> Reply:
    return Reply(status, {"error": {"message": message, "type": kind, "param": None, "code": None}})


def anthropic_reply(
    text: str | None = None,
    tool_uses: tuple[tuple[str, str, Any], ...] = (),
    *,
    usage: tuple[int, int] = (12, 5),
    model: str = "claude-sonnet-4-5",
) -> Reply:
    """A Messages API response: a text block (if any), then one tool_use block per call."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
        for call_id, name, arguments in tool_uses
    ]
    return Reply(
        body={
            "id": "msg_stub",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": "tool_use" if tool_uses else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }
    )


def anthropic_error(status: int, message: str, kind: str = "invalid_request_error") -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message}})


# --- Fixtures ---------------------------------------------------------------------------


def isolate_sdk_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's SDK settings and proxies out: the SDKs read them on their own."""
    for name in list(os.environ):
        upper = name.upper()
        if upper.startswith(("OPENAI_", "ANTHROPIC_")) or upper in {
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
        }:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch):
    isolate_sdk_environment(monkeypatch)
    with StubServer(OPENAI_PATH) as server:
        yield server


@pytest.fixture
def anthropic_server(monkeypatch: pytest.MonkeyPatch):
    isolate_sdk_environment(monkeypatch)
    with StubServer(ANTHROPIC_PATH) as server:
        yield server
