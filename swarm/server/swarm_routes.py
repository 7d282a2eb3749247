"""The episode API (`/swarm/v1/*`): claim, heartbeat, finish, abort, status, stop, checkpoint.

What each route promises: docs/design.md, "Routes" and "Episode lifecycle".

Thin: each route authenticates (`auth.py`), validates (pydantic models from
`swarm.protocol`) and calls one `Swarm` operation. Worker token for claim/status,
the episode key for an episode's own routes, the admin token for `/admin/stop`
and `/admin/checkpoint` (live control is in `admin_routes.py`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from swarm.protocol import (
    API_PREFIX,
    AbortRequest,
    AbortResponse,
    AdminResponse,
    BatchResponse,
    ClaimBatch,
    ClaimRequest,
    ClaimResponse,
    ErrorResponse,
    FinishBatch,
    FinishRequest,
    FinishResponse,
    HeartbeatResponse,
    StatusResponse,
)
from swarm.server.auth import admin, episode, episode_of, episode_swarm, policies, worker
from swarm.server.auth_first import AuthFirstRoute
from swarm.server.episodes import Episode
from swarm.server.errors import batch_item_error, batch_item_invalid
from swarm.server.exceptions import SwarmError
from swarm.server.state import Swarm

_errors = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 429, 503)}
router = APIRouter(prefix=API_PREFIX, tags=["swarm"], responses=_errors, route_class=AuthFirstRoute)


def _base_url(request: Request, swarm: Swarm) -> str:
    public = swarm.config.public_url
    return (public or str(request.base_url)).rstrip("/") + "/v1"


@router.post("/episodes", response_model=ClaimResponse)
async def claim(body: ClaimRequest, request: Request, _: Swarm = Depends(worker)) -> ClaimResponse:
    swarm = policies(request).by_model(body.policy)
    return await swarm.claim(body, _base_url(request, swarm))


@router.post("/episodes/{episode_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(request: Request, ep: Episode = Depends(episode)) -> HeartbeatResponse:
    return HeartbeatResponse(episode_id=ep.id, lease_expires_at=episode_swarm(request, ep).registry.heartbeat(ep))


@router.post("/episodes/{episode_id}/finish", response_model=FinishResponse)
async def finish(body: FinishRequest, request: Request, ep: Episode = Depends(episode)) -> FinishResponse:
    return await episode_swarm(request, ep).finish(ep, body)


@router.post("/episodes/{episode_id}/abort", response_model=AbortResponse)
async def abort(request: Request, body: AbortRequest | None = None, ep: Episode = Depends(episode)) -> AbortResponse:
    return episode_swarm(request, ep).abort(ep, body or AbortRequest())


@router.post("/claims", response_model=BatchResponse)
async def claims(body: ClaimBatch, request: Request, _: Swarm = Depends(worker)) -> Any:
    """Several claims in one request (the SDK coalesces concurrent ones); answers in order.
    Claims of different policies go to each policy's own window, concurrently."""
    router = policies(request)
    results: list[dict | None] = [None] * len(body.claims)
    by_policy: dict[Swarm, list[tuple[int, ClaimRequest]]] = {}
    for i, item in enumerate(body.claims):
        try:
            req = ClaimRequest.model_validate(item)
            by_policy.setdefault(router.by_model(req.policy), []).append((i, req))
        except ValidationError as exc:
            results[i] = batch_item_invalid(exc.errors())
        except SwarmError as exc:  # an unknown policy: this item's 404
            results[i] = batch_item_error(exc)

    async def one_policy(swarm: Swarm, items: list[tuple[int, ClaimRequest]]) -> None:
        got = await swarm.claim_many([r for _, r in items], _base_url(request, swarm))
        for (i, _), one in zip(items, got):
            results[i] = (
                batch_item_error(one)
                if isinstance(one, SwarmError)
                else {"status": 200, "body": one.model_dump(), "retry_after": None}
            )

    await asyncio.gather(*(one_policy(s, items) for s, items in by_policy.items()))
    return JSONResponse({"results": results})


@router.post("/finishes", response_model=BatchResponse)
async def finishes(body: FinishBatch, request: Request, _: Swarm = Depends(worker)) -> Any:
    """Several finishes in one request: each authorized by its own episode key (fenced by its
    epoch), all committed together (group commit), each answered as its single route would."""

    async def one(item: dict) -> dict:
        try:
            ep = episode_of(request, str(item.get("api_key") or ""), str(item.get("episode_id") or ""))
            swarm = episode_swarm(request, ep)
            req = FinishRequest.model_validate(item)
            return {"status": 200, "body": (await swarm.finish(ep, req)).model_dump(), "retry_after": None}
        except SwarmError as exc:
            return batch_item_error(exc)
        except ValidationError as exc:
            return batch_item_invalid(exc.errors())

    return JSONResponse({"results": list(await asyncio.gather(*(one(i) for i in body.finishes)))})


@router.get("/status", response_model=StatusResponse)
async def status(request: Request, policy: str | None = None, _: Swarm = Depends(worker)) -> StatusResponse:
    """The status of one policy (`?policy=NAME`; default: the first); `policies` lists them all."""
    router = policies(request)
    out = router.by_model(policy).status()
    return out.model_copy(update={"policies": router.names()}) if router.several else out


@router.post("/admin/stop", response_model=AdminResponse)
async def admin_stop(request: Request, swarm: Swarm = Depends(admin)) -> AdminResponse:
    for one in policies(request):
        one.request_stop("admin request")
    return AdminResponse(message="stopping", step=swarm.trainer.step)


@router.post("/admin/checkpoint", response_model=AdminResponse)
async def admin_checkpoint(swarm: Swarm = Depends(admin)) -> AdminResponse:
    """A checkpoint of one policy (`?policy=NAME`; default: the first); each policy has its own."""
    await swarm.trainer.wait()
    async with swarm.gate.exclusive():
        path = await swarm.checkpoint()
    return AdminResponse(message="checkpoint written", path=str(path), step=swarm.trainer.step)
