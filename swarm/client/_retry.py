"""How the client treats a failed request: its errors, and when (and how long) to retry.

The rules are shared by the sync and async clients, which differ only in how
they send and sleep: connection errors and 502/503/504 are retried with jittered
backoff, 429 is waited out honouring `Retry-After` (when the caller asked to
wait), a 503 "stopping" raises `ServerStopping`, anything else raises
`SwarmAPIError`. With `reconnect_s`, a server reached once is retried past
`max_retries` for that long: a restart.

A 503 "stopping" seen on any response of a client, its SDK requests or its
episodes' model calls (`mark_stopping`, an httpx response hook on their pools),
marks the client stopping for good: from then on an unreachable server or a 5xx
is that stop completing, not a restart, so requests raise `ServerStopping` at
once instead of reconnecting for `reconnect_s` (an abort after the stop must not
hold a fleet up for minutes).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import random
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

RETRY_STATUSES = {500, 502, 503, 504}
TRANSIENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.PoolTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)

log = logging.getLogger(__name__)


class SwarmError(Exception):
    """Base of the client's errors."""


class InvalidReward(SwarmError, ValueError):
    """A reward or metric that is no finite number: said here, before anything is sent."""


def finite(value: Any, where: str) -> float:
    """A reward or metric as the wire takes it: a finite real number (numpy's scalars too). NaN used to
    fail inside httpx's JSON encoder ("Out of range float values are not JSON compliant"), naming no
    reward; a string was turned into a number by the fleet, which the server refuses."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InvalidReward(f"{where} must be a finite number, got {value!r}")
    return float(value)


def worker_token(token: str | None) -> str:
    """The token a client sends: the argument, else ROOST_TOKEN; none is an error at construction.

    Without one every request failed deep in httpx (`Illegal header value b'Bearer '`)."""
    token = token or os.environ.get("ROOST_TOKEN") or ""
    if not token.strip():
        raise SwarmError("no token: pass token=... or set ROOST_TOKEN (the server's --token)")
    return token


class SwarmAPIError(SwarmError):
    """The server refused a request (4xx, or 5xx after retries)."""

    def __init__(self, status_code: int, message: str, code: str | None = None, type: str | None = None):
        super().__init__(f"{status_code} {code or type or ''}: {message}")
        self.status_code = status_code
        self.message = message
        self.code = code
        self.type = type


class ServerStopping(SwarmError):
    """The server is shutting down (503 "stopping"): stop claiming."""


class SwarmUnavailable(SwarmError):
    """The server could not be reached after all retries."""


def error_of(response: httpx.Response) -> SwarmAPIError:
    try:
        err = response.json()["error"]
        return SwarmAPIError(response.status_code, str(err.get("message")), err.get("code"), err.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return SwarmAPIError(response.status_code, response.text[:500])


def retry_after(response: httpx.Response, default: float) -> float:
    value = response.headers.get("retry-after")
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return default


def backoff(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with full jitter (attempt 1 -> up to `base`)."""
    return random.uniform(0.5, 1.0) * min(cap, base * 2 ** (attempt - 1))


def is_stopping(response: httpx.Response) -> bool:
    return response.status_code == 503 and error_of(response).code == "stopping"


STOPPED_MESSAGE = "the server stopped (it answered 503 'stopping' earlier)"


def mark_stopping(response: httpx.Response, stopping: threading.Event) -> None:
    """httpx response hook of the episodes' OpenAI pools: note a 503 "stopping" on the client.

    The model call is where a fleet usually meets the stop, and the OpenAI client would
    retry a 503; `x-should-retry: false` (the header the openai package honours) makes it
    raise at once, so the workflow ends and the fleet sees the stop.
    """
    if response.status_code != 503:
        return
    response.read()  # a short error body (streamed responses too); 2xx bodies are never touched
    if is_stopping(response):
        stopping.set()
        response.headers["x-should-retry"] = "false"


async def amark_stopping(response: httpx.Response, stopping: threading.Event) -> None:
    """`mark_stopping` for an `httpx.AsyncClient` (the episodes' `async_openai`)."""
    if response.status_code != 503:
        return
    await response.aread()
    if is_stopping(response):
        stopping.set()
        response.headers["x-should-retry"] = "false"


