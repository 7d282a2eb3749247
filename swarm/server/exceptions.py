"""What can go wrong with a request, in the domain's words: plain exceptions, no HTTP.

The registry, batcher, quotas, live control, durability, renderer and `Swarm`
raise these; `errors.py` alone turns them into a status code and the JSON error
body. Every one carries a machine-readable `code` (the body's `error.code`) and a
message for humans; `details` are extra fields for the body (quota numbers).

    InvalidRequest   the request itself is wrong (a prompt that cannot be tokenized, ...)
    Unauthorized     no or a wrong credential; InvalidKey: a forged or malformed episode key
    Forbidden        a genuine credential without the right; WrongEpisode: another episode's key
    EpisodeNotFound  no such episode (never claimed, or forgotten long ago)
    NotFound         no such thing (a `model` this server does not serve)
    Conflict         the episode moved on: StaleLease (its lease expired), EpisodeClosed
    Refused          not now (window full, training, paused, over quota); retry after `retry_after` s
    Unavailable      the server cannot take it (stopping, the buffer failed); `retry_after` s if known
    GenerateTimeout  the engine took longer than `generate_timeout_s`
"""

from __future__ import annotations

from typing import Any


class SwarmError(Exception):
    """Base of the domain's errors: `code` for machines, `message` for people."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class InvalidRequest(SwarmError):
    pass


class Unauthorized(SwarmError):
    pass


class InvalidKey(Unauthorized):
    def __init__(self) -> None:
        super().__init__("invalid_api_key", "invalid episode key")


class Forbidden(SwarmError):
    pass


class WrongEpisode(Forbidden):
    def __init__(self) -> None:
        super().__init__("wrong_episode", "this key belongs to another episode")


class EpisodeNotFound(SwarmError):
    def __init__(self, episode_id: str) -> None:
        super().__init__("episode_not_found", f"unknown episode {episode_id}")


class NotFound(SwarmError):
    pass


class Conflict(SwarmError):
    pass


class StaleLease(Conflict):
    """The key names an epoch the episode has left: its lease expired and it was handed over."""

    def __init__(self) -> None:
        super().__init__("stale_epoch", "stale episode key: the lease moved on")


class EpisodeClosed(Conflict):
    def __init__(self, episode_id: str, state: str) -> None:
        super().__init__(f"episode_{state}", f"episode {episode_id} is {state}")


class Refused(SwarmError):
    """A claim that cannot be admitted now; `retry_after` (whole seconds) once the server knows it."""

    def __init__(
        self, code: str, message: str, retry_after: int | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(code, message, details)
        self.retry_after = retry_after


class Unavailable(SwarmError):
    def __init__(self, code: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(code, message)
        self.retry_after = retry_after


class GenerateTimeout(SwarmError):
    def __init__(self, limit_s: float) -> None:
        super().__init__("generate_timeout", f"generation took longer than {limit_s}s and was cancelled")


__all__ = [
    "Conflict",
    "EpisodeClosed",
    "EpisodeNotFound",
    "Forbidden",
    "GenerateTimeout",
    "InvalidKey",
    "InvalidRequest",
    "NotFound",
    "Refused",
    "StaleLease",
    "SwarmError",
    "Unauthorized",
    "Unavailable",
    "WrongEpisode",
]
