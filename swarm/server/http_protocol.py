"""uvicorn's HTTP/1.1 protocols, answering a request they cannot parse with the JSON error body.

A request the HTTP parser rejects (an invalid Content-Length, a broken request line or
header) is answered by uvicorn's protocol itself, before any ASGI app runs, with a
plain-text 400: no middleware or exception handler can reach it. The docs promise that
every 4xx carries `{"error": {"code", "message", "type"}}` (`errors.py`), so the server
runs these subclasses (`uvicorn.Config(http=json_error_protocol())`), which override the
one method that writes that answer (`send_400_response`, uvicorn 0.54) and keep
everything else, including uvicorn's choice of parser ("auto": httptools when installed).

Imported only by code that serves (uvicorn is a heavy edge).
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from swarm.server.errors import error_body

#: `error.code` of a request the HTTP parser rejected (listed in docs/server-control.md).
CODE = "invalid_http_request"


def error_payload(msg: str) -> bytes:
    """The JSON body of a parse-level 400 (uvicorn's message, e.g. "Invalid HTTP request received.")."""
    return json.dumps(error_body(400, f"malformed HTTP request: {msg}", CODE)).encode()


class JsonErrorH11Protocol(H11Protocol):
    """uvicorn's h11 protocol; its 400 for an unparsable request is JSON."""

    def send_400_response(self, msg: str) -> None:
        body = error_payload(msg)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
        self.transport.write(self.conn.send(h11.Data(data=body)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()


try:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
except ImportError:  # httptools is optional for uvicorn: then "auto" is h11
    HttpToolsProtocol = None
    JsonErrorHttpToolsProtocol = None
else:

    class JsonErrorHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[no-redef]
        """uvicorn's httptools protocol; its 400 for an unparsable request is JSON."""

        def send_400_response(self, msg: str) -> None:
            body = error_payload(msg)
            content = [STATUS_LINE[400]]
            for name, value in self.server_state.default_headers:  # date, server: as uvicorn sends them
                content.extend([name, b": ", value, b"\r\n"])
            content.extend(
                [
                    b"content-type: application/json\r\n",
                    b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                    b"connection: close\r\n",
                    b"\r\n",
                    body,
                ]
            )
            self.transport.write(b"".join(content))
            self.transport.close()


def json_error_protocol(kind: str = "auto") -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`: "h11", "httptools", or "auto" (uvicorn's rule)."""
    if kind == "h11" or (kind == "auto" and JsonErrorHttpToolsProtocol is None):
        return JsonErrorH11Protocol
    if JsonErrorHttpToolsProtocol is None:
        raise ValueError("the httptools protocol needs httptools installed")
    if kind not in ("auto", "httptools"):
        raise ValueError(f"unknown HTTP protocol {kind!r}; known: auto, h11, httptools")
    return JsonErrorHttpToolsProtocol
