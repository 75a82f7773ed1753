"""A small OpenAI-compatible chat-completions server on loopback, for tests.

It answers ``POST /v1/chat/completions`` (and ``/v1/completions``) with scripted text
and a ``usage`` block whose numbers the test chooses, so a test can check that what
we report equals what the provider sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StubState:
    def __init__(
        self, text: str, prompt_tokens: int, completion_tokens: int, status: int = 200
    ) -> None:
        self.status = status
        self.text = text
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.requests: list[dict[str, Any]] = []


@contextmanager
def openai_stub(
    text: str = "Renewals slipped.",
    prompt_tokens: int = 42,
    completion_tokens: int = 7,
    status: int = 200,
) -> Iterator[tuple[str, StubState]]:
    """The stub's base URL and state; with ``status`` other than 200 every request is
    answered with that HTTP status and an OpenAI-style error body."""
    state = StubState(text, prompt_tokens, completion_tokens, status)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            state.requests.append({"path": self.path, "body": body})
            usage = {
                "prompt_tokens": state.prompt_tokens,
                "completion_tokens": state.completion_tokens,
                "total_tokens": state.prompt_tokens + state.completion_tokens,
            }
            payload = {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "gpt-4o-mini"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": state.text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
            if state.status != 200:
                error = {"message": "stub failure", "type": "server_error", "code": None}
                payload = {"error": error}
            data = json.dumps(payload).encode()
            self.send_response(state.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", state
    finally:
        server.shutdown()
        server.server_close()
