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
from swarm.server.auth import admin, current_swarm, episode, worker
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
async def claim(body: ClaimRequest, request: Request, swarm: Swarm = Depends(worker)) -> ClaimResponse:
    return await swarm.claim(body, _base_url(request, swarm))


@router.post("/episodes/{episode_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(request: Request, ep: Episode = Depends(episode)) -> HeartbeatResponse:
    return HeartbeatResponse(episode_id=ep.id, lease_expires_at=current_swarm(request).registry.heartbeat(ep))


@router.post("/episodes/{episode_id}/finish", response_model=FinishResponse)
async def finish(body: FinishRequest, request: Request, ep: Episode = Depends(episode)) -> FinishResponse:
    return await current_swarm(request).finish(ep, body)


@router.post("/episodes/{episode_id}/abort", response_model=AbortResponse)
async def abort(request: Request, body: AbortRequest | None = None, ep: Episode = Depends(episode)) -> AbortResponse:
    return current_swarm(request).abort(ep, body or AbortRequest())


@router.post("/claims", response_model=BatchResponse)
async def claims(body: ClaimBatch, request: Request, swarm: Swarm = Depends(worker)) -> Any:
    """Several claims in one request (the SDK coalesces concurrent ones); answers in order."""
    reqs: list[ClaimRequest] = []
    results: list[dict | None] = []
    for item in body.claims:
        try:
            reqs.append(ClaimRequest.model_validate(item))
            results.append(None)
        except ValidationError as exc:
            results.append(batch_item_invalid(exc.errors()))
    got = iter(await swarm.claim_many(reqs, _base_url(request, swarm)) if reqs else [])
    for i, r in enumerate(results):
        if r is None:
            one = next(got)
            results[i] = (
                batch_item_error(one)
                if isinstance(one, SwarmError)
                else {"status": 200, "body": one.model_dump(), "retry_after": None}
            )
    return JSONResponse({"results": results})


@router.post("/finishes", response_model=BatchResponse)
async def finishes(body: FinishBatch, swarm: Swarm = Depends(worker)) -> Any:
    """Several finishes in one request: each authorized by its own episode key (fenced by its
    epoch), all committed together (group commit), each answered as its single route would."""

    async def one(item: dict) -> dict:
        try:
            ep = swarm.registry.authorize(str(item.get("api_key") or ""), str(item.get("episode_id") or ""))
            req = FinishRequest.model_validate(item)
            return {"status": 200, "body": (await swarm.finish(ep, req)).model_dump(), "retry_after": None}
        except SwarmError as exc:
            return batch_item_error(exc)
        except ValidationError as exc:
            return batch_item_invalid(exc.errors())

    return JSONResponse({"results": list(await asyncio.gather(*(one(i) for i in body.finishes)))})


@router.get("/status", response_model=StatusResponse)
async def status(swarm: Swarm = Depends(worker)) -> StatusResponse:
    return swarm.status()


@router.post("/admin/stop", response_model=AdminResponse)
async def admin_stop(swarm: Swarm = Depends(admin)) -> AdminResponse:
    swarm.request_stop("admin request")
    return AdminResponse(message="stopping", step=swarm.trainer.step)


@router.post("/admin/checkpoint", response_model=AdminResponse)
async def admin_checkpoint(swarm: Swarm = Depends(admin)) -> AdminResponse:
    await swarm.trainer.wait()
    async with swarm.gate.exclusive():
        path = await swarm.checkpoint()
    return AdminResponse(message="checkpoint written", path=str(path), step=swarm.trainer.step)
