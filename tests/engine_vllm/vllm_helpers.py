"""Helpers the vLLM test modules share (imported by name: conftest puts this folder on sys.path).

`loopback_server` is a real HTTP server in a thread, standing in for vLLM where a test of one
part of the engine (the stream client, the weight publisher) needs only its HTTP side."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def chat_prompt(engine: Any, text: str = "What is 2+3?") -> list[int]:
    """Prompt ids of one user turn, rendered by the engine's own chat template."""
    s = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return engine.tokenizer.encode(s, add_special_tokens=False)


def generate_all(engine: Any, requests: list) -> list:
    """Completions of `requests`, sent to the engine at once (they share its batch)."""

    async def go() -> list:
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    return asyncio.run(go())


class Recorder:
    """What a `loopback_server` was asked: (method, path with query, JSON body or None), in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()

    def routes(self) -> list[str]:
        with self.lock:
            return [path for _method, path, _body in self.calls]


Answer = Callable[[str, str, Any, BaseHTTPRequestHandler], None]


@contextmanager
def loopback_server(answer: Answer) -> Iterator[tuple[str, Recorder]]:
    """A real HTTP server on 127.0.0.1 in a thread: `answer(method, path, body, handler)` writes each
    response (HTTP/1.0: a body without a length ends when the connection closes, as an SSE stream does).
    Yields its URL and the `Recorder` of its calls; shut down and closed on exit."""
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            body = json.loads(raw) if raw else None
            with recorder.lock:
                recorder.calls.append((self.command, self.path, body))
            answer(self.command, self.path, body, self)

        do_GET = do_POST = _handle

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="test-loopback-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def reply(
    handler: BaseHTTPRequestHandler, status: int = 200, body: Any = None, *, content_type: str = "application/json"
) -> None:
    """Write one whole response: `body` as JSON (or bytes/str as is)."""
    data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
