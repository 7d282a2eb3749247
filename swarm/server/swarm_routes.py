"""The episode API (`/swarm/v1/*`, DESIGN.md §3): claim, heartbeat, finish, abort, status, admin.

Thin: each route authenticates, validates (pydantic models from `swarm.protocol`)
and calls one `Swarm` operation. Worker token for claim/status, the episode key
for an episode's own routes, the admin token for `/admin/*`.
"""

from __future__ import annotations

from fastapi import APIRouter, Header, Request

from swarm.protocol import (
    API_PREFIX, AbortRequest, AbortResponse, AdminResponse, ClaimRequest, ClaimResponse,
    ErrorResponse, FinishRequest, FinishResponse, HeartbeatResponse, StatusResponse,
)
from swarm.server.openai_routes import bearer
from swarm.server.state import Swarm

_errors = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 429, 503)}
router = APIRouter(prefix=API_PREFIX, tags=["swarm"], responses=_errors)


def _swarm(request: Request) -> Swarm:
    return request.app.state.swarm


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/") + "/v1"


@router.post("/episodes", response_model=ClaimResponse)
async def claim(body: ClaimRequest, request: Request, authorization: str | None = Header(None)) -> ClaimResponse:
    swarm = _swarm(request)
    swarm.check_worker(bearer(authorization))
    return swarm.claim(body, _base_url(request))


@router.post("/episodes/{episode_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(episode_id: str, request: Request,
                    authorization: str | None = Header(None)) -> HeartbeatResponse:
    swarm = _swarm(request)
    ep = swarm.episode_for(bearer(authorization), episode_id)
    return HeartbeatResponse(episode_id=ep.id, lease_expires_at=swarm.registry.heartbeat(ep))


@router.post("/episodes/{episode_id}/finish", response_model=FinishResponse)
async def finish(episode_id: str, body: FinishRequest, request: Request,
                 authorization: str | None = Header(None)) -> FinishResponse:
    swarm = _swarm(request)
    return swarm.finish(swarm.episode_for(bearer(authorization), episode_id), body)


@router.post("/episodes/{episode_id}/abort", response_model=AbortResponse)
async def abort(episode_id: str, request: Request, body: AbortRequest | None = None,
                authorization: str | None = Header(None)) -> AbortResponse:
    swarm = _swarm(request)
    return swarm.abort(swarm.episode_for(bearer(authorization), episode_id), body or AbortRequest())


@router.get("/status", response_model=StatusResponse)
async def status(request: Request, authorization: str | None = Header(None)) -> StatusResponse:
    swarm = _swarm(request)
    swarm.check_worker(bearer(authorization))
    return swarm.status()


@router.post("/admin/stop", response_model=AdminResponse)
async def admin_stop(request: Request, authorization: str | None = Header(None)) -> AdminResponse:
    swarm = _swarm(request)
    swarm.check_admin(bearer(authorization))
    swarm.request_stop("admin request")
    return AdminResponse(message="stopping", step=swarm.trainer.step)


@router.post("/admin/checkpoint", response_model=AdminResponse)
async def admin_checkpoint(request: Request, authorization: str | None = Header(None)) -> AdminResponse:
    swarm = _swarm(request)
    swarm.check_admin(bearer(authorization))
    await swarm.trainer.wait()
    async with swarm.gate.exclusive():
        path = await swarm.checkpoint()
    return AdminResponse(message="checkpoint written", path=str(path), step=swarm.trainer.step)
