"""Who may call what: the routes' auth dependencies, in one place.

    worker        worker (or admin) token: claim, status
    admin         admin token: /swarm/v1/admin/*
    episode       the episode's own key, matching the path's id: heartbeat, finish, abort
    open_episode  the key of an open episode (each call renews the lease)
    generation_caller  the OpenAI routes: an open episode's key, or the worker/admin token for an
                  evaluation call outside any episode (None: generated, never recorded or trained)
    any_caller    worker, admin or any genuine episode key: read-only routes (/v1/models)

Every credential is a Bearer token. These run as FastAPI dependencies (async: a
plain `def` dependency would hop to a worker thread on every request), before
the body is validated, so an unauthenticated request learns nothing about the
schema (and gets 401, not 400). Failures raise the domain's `Unauthorized` /
`Forbidden`; `errors.py` renders them.
"""

from __future__ import annotations

from fastapi import Header, Request

from swarm.server.episodes import Episode, same_secret
from swarm.server.exceptions import Forbidden, Unauthorized, Unavailable
from swarm.server.state import Swarm


def current_swarm(request: Request) -> Swarm:
    return request.app.state.swarm


def bearer(authorization: str | None) -> str:
    if not authorization or not authorization.startswith("Bearer ") or not authorization[7:].strip():
        raise Unauthorized("missing_api_key", "missing Bearer token (the episode's api_key)")
    return authorization[7:].strip()


def _is_worker(swarm: Swarm, token: str) -> bool:
    return same_secret(token, swarm.config.token) or same_secret(token, swarm.config.admin_token)


async def worker(request: Request, authorization: str | None = Header(None)) -> Swarm:
    swarm = current_swarm(request)
    if not _is_worker(swarm, bearer(authorization)):
        raise Unauthorized("invalid_token", "invalid worker token")
    return swarm


async def admin(request: Request, authorization: str | None = Header(None)) -> Swarm:
    swarm = current_swarm(request)
    token = bearer(authorization)
    if not same_secret(token, swarm.config.admin_token):
        kind = Forbidden if same_secret(token, swarm.config.token) else Unauthorized
        raise kind("admin_only", "admin token required")
    return swarm


async def episode(episode_id: str, request: Request, authorization: str | None = Header(None)) -> Episode:
    return current_swarm(request).registry.authorize(bearer(authorization), episode_id)


async def open_episode(request: Request, authorization: str | None = Header(None)) -> Episode:
    swarm = current_swarm(request)
    ep = swarm.registry.authorize(bearer(authorization))
    swarm.begin_call(ep)
    return ep


def caller_of(swarm: Swarm, token: str) -> Episode | None:
    """The open episode a generation call is recorded into, or None for an evaluation call
    (worker or admin token). Shared by every protocol's generation routes."""
    if _is_worker(swarm, token):
        if swarm.stopping:
            raise Unavailable("stopping", "the server is stopping")
        return None
    ep = swarm.registry.authorize(token)
    swarm.begin_call(ep)
    return ep


async def generation_caller(request: Request, authorization: str | None = Header(None)) -> Episode | None:
    return caller_of(current_swarm(request), bearer(authorization))


async def any_caller(request: Request, authorization: str | None = Header(None)) -> Swarm:
    swarm = current_swarm(request)
    token = bearer(authorization)
    if not _is_worker(swarm, token):
        swarm.registry.signer.verify(token)  # raises InvalidKey
    return swarm
