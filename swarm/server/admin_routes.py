"""Admin routes for live control (admin token): config, pause, resume.

    GET  /swarm/v1/admin/config        -> LiveConfigResponse (values now, pending, quotas and slots)
    POST /swarm/v1/admin/config        LiveConfigUpdate (partial) -> LiveConfigResponse (+ `changed`)
    POST /swarm/v1/admin/pause|resume  -> AdminResponse

`stop` and `checkpoint` live beside the episode API (`swarm_routes.py`). What a
change does and when it takes effect: `swarm/server/control.py`. The CLI is
`swarm ctl` (`swarm/ctl.py`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from swarm.protocol import API_PREFIX, AdminResponse, ErrorResponse
from swarm.server.admin_schema import LiveConfigResponse, LiveConfigUpdate
from swarm.server.auth import admin
from swarm.server.auth_first import AuthFirstRoute
from swarm.server.state import Swarm

_errors = {code: {"model": ErrorResponse} for code in (400, 401, 403, 413, 503)}
router = APIRouter(prefix=f"{API_PREFIX}/admin", tags=["admin"], responses=_errors, route_class=AuthFirstRoute)


@router.get("/config", response_model=LiveConfigResponse)
async def get_config(swarm: Swarm = Depends(admin)) -> LiveConfigResponse:
    return swarm.control.describe()


@router.post("/config", response_model=LiveConfigResponse)
async def set_config(body: LiveConfigUpdate, swarm: Swarm = Depends(admin)) -> LiveConfigResponse:
    return swarm.control.update(body)


@router.post("/pause", response_model=AdminResponse)
async def pause(swarm: Swarm = Depends(admin)) -> AdminResponse:
    if swarm.control.paused:  # idempotent, and said so
        return AdminResponse(message="already paused: new claims get 429 until resume", step=swarm.trainer.step)
    swarm.control.pause()
    return AdminResponse(message="paused: new claims get 429 until resume", step=swarm.trainer.step)


@router.post("/resume", response_model=AdminResponse)
async def resume(swarm: Swarm = Depends(admin)) -> AdminResponse:
    if not swarm.control.paused:
        return AdminResponse(message="not paused: nothing to resume", step=swarm.trainer.step)
    swarm.control.resume()
    return AdminResponse(message="resumed", step=swarm.trainer.step)
