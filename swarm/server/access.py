"""Counting 5xx answers: `http_5xx` in `/swarm/v1/status` counters, and one log line each.

Nothing a client does should produce a 5xx (see `errors.py`); the deliberate
ones are 503 `buffer_unavailable` (the disk failed), 504 `generate_timeout` (a
hung engine) and 503 `stopping`. The last is the protocol's "go away, I am
done" (clients stop on it), so it is counted apart (`http_503_stopping`), not
as a 5xx. Chaos tests assert on `http_5xx` and grep the log line, which
survives a `kill -9` of the server where an in-memory counter does not.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from swarm.server.counters import Counters

log = logging.getLogger("swarm.server.access")
MARKER = "HTTP-5XX"


class ServerErrorCounter:
    """Pure ASGI middleware (no buffering, streaming untouched)."""

    def __init__(self, app: Any, counters: Counters) -> None:
        self.app = app
        self.counters = counters

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        status = 0

        async def counting_send(message: dict) -> None:
            nonlocal started, status
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
            elif message["type"] == "http.response.body" and status >= 500:
                self._count(scope, status, _code(message.get("body", b"")))
                status = 0  # once per response
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self._count(scope, 500)  # the outer error middleware turns it into a 500
            raise

    def _count(self, scope: dict, status: int, code: str | None = None) -> None:
        if status == 503 and code == "stopping":
            self.counters.add("http_503_stopping")
            return
        self.counters.add("http_5xx")
        self.counters.add(f"http_{status}")
        log.warning("%s %d %s %s", MARKER, status, scope.get("method"), scope.get("path"))


def _code(body: bytes) -> str | None:
    """The `error.code` of a JSON error body (None for anything else)."""
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
