"""Errors on the wire: the one place where failures become status codes and JSON bodies.

Domain errors (`exceptions.py`) get their status here (`status_of`); validation
errors, unknown routes and bugs get the same shape. Every 4xx/5xx is
`{"error": {"message", "type", "code"}}` (OpenAI's shape, so the `openai` package
surfaces the message), and `code` is never null: domain errors carry theirs, the
framework's get `HTTP_CODES`, validation `invalid_request` / `invalid_json`. Validation failures, including malformed
JSON, are 400 (never 422): one status for "your request is wrong". A body that is
not a JSON object at all is said in words, not in pydantic's (`describe_validation`):
"the request body is not valid JSON: Expecting value: line 1 column 9 (char 8)", "the
request body must be a JSON object (send Content-Type: application/json)". Nothing a
client sends may produce a 500; a 500 always means a server bug.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarm.config.options import errors_line
from swarm.config.unknown import name_unknown_keys
from swarm.server.exceptions import (
    Conflict,
    EpisodeNotFound,
    Forbidden,
    GenerateTimeout,
    InvalidRequest,
    NotFound,
    Refused,
    SwarmError,
    Unauthorized,
    Unavailable,
)

log = logging.getLogger("swarm.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "unavailable_error",
}

#: `error.code` of the framework's own errors (unknown route, wrong method, unparsable body...):
#: every 4xx carries a stable code, whoever raised it
HTTP_CODES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}

_STATUS: tuple[tuple[type[SwarmError], int], ...] = (
    (InvalidRequest, 400),
    (Unauthorized, 401),
    (Forbidden, 403),
    (EpisodeNotFound, 404),
    (NotFound, 404),
    (Conflict, 409),
    (Refused, 429),
    (Unavailable, 503),
    (GenerateTimeout, 504),
)


def status_of(exc: SwarmError) -> int:
    """The HTTP status of a domain error (500 for one this table does not know: a bug)."""
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def _domain_headers(exc: SwarmError) -> dict[str, str]:
    retry_after = getattr(exc, "retry_after", None)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    if isinstance(exc, GenerateTimeout):  # retrying a hung generation would hang again
        headers["x-should-retry"] = "false"
    return headers


def error_body(status: int, message: str, code: str | None = None, details: dict[str, Any] | None = None) -> dict:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {**(details or {}), "message": message, "type": kind, "code": code}}


def domain_error_body(exc: SwarmError) -> dict:
    """The JSON body of a domain error (also sent in-band when a stream fails after its headers)."""
    return error_body(status_of(exc), exc.message, exc.code, exc.details)


def batch_item_error(exc: SwarmError) -> dict[str, Any]:
    """A batch route's answer for one failed item: the status and body its single route would send."""
    return {"status": status_of(exc), "body": domain_error_body(exc), "retry_after": getattr(exc, "retry_after", None)}


def batch_item_invalid(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch item that fails validation: the single route's 400 (as `_validation` renders it)."""
    return {"status": 400, "body": error_body(400, describe_validation(errors), "invalid_request"), "retry_after": None}


def _headers(status: int, headers: dict[str, str] | None) -> dict[str, str]:
    """Tell OpenAI SDKs (which retry 409s by default) not to retry what cannot succeed."""
    out = dict(headers or {})
    if 400 <= status < 500 and status not in (408, 429):
        out.setdefault("x-should-retry", "false")
    return out


def error_response(
    status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, code), status_code=status, headers=_headers(status, headers))


def error_headers(status: int, exc: SwarmError | None = None) -> dict[str, str]:
    """Retry-After when the error knows it, and `x-should-retry: false` for what a retry cannot fix
    (the OpenAI and Anthropic SDKs both honour it): one rule for every protocol's routes."""
    return _headers(status, _domain_headers(exc) if exc is not None else None)


#: pydantic's error types for a body that is no object at all (bytes FastAPI did not parse, or other JSON)
_NOT_AN_OBJECT = frozenset({"model_attributes_type", "dict_type", "model_type"})
_JSON_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (int, "a number"),
    (float, "a number"),
    (str, "a string"),
    (list, "an array"),
)


def describe_validation(errors: list[dict[str, Any]], raw: Any = None) -> str:
    """Pydantic's errors as one line (at most five), the body's own prefix left out; a body that is not
    a JSON object at all (unparsable, sent without its content type, empty) in words instead, since
    "body: Input should be a valid dictionary" or "14: JSON decode error" tell a client nothing it can
    fix. `raw` is the text FastAPI failed to parse, which places a JSON error at its line and column."""
    for error in errors:
        if (problem := body_problem(error, raw)) is not None:
            return problem
    return errors_line(errors, lambda loc: ".".join(x for x in loc if x != "body") or "body") or "invalid request"


def body_problem(error: Mapping[str, Any], raw: Any = None) -> str | None:
    """What is wrong with the request body as a whole, in words; None for an error about one field."""
    kind, loc = error.get("type"), tuple(error.get("loc", ()))
    if kind == "json_invalid":
        return f"the request body is not valid JSON: {_json_reason(error, raw)}"
    if loc != ("body",):
        return None
    if kind == "missing":
        return "the request body is empty: send a JSON object (Content-Type: application/json)"
    if kind not in _NOT_AN_OBJECT:
        return None
    got = error.get("input")
    if isinstance(got, (bytes, bytearray)):  # FastAPI parses JSON only when the content type says so
        return "the request body must be a JSON object (send Content-Type: application/json)"
    what = "null" if got is None else next((name for t, name in _JSON_KINDS if isinstance(got, t)), "something else")
    return f"the request body must be a JSON object, not {what}"


