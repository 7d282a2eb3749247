"""One TLS context per process, for every HTTP client Roost builds per request, episode or pool.

httpx builds a new context for every client it makes (the CA bundle parsed again): ~20 ms of CPU,
more than a whole episode of a fleet costs. An async episode's OpenAI client, and the vLLM engine's
client for each generation request, paid it every time. A context is safe to share between
clients and threads once built, and a client given one (`verify=tls_context()`) costs ~0.1 ms.
"""

from __future__ import annotations

import ssl
from functools import cache

import httpx


@cache
def tls_context() -> ssl.SSLContext:
    """The process's context, built on first use (httpx's defaults: verification on)."""
    return httpx.create_ssl_context()


__all__ = ["tls_context"]
