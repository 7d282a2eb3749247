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

from fastapi import Header, Query, Request

from swarm.server.episodes import Episode, same_secret
from swarm.server.exceptions import Forbidden, InvalidRequest, Unauthorized, Unavailable
from swarm.server.policies import PolicyRouter
from swarm.server.state import Swarm


def current_swarm(request: Request) -> Swarm:
    """The default policy's `Swarm` (a one-policy server's only one)."""
    return request.app.state.policies.default


def policies(request: Request) -> PolicyRouter:
    return request.app.state.policies


def episode_swarm(request: Request, ep: Episode) -> Swarm:
    """The `Swarm` of the policy `ep` belongs to."""
    return policies(request).owner(ep.id)


def episode_of(request: Request, key: str, episode_id: str | None = None) -> Episode:
    """The episode a genuine key names, found in the policy that issued it (one secret signs for all)."""
    router = policies(request)
    if not router.several:
        return router.default.registry.authorize(key, episode_id)
    key_id, _ = router.default.registry.signer.verify(key)  # InvalidKey before any lookup
    return router.owner(key_id).registry.authorize(key, episode_id)


#: what a route's Bearer token is, for the message when it is missing
EPISODE_KEY = "the episode's api_key"
WORKER_TOKEN = "this server's worker token"
ADMIN_TOKEN = "this server's admin token"
CALLER = "an episode's api_key, or the worker token for a call outside any episode"


def bearer(authorization: str | None, wanted: str = EPISODE_KEY) -> str:
    if not authorization or not authorization.startswith("Bearer ") or not authorization[7:].strip():
        raise Unauthorized("missing_api_key", f"missing Bearer token ({wanted})")
    return authorization[7:].strip()


def _is_worker(swarm: Swarm, token: str) -> bool:
    return same_secret(token, swarm.config.token) or same_secret(token, swarm.config.admin_token)


async def worker(request: Request, authorization: str | None = Header(None)) -> Swarm:
    swarm = current_swarm(request)
    if not _is_worker(swarm, bearer(authorization, WORKER_TOKEN)):
        raise Unauthorized("invalid_token", "the token is neither this server's worker token nor its admin token")
    return swarm


async def admin(
    request: Request,
    authorization: str | None = Header(None),
    policy: str | None = Query(None, description="the policy of a server of several (default: the first)"),
) -> Swarm:
    swarm = current_swarm(request)
    token = bearer(authorization, ADMIN_TOKEN)
    if not same_secret(token, swarm.config.admin_token):
        if same_secret(token, swarm.config.token):  # known, not allowed
            raise Forbidden(
                "admin_only", "admin token required: this is the worker token, which may not operate the server"
            )
        raise Unauthorized(
            "admin_only",
            "the admin token is not this server's (swarm ctl --admin-token, or the server's OUT/secrets.json)",
        )
    return policies(request).by_model(policy) if policy is not None else swarm


async def episode(episode_id: str, request: Request, authorization: str | None = Header(None)) -> Episode:
    return episode_of(request, bearer(authorization), episode_id)


async def open_episode(request: Request, authorization: str | None = Header(None)) -> Episode:
    ep = episode_of(request, bearer(authorization))
    episode_swarm(request, ep).begin_call(ep)
    return ep


def caller_of(request: Request, token: str) -> Episode | None:
    """The open episode a generation call is recorded into, or None for an evaluation call
    (worker or admin token). Shared by every protocol's generation routes."""
    swarm = current_swarm(request)
    if _is_worker(swarm, token):
        if not policies(request).several and swarm.stopping:  # several: the policy `model` names, later
            raise Unavailable("stopping", "the server is stopping")
        return None
    ep = episode_of(request, token)
    episode_swarm(request, ep).begin_call(ep)
    return ep


def generation_swarm(request: Request, ep: Episode | None, model: str | None) -> Swarm:
    """Whose policy generates a call: the episode's; for an evaluation call, the one `model` names
    (a one-policy server checks `model` against its names where the route does, as before)."""
    router = policies(request)
    if ep is not None:
        swarm = episode_swarm(request, ep)
        if model is not None and router.several and model not in swarm.config.model_aliases:
            other = router.by_model(model)  # an unknown one: 404 listing every policy
            raise InvalidRequest(
                "episode_policy_mismatch",
                f"episode {ep.id} plays policy {swarm.model_name!r}; its calls cannot use {other.model_name!r} "
                f"(claim an episode with policy {other.model_name!r} for that one, or call with model "
                f"{swarm.model_name!r})",
            )
        return swarm
    if not router.several:
        return router.default
    swarm = router.by_model(model)
    if swarm.stopping:
        raise Unavailable("stopping", f"policy {swarm.model_name!r} is stopping")
    return swarm


async def generation_caller(request: Request, authorization: str | None = Header(None)) -> Episode | None:
    return caller_of(request, bearer(authorization, CALLER))


async def any_caller(request: Request, authorization: str | None = Header(None)) -> Swarm:
    swarm = current_swarm(request)
    token = bearer(authorization, CALLER)
    if not _is_worker(swarm, token):
        swarm.registry.signer.verify(token)  # raises InvalidKey
    return swarm
