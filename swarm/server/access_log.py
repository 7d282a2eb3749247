"""`OUT/access.jsonl`: one JSON line per HTTP request the app answered.

Why: without it nobody can see afterwards which requests got which status (issue 23, item 7).
server.log holds only what went wrong on the server's side (`access.py` counts the 5xx);
a client's 409s, 429s and 400s, and how long each call took, were nowhere.

A line, written when the response's last byte is sent (or the app raised):

    {"ts": 1764150000.123, "method": "POST", "route": "/v1/chat/completions",
     "path": "/v1/chat/completions", "status": 400, "code": "context_length_exceeded",
     "ms": 3.1, "episode": "4f0c...", "model": "tiny-qwen2"}

* `route` is the matched route's template (`/swarm/v1/episodes/{episode_id}/finish`), null when
  no route matched (a 404 of an unknown path, or a 413/400 answered before routing); `path`
  is the path as sent, cut at `MAX_PATH` characters.
* `code` is the JSON error body's `error.code` (null for a success or a body without one).
* `ms` runs from the request's arrival at the app to its last body byte: a stream's whole length.
* `episode`: the path's `{episode_id}`, else the id in an episode key (`rk.<id>.<epoch>.<sig>`, read,
  not verified: the status says whether the key was good), else a claim's answer's `episode_id`.
* `model`: the answer's `model`, else the request body's top-level `model`.
* `episodes`, on the batch routes' lines only (`/swarm/v1/claims`, `/swarm/v1/finishes`, whose
  `episode` is null): every `episode_id` its request or its answer names, in order (a claims batch:
  the episodes it handed out; a finishes batch: those it was asked to finish, refused ones too),
  at most `MAX_BATCH`. Without it a fleet's coalesced finishes could not be told apart afterwards.

Never logged: headers (tokens, keys), query strings, bodies. The file is opened on the first
request, appended to line by line (each line reaches the kernel when written, so a `kill -9`
loses none), and rotated when it would pass `max_bytes`: `access.jsonl` becomes
`access.jsonl.1`, the older ones move up, and at most `backups` are kept, so the log
holds at most (backups + 1) x max_bytes. A disk that refuses it turns the log off with one
warning: no request ever fails because of its own log line.

Only the parse-level 400s of `http_protocol.py` never reach it: uvicorn answers those before any app runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from swarm.protocol import MAX_BATCH

log = logging.getLogger("swarm.server")

ACCESS_LOG_FILE = "access.jsonl"
#: rotate when the file would pass this size (the default keeps at most 4 x 32 MiB)
MAX_BYTES = 32 * 1024 * 1024
BACKUPS = 3
#: a request path longer than this is cut in the log
MAX_PATH = 256
#: response bodies read for `error.code`, `model` and `episode_id` when no larger than this (a JSON answer)
MAX_ANSWER_BYTES = 16 * 1024
#: request bodies up to this size are parsed for `model`; a larger one is scanned for it chunk by chunk
MAX_PARSED_REQUEST = 64 * 1024
#: a top-level-looking `"model": "..."` in a large request body (a key: a quote inside a JSON string is escaped)
MODEL_KEY = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){0,200})"')
#: the batch routes, whose lines list the episodes they touched (`episodes`)
BATCH_ROUTES = frozenset({"/swarm/v1/claims", "/swarm/v1/finishes"})
#: an `"episode_id": "..."` in a batch's answer or request (ids are hex; a key or a reason never matches)
EPISODE_ID = re.compile(rb'"episode_id"\s*:\s*"([0-9A-Za-z_-]{1,64})"')


class AccessLog:
    """An append-only JSON-lines file rotated by size; thread-safe (a lock around each write)."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
        if max_bytes <= 0 or backups < 0:
            raise ValueError("max_bytes must be > 0 and backups >= 0")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._file: Any = None
        self._size = 0
        self._broken = False

    def write(self, entry: dict[str, Any]) -> None:
        """Append one line; never raises (a failing disk turns the log off with one warning)."""
        line = (json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            if self._broken:
                return
            try:
                if self._file is None:
                    self._open()
                if self._size and self._size + len(line) > self.max_bytes:
                    self._rotate()
                self._file.write(line)
                self._size += len(line)
            except OSError as exc:
                self._broken = True
                self._close()
                log.warning("access log %s turned off: %s", self.path, exc)

    def close(self) -> None:
        with self._lock:
            self._close()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab", buffering=0)  # unbuffered: each line is one write(2)
        self._size = self._file.tell()

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def _rotate(self) -> None:
        self._close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for k in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{k}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{k + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._open()


class AccessLogMiddleware:
    """Pure ASGI middleware writing one `AccessLog` line per HTTP request (streams pass untouched).

    Mounted outermost of the app's own middleware (`app.add_middleware` last), so it sees the
    body limit's 413s and the status every other layer settled on; the log file is closed when
    the app's lifespan ends."""

    def __init__(self, app: Any, path: Path | None = None, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
        self.app = app
        self.log = AccessLog(path, max_bytes, backups) if path is not None else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.log is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = _Request(time.time(), time.monotonic(), batch=scope.get("path") in BATCH_ROUTES)

        async def reading() -> dict:  # the request's body, seen on its way in for `model`
            message = await receive()
            if message["type"] == "http.request":
                request.feed(message.get("body", b""))
            return message

        async def answering(message: dict) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                request.start(message)
            elif message["type"] == "http.response.body":
                request.body(message.get("body", b""))
                if not message.get("more_body", False):
                    self._write(scope, request)

        try:
            await self.app(scope, reading, answering)
        except BaseException:
            if not request.written:
                request.status = request.status or 500  # the error middleware outside answers 500
                self._write(scope, request)
            raise
        if not request.written:  # the app returned without a last body (the client went away)
            self._write(scope, request)

    def _closing(self, send: Any) -> Any:
        async def closing(message: dict) -> None:
            await send(message)
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed") and self.log:
                self.log.close()

        return closing

    def _write(self, scope: dict, request: _Request) -> None:
        request.written = True
        assert self.log is not None
        route = scope.get("route")
        answer = request.answer()
        path = scope.get("path", "")
        self.log.write(
            {
                "ts": round(request.ts, 3),
                "method": scope.get("method"),
                "route": getattr(route, "path", None),
                "path": path if len(path) <= MAX_PATH else path[:MAX_PATH] + "...",
                "status": request.status,
                "code": _error_code(answer),
                "ms": round((time.monotonic() - request.t0) * 1000, 2),
                "episode": _episode(scope, answer),
                "model": _string(answer.get("model")) or request.model(),
                **({"episodes": request.episodes()} if request.batch else {}),
            }
        )


class _Request:
    """What one request showed on its way through: the request's model, the answer's status and JSON."""

    def __init__(self, ts: float, t0: float, batch: bool = False) -> None:
        self.ts = ts
        self.t0 = t0
        self.batch = batch
        self._ids: dict[str, None] = {}  # a batch's episode ids in order, from its answer and its request
        self._id_tail = b""
        self.status = 0
        self.written = False
        self._json_answer = False
        self._answer = bytearray()
        self._answer_overflow = False
        self._small = bytearray()
        self._large = False
        self._found: str | None = None
        self._tail = b""

    def _scan_ids(self, chunk: bytes) -> None:
        """A batch's ids, found across chunk boundaries (an id seen twice is kept once)."""
        seen = self._id_tail + chunk
        for m in EPISODE_ID.finditer(seen):
            if len(self._ids) < MAX_BATCH:
                self._ids.setdefault(m.group(1).decode(), None)
        self._id_tail = seen[-100:]

    def episodes(self) -> list[str]:
        return list(self._ids)

    def feed(self, chunk: bytes) -> None:
        """A request body chunk: kept while the body is small, else scanned for `"model"` and let go."""
        if not chunk:
            return
        if self.batch:
            self._scan_ids(chunk)
        if not self._large:
            if len(self._small) + len(chunk) <= MAX_PARSED_REQUEST:
                self._small += chunk
                return
            self._large = True
            chunk = bytes(self._small) + chunk
            self._small = bytearray()
        if self._found is None:
            seen = self._tail + chunk
            m = MODEL_KEY.search(seen)
            if m is not None:
                self._found = _unescape(m.group(1))
            self._tail = seen[-512:]  # a key cut between two chunks is found in the next

    def model(self) -> str | None:
        if self._large:
            return self._found
        if not self._small:
            return None
        try:
            body = json.loads(self._small)
        except (ValueError, UnicodeDecodeError):
            return None
        return _string(body.get("model")) if isinstance(body, dict) else None

    def start(self, message: dict) -> None:
        self.status = int(message["status"])
        headers = dict(message.get("headers") or [])
        self._json_answer = headers.get(b"content-type", b"").startswith(b"application/json")

    def body(self, chunk: bytes) -> None:
        if self.batch and self._json_answer:
            self._scan_ids(chunk)
        if not self._json_answer or self._answer_overflow:
            return
        if len(self._answer) + len(chunk) > MAX_ANSWER_BYTES:
            self._answer_overflow = True
            self._answer = bytearray()
            return
        self._answer += chunk

    def answer(self) -> dict[str, Any]:
        """The answer's JSON object when it was small enough to keep, else {}."""
        if not self._answer:
            return {}
        try:
            body = json.loads(self._answer)
        except (ValueError, UnicodeDecodeError):
            return {}
        return body if isinstance(body, dict) else {}


def _error_code(answer: dict[str, Any]) -> str | None:
    error = answer.get("error")
    return _string(error.get("code")) if isinstance(error, dict) else None


def _episode(scope: dict, answer: dict[str, Any]) -> str | None:
    """The episode a request is about: its path's id, its episode key's id, or the id a claim got."""
    from_path = (scope.get("path_params") or {}).get("episode_id")
    if isinstance(from_path, str):
        return from_path
    for name, value in scope.get("headers") or []:
        if name in (b"authorization", b"x-api-key"):
            key = value.decode("latin-1").removeprefix("Bearer ").strip()
            parts = key.split(".")
            if len(parts) == 4 and parts[0] == "rk":
                return parts[1][:64]
    return _string(answer.get("episode_id"))


def _string(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None


def _unescape(raw: bytes) -> str | None:
    try:
        return _string(json.loads(b'"' + raw + b'"'))
    except (ValueError, UnicodeDecodeError):
        return None


__all__ = ["BACKUPS", "ACCESS_LOG_FILE", "MAX_BYTES", "AccessLog", "AccessLogMiddleware"]
