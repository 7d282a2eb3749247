"""Counting 5xx answers: `http_5xx` in `/swarm/v1/status` counters, and one log line each.

Nothing a client does should produce a 5xx (see `errors.py`); the only
deliberate ones are 503 (stopping, buffer unavailable) and 504 (generation
timeout). Chaos tests assert on this count and grep the log line, which
survives a `kill -9` of the server where an in-memory counter does not.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

log = logging.getLogger("swarm.server.access")
MARKER = "HTTP-5XX"


class ServerErrorCounter:
    """Pure ASGI middleware (no buffering, streaming untouched)."""

    def __init__(self, app: Any, counters: Counter) -> None:
        self.app = app
        self.counters = counters

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counting_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
                if status >= 500:
                    self._count(scope, status)
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self._count(scope, 500)  # the outer error middleware turns it into a 500
            raise

    def _count(self, scope: dict, status: int) -> None:
        self.counters["http_5xx"] += 1
        self.counters[f"http_{status}"] += 1
        log.warning("%s %d %s %s", MARKER, status, scope.get("method"), scope.get("path"))
