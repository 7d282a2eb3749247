"""Policies of a running server: start and stop one, and the admin routes that add and remove them.

    POST   /swarm/v1/admin/policies          PolicySpec -> PolicyInfo     (409 policy_exists)
    DELETE /swarm/v1/admin/policies/{name}   -> AdminResponse             (its last checkpoint's path)
    GET    /swarm/v1/admin/policies          -> {"policies": [PolicyInfo...]}

`swarm ctl policy add|remove|list` calls them. A policy added here is what one named at start
is: a fresh adapter on the shared base, its own `Swarm` (out folder `OUT/policies/NAME`), started
at once; a name whose folder holds checkpoints resumes from them. Removing one stops it as a
server stops (its running step ends, its last steps are checkpointed, its MLflow run closes),
then frees its adapter; its episodes still open get 409 `policy_removed` on finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ValidationError

from swarm.config.policies import PolicySpec
from swarm.config.server import ServerConfig
from swarm.engine.adapter_files import LoraError, check_saved, is_adapter_dir, read_adapter_config
from swarm.engine.base import EngineError
from swarm.protocol import API_PREFIX, AdminResponse, ErrorResponse
from swarm.server.auth import admin, policies
from swarm.server.auth_first import AuthFirstRoute
from swarm.server.checkpoint import Checkpointer
from swarm.server.errors import describe_validation
from swarm.server.exceptions import Conflict, InvalidRequest
from swarm.server.state import Swarm

log = logging.getLogger("swarm.server")

_errors = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409)}
router = APIRouter(prefix=f"{API_PREFIX}/admin", tags=["admin"], responses=_errors, route_class=AuthFirstRoute)


class PolicyInfo(BaseModel):
    name: str
    step: int
    policy_version: int
    out_dir: str
    lora_rank: int


def info(swarm: Swarm) -> PolicyInfo:
    c = swarm.config
    return PolicyInfo(
        name=swarm.model_name,
        step=swarm.trainer.step,
        policy_version=swarm.engine.policy_version,
        out_dir=str(c.out_dir),
        lora_rank=c.lora.rank,
    )


def start_policy(swarm: Swarm) -> None:
    """What a server does for a policy once serving: the lease sweeper runs, replayed groups train."""
    swarm.leases.start()
    swarm.trainer.kick()


async def stop_policy(swarm: Swarm) -> None:
    """A policy's end: no step cut halfway, the steps since its last checkpoint kept, its MLflow run closed."""
    await swarm.leases.stop()
    await swarm.trainer.wait()
    if swarm.config.checkpoint_on_stop and swarm.trainer.step > swarm.checkpointed_step:
        await swarm.checkpoint()
    if swarm.tracking is not None:
        await asyncio.to_thread(swarm.tracking.close)


def wire_stop(swarms: list[Swarm], all_swarms: Callable[[], list[Swarm]], stop_server: Callable[[], None]) -> None:
    """The server exits once every policy has stopped (each at its own max_steps, or all by admin stop)."""

    def one_stopped() -> None:
        if all(s.stopping for s in all_swarms()):
            stop_server()

    for swarm in swarms:
        swarm.stop_callback = one_stopped


def _check_resumable(name: str, config: ServerConfig) -> None:
    """A name whose folder holds checkpoints resumes the latest: its adapter must fit the settings given,
    checked from its config before anything is built (a rank-8 checkpoint does not load into rank 4)."""
    latest = Checkpointer(Path(config.out_dir) / "checkpoints").latest()
    if latest is None or not is_adapter_dir(latest):
        return  # nothing to resume, or no adapter files to read (the engine's load says what is wrong)
    try:
        check_saved(latest, config.lora)
    except LoraError:
        saved = read_adapter_config(latest)
        raise InvalidRequest(
            "invalid_policy",
            f"policy {name!r} would resume its checkpoint {latest}, an adapter of lora_rank={saved.get('r')} "
            f"lora_alpha={saved.get('lora_alpha')}, not lora_rank={config.lora.rank} "
            f"lora_alpha={config.lora.alpha:g}: add it with those settings to resume it, or under a new name",
        ) from None


@router.get("/policies")
async def list_policies(request: Request, _: Swarm = Depends(admin)) -> dict[str, Any]:
    return {"policies": [info(s).model_dump() for s in policies(request)]}


@router.post("/policies", response_model=PolicyInfo)
async def add_policy(body: dict[str, Any], request: Request, _: Swarm = Depends(admin)) -> PolicyInfo:
    app = request.app
    host = getattr(app.state, "host", None)
    if host is None:
        raise Conflict(
            "not_a_policy_server",
            "this server trains one model, not policies on a shared base: start it with --policy NAME "
            "(and --lora-rank r) to add policies at run time",
        )
    try:
        spec = PolicySpec.model_validate(body)
    except ValidationError as exc:
        raise InvalidRequest("invalid_policy", describe_validation(list(exc.errors()))) from None
    router_ = policies(request)
    if spec.name in router_.swarms:
        raise Conflict("policy_exists", f"a policy named {spec.name!r} is already served")
    base: ServerConfig = app.state.config
    # The server's own checks (a full-parameter policy, train knobs) on the start list with it; a policy
    # of that list removed since may come back under its name (it was refused as "named more than once").
    others = [p.model_dump() for p in base.policies or [] if p.name != spec.name]
    try:
        base.model_validate({**base.model_dump(), "policies": [*others, spec.model_dump()]})
    except ValidationError as exc:  # the server's own checks name the policy themselves
        wrong = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise InvalidRequest("invalid_policy", wrong) from None
    config = base.for_policy(spec).model_copy(update={"resume": True})
    _check_resumable(spec.name, config)
    try:
        engine = await asyncio.to_thread(host.add, spec.name, config.lora)
    except ValueError as exc:  # LoraError included: a rank the model cannot take
        raise InvalidRequest("invalid_policy", str(exc)) from None
    try:
        swarm = Swarm(config, engine)
    except BaseException as exc:  # its adapter freed, or the name could never be added again ("already exists")
        await asyncio.to_thread(host.remove, spec.name)
        if isinstance(exc, EngineError):  # its checkpoint would not load
            raise InvalidRequest("invalid_policy", f"policy {spec.name!r}: {exc}") from None
        raise
    router_.add(spec.name, swarm)
    stop = getattr(app.state, "stop_server", None)
    if stop is not None:
        wire_stop([swarm], lambda: list(router_), stop)
    start_policy(swarm)
    log.info("policy %s added (out %s)", spec.name, config.out_dir)
    return info(swarm)


@router.delete("/policies/{name}", response_model=AdminResponse)
async def remove_policy(name: str, request: Request, _: Swarm = Depends(admin)) -> AdminResponse:
    host = getattr(request.app.state, "host", None)
    if host is None:
        raise Conflict("not_a_policy_server", "this server trains one model, not policies on a shared base")
    swarm = policies(request).remove(name)  # 404 unknown, 409 the last one; new claims and calls 404 from here
    swarm.stopping = True  # its open episodes' calls get 503, their finishes 409 policy_removed
    swarm.wake_claims()
    await stop_policy(swarm)
    await asyncio.to_thread(host.remove, name)
    log.info("policy %s removed (last checkpoint %s)", name, swarm.last_checkpoint)
    return AdminResponse(message=f"policy {name} removed", path=swarm.last_checkpoint, step=swarm.trainer.step)


__all__ = ["PolicyInfo", "router", "start_policy", "stop_policy", "wire_stop"]
