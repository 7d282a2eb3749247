"""The errors the vllm engine's parts raise, in one module so that none imports another for them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx


class VllmEngineError(RuntimeError):
    """vLLM failed a request or a weight sync (the engine has recovered when this is raised)."""


class ServerStartError(RuntimeError):
    """A supervised server process exited or stayed unhealthy while starting (the message ends with its log)."""


def post_route(
    post: Callable[..., httpx.Response],
    url: str,
    route: str,
    body: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
    missing_ok: bool = False,
) -> Any:
    """POST a route of vLLM with `post` (httpx.post, or a client's); its JSON answer (None if none).

    `VllmEngineError` unless vLLM answers 200 (or 404 with `missing_ok`): one rule for every
    control route the weight and adapter publishers call."""
    try:
        resp = post(url + route, json=body, params=params)
    except httpx.HTTPError as exc:
        raise VllmEngineError(f"vLLM {route}: {exc!r}") from exc
    if resp.status_code == 404 and missing_ok:
        return None
    if resp.status_code != 200:
        raise VllmEngineError(f"vLLM {route} answered {resp.status_code}: {resp.text[:300]}")
    try:
        return resp.json()
    except json.JSONDecodeError:
        return None


class ReplicaGone(VllmEngineError):
    """One vLLM replica of several went away during a request; it is being restarted in the background
    (a request that had produced no token yet is sent to another replica: swarm/engine/vllm/replicas.py)."""