class Policy:
    """What to do with one response or error; shared by the sync and async clients."""

    def __init__(
        self, max_retries: int, backoff_s: float, max_backoff_s: float, reconnect_s: float | None = None
    ) -> None:
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.reconnect_s = reconnect_s

    def may_retry(self, attempt: int, since: float | None) -> bool:
        """While attempts remain; past them, for a server reached before (`since` is set: the
        first failure of this request), until `reconnect_s` has passed: a restarting server."""
        if attempt <= self.max_retries:
            return True
        return since is not None and self.reconnect_s is not None and time.monotonic() - since < self.reconnect_s

    def on_error(self, exc: Exception, attempt: int, since: float | None = None) -> float:
        """Delay before retrying a transport error, or raise."""
        if not self.may_retry(attempt, since):
            raise SwarmUnavailable(f"server unreachable after {attempt} attempts: {exc!r}") from exc
        return backoff(attempt, self.backoff_s, self.max_backoff_s)

    def on_response(
        self, r: httpx.Response, attempt: int, wait_429: bool, deadline: float | None, since: float | None = None
    ) -> float | None:
        """None when `r` is the answer; otherwise the delay before retrying (or raise)."""
        if r.status_code < 400:
            return None
        if is_stopping(r):
            raise ServerStopping(error_of(r).message)
        if r.status_code == 429:
            delay = retry_after(r, self.backoff_s)
            if not wait_429 or (deadline is not None and time.monotonic() + delay > deadline):
                raise error_of(r)
            return delay
        if r.status_code in RETRY_STATUSES and self.may_retry(attempt, since):
            return max(retry_after(r, 0.0), backoff(attempt, self.backoff_s, self.max_backoff_s))
        raise error_of(r)


class Attempts:
    """The retry state of one request (attempts, first failure) over a client's `Policy`.

    The sync and async clients' request loops differ only in how they send and
    sleep; every decision is here. `owner._connected` records that the server was
    reached once: from then on, connection errors mean a restart to wait out,
    unless `owner.stopping_event` is set (the server said it is stopping): then
    they mean the stop went through, and raise `ServerStopping`.
    """

    def __init__(self, owner: Any, wait_429: bool, wait_timeout: float | None) -> None:
        self.owner = owner
        self.policy: Policy = owner.policy
        self.wait_429 = wait_429
        self.deadline = None if wait_timeout is None else time.monotonic() + wait_timeout
        self.attempt = 0
        self.since: float | None = None  # first failure of this request

    def response(self, r: httpx.Response) -> float | None:
        """None: `r` is the answer; else the delay before the next try (or raise)."""
        self.attempt += 1
        self.owner._connected = self.owner._connected or r.status_code < 500
        if r.status_code < 500:
            self._back()
        if r.status_code >= 500 and self.since is None:
            self.since = time.monotonic()
        if is_stopping(r):
            self.owner.stopping_event.set()
        delay = self.policy.on_response(r, self.attempt, self.wait_429, self.deadline, self._reconnecting())
        if delay is not None and r.status_code == 429:
            self.attempt -= 1  # waiting for the window is not a failure
        elif delay is not None and self.owner.stopping_event.is_set():  # a 5xx of a server on its way out
            raise ServerStopping(STOPPED_MESSAGE)
        return delay

    def error(self, exc: Exception) -> float:
        """The delay before retrying a transport error (or raise `SwarmUnavailable`)."""
        self.attempt += 1
        self.since = self.since if self.since is not None else time.monotonic()
        if self.owner.stopping_event.is_set():  # gone after saying it stops: no restart to wait for
            raise ServerStopping(STOPPED_MESSAGE) from exc
        delay = self.policy.on_error(exc, self.attempt, self._reconnecting())
        if self.owner._connected:
            self._gone(exc)
        return delay

    def _gone(self, exc: Exception) -> None:
        """Said once an outage, by whichever request meets it first: a fleet's progress stood still, its
        spinner spinning, until `reconnect_s` ran out (and nothing at all went to a log)."""
        if self.owner._down_since is None:
            self.owner._down_since = time.monotonic()
            wait = self.policy.reconnect_s
            log.warning(
                "server %s unreachable (%s); retrying%s",
                self.owner.url,
                type(exc).__name__,
                f" for up to {wait:g} s (reconnect_s)" if wait else "",
            )

    def _back(self) -> None:
        down = self.owner._down_since
        if down is not None:
            self.owner._down_since = None
            log.warning("server %s reachable again after %.1f s", self.owner.url, time.monotonic() - down)

    def _reconnecting(self) -> float | None:
        return self.since if self.owner._connected else None
