"""`TinkerError`: a Tinker request refused before anything of it is applied.

The one error type of the package (no torch, no server import), rendered by the routes as the
server's error body, `{"error": {"message", "type", "code"}}`, with its HTTP status: 400 the
request is wrong, 401 no or a wrong API key, 404 no such thing, 409 a conflict (another client,
another trainer), 410 a session whose lease lapsed.
"""

from __future__ import annotations


class TinkerError(Exception):
    """HTTP `status`, stable machine-readable `code`, a message for people."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


__all__ = ["TinkerError"]