def _json_reason(error: Mapping[str, Any], raw: Any) -> str:
    """The decoder's reason, at its line and column when the text is known (its offset otherwise)."""
    loc = tuple(error.get("loc", ()))
    pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    reason = str((error.get("ctx") or {}).get("error") or "JSON decode error")
    if pos is None:
        return reason
    if isinstance(raw, str) and 0 <= pos <= len(raw):
        return str(json.JSONDecodeError(reason, raw, pos))  # "<reason>: line L column C (char P)"
    return f"{reason} (char {pos})"


#: FastAPI's 400 for a body its JSON decoder failed on with anything but a JSONDecodeError
FASTAPI_BODY_ERROR = "There was an error parsing the body"


def unparsed_body(cause: BaseException | None) -> str:
    """That failure in words, as `body_problem` says a JSON syntax error."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not UTF-8 text (byte {cause.start}): send JSON encoded as UTF-8"
    if isinstance(cause, RecursionError):
        return "the request body is nested too deeply"
    return f"the request body could not be read as JSON ({type(cause).__name__ if cause else 'unknown error'})"


def body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model of the matched route's body, when it has exactly one."""
    route = request.scope.get("route")
    params = getattr(getattr(route, "dependant", None), "body_params", None) or []
    annotation = getattr(getattr(params[0], "field_info", None), "annotation", None) if len(params) == 1 else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SwarmError)
    async def _domain(request: Request, exc: SwarmError) -> JSONResponse:
        status = status_of(exc)
        return JSONResponse(domain_error_body(exc), status_code=status, headers=error_headers(status, exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if (model := body_model(request)) is not None:  # an unknown key answered with the name meant
            errors = name_unknown_keys(errors, model, noun="field", under=("body",))
        code = "invalid_json" if any(e.get("type") == "json_invalid" for e in errors) else "invalid_request"
        return error_response(400, describe_validation(errors, exc.body), code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        headers = getattr(exc, "headers", None)
        message = str(exc.detail)
        if exc.status_code == 405 or (exc.status_code == 404 and request.scope.get("route") is None):  # no route
            message = no_route(request, (headers or {}).get("Allow"))
        if exc.status_code == 400 and message == FASTAPI_BODY_ERROR:  # its words for what JSON's decoder raised
            message, code = unparsed_body(exc.__cause__), "invalid_json"
        return error_response(exc.status_code, message, code, headers)

    @app.exception_handler(RecursionError)
    async def _deep(request: Request, exc: RecursionError) -> JSONResponse:
        return error_response(400, "request body is nested too deeply", "invalid_json")

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal server error: {type(exc).__name__}", "internal_error")


#: what a client most often asks for that a training server does not have: why, in a word
NO_ROUTE_HINTS = {
    "/v1/responses/": "responses are kept only while their episode is open, for previous_response_id "
    "(there is no GET /v1/responses/{id})",
    "/v1/embeddings": "this server generates with the policies it trains; it serves no embeddings",
}


def no_route(request: Request, allow: str | None = None, shown: int = 8) -> str:
    """A 404 or 405 that no route raised: the method and path asked for, and the routes beside it (those
    under the same first path segment), so a wrong path or method names the right one."""
    method, path = request.method, request.url.path
    if allow:
        return f"{method} {path} is not a route: {path} takes {allow}"
    top = "/" + path.strip("/").split("/")[0]
    paths = request.app.openapi().get("paths", {})  # every route, included routers' too (built once, cached)
    near = [
        f"{m.upper()} {route}"
        for route, ops in paths.items()
        if route == top or route.startswith(top + "/")
        for m in ops
    ]
    hint = next((why for prefix, why in NO_ROUTE_HINTS.items() if path.startswith(prefix)), None)
    listed = ", ".join(near[:shown]) + (f" and {len(near) - shown} more" if len(near) > shown else "")
    return (
        f"{method} {path} is not a route of this server"
        + (f": {hint}" if hint else "")
        + (f"; under {top}: {listed}" if near else "")
        + " (every route this server has: GET /openapi.json)"
    )


class BodyLimitMiddleware:
    """413 for bodies over `max_bytes`, judged on Content-Length and on bytes received.

    The body is read (and counted) before the app sees it, so a chunked upload
    that lies about nothing but keeps sending is cut off at the limit too. The
    limit is small enough (MBs) that buffering is cheaper than streaming checks.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await self._reject(send, 400, "invalid Content-Length header", "invalid_request")
                return
            if declared > self.max_bytes:
                await self._reject(send, 413, self._too_big(), "body_too_large")
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._reject(send, 413, self._too_big(), "body_too_large")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as usual

        await self.app(scope, replay, send)

    def _too_big(self) -> str:
        return f"request body exceeds {self.max_bytes} bytes"

    @staticmethod
    async def _reject(send: Any, status: int, message: str, code: str) -> None:
        payload = json.dumps(error_body(status, message, code)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-should-retry", b"false"),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
