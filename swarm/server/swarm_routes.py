"""The episode API (`/swarm/v1/*`, DESIGN.md §3): claim, heartbeat, finish, abort, status, stop, checkpoint.

Thin: each route authenticates (`auth.py`), validates (pydantic models from
`swarm.protocol`) and calls one `Swarm` operation. Worker token for claim/status,
the episode key for an episode's own routes, the admin token for `/admin/stop`
and `/admin/checkpoint` (live control is in `admin_routes.py`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from swarm.protocol import (
    API_PREFIX, AbortRequest, AbortResponse, AdminResponse, ClaimRequest, ClaimResponse,
    ErrorResponse, FinishRequest, FinishResponse, HeartbeatResponse, StatusResponse,
)
from swarm.server.auth import admin, current_swarm, episode, worker
from swarm.server.episodes import Episode
from swarm.server.state import Swarm

_errors = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 429, 503)}
router = APIRouter(prefix=API_PREFIX, tags=["swarm"], responses=_errors)


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
    return current_swarm(request).finish(ep, body)


@router.post("/episodes/{episode_id}/abort", response_model=AbortResponse)
async def abort(request: Request, body: AbortRequest | None = None,
                ep: Episode = Depends(episode)) -> AbortResponse:
    return current_swarm(request).abort(ep, body or AbortRequest())


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
