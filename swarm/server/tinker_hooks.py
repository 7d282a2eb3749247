"""What the Tinker API (swarm/tinker) gets of this server: its policies, added and removed as
`swarm ctl policy add|remove` does, claims for them refused, and their sampling on whichever engine
serves them (the torch host's batcher, or vLLM with each policy's adapter: `--engine vllm`).

The Tinker package stands below the server (tests/test_architecture.py), so it never imports it;
the server hands it these hooks instead (`PolicyHooks` in swarm/tinker/service.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from swarm.config.policies import PolicySpec
from swarm.config.server import ServerConfig
from swarm.engine.base import Completion, GenerateRequest
from swarm.engine.fake import FakePolicyHost
from swarm.server.exceptions import Conflict
from swarm.server.policies import PolicyRouter
from swarm.server.policy_routes import start_policy, stop_policy
from swarm.server.state import Swarm


class TinkerHooks:
    """What the Tinker API (swarm/tinker) needs of this server: a policy added and removed as
    `swarm ctl policy add|remove` does (its own `Swarm`, so the OpenAI routes serve it by name), with
    claims for it refused (409 `policy_trained_by_primitives`: its trainer is the primitives' client).

    `host` is the server's: a torch `PolicyHost`, or a `VllmPolicyHost` whose torch trainer the
    primitives drive (`add` returns the torch side) while its vLLM serves the samples; after the
    primitives change a policy's weights, `publish` loads its adapter into vLLM as a new version, as
    the swarm trainer's step does."""

    def __init__(self, config: ServerConfig, host: Any, router: PolicyRouter) -> None:
        self.config, self.host, self.router = config, host, router
        self.vllm = config.engine == "vllm"
        self.made: set[str] = set()  # the policies of the Tinker API (every other one: the swarm trainer's)

    async def add(self, name: str, settings: Any) -> Any:
        spec = PolicySpec(name=name, lora=settings)
        config = self.config.for_policy(spec).model_copy(update={"resume": False, "mlflow": False})
        engine = await asyncio.to_thread(self.host.add, name, settings)
        swarm = Swarm(config, engine)

        def refuse(req: Any) -> None:
            raise Conflict(
                "policy_trained_by_primitives",
                f"policy {name!r} is trained through the Tinker API (forward_backward, optim_step): the swarm "
                "trainer does not also train it; sample it through /v1/chat/completions with model="
                f"{name!r}, or claim episodes for another policy",
            )

        swarm.control.before_admit = refuse  # type: ignore[method-assign]
        self.router.add(name, swarm)
        self.made.add(name)
        start_policy(swarm)
        return engine.trainer if self.vllm else engine

    async def remove(self, name: str) -> None:
        swarm = self.router.remove(name)
        swarm.stopping = True
        await stop_policy(swarm)
        await asyncio.to_thread(self.host.remove, name)
        self.made.discard(name)

    def swarm_policies(self) -> list[str]:
        return [n for n in self.router.names() if n not in self.made]

    async def generate(self, name: str | None, request: GenerateRequest) -> Completion:
        if name is not None:
            return await self.host.policies[name].generate(request)
        if self.vllm:
            return await self.host.generate_base(request)
        # torch: every adapter off in the base's rows (an unnamed row would run the active adapter)
        from swarm.engine.continuous import BASE_ADAPTER  # lazy: with the torch host

        return await self.host.base.generate(request, adapter=BASE_ADAPTER)

    def publish(self, name: str) -> dict[str, float]:
        if not self.vllm:
            return {}  # the torch host samples its adapters as they are
        started = time.perf_counter()
        metrics = self.host.policies[name].sync_weights()
        return {"publish_s": time.perf_counter() - started, **{k: float(v) for k, v in metrics.items()}}


def tinker_service(config: ServerConfig, host: Any, router: PolicyRouter) -> Any:
    """The Tinker API's service of a policy server, torch or vLLM (None otherwise: its routes answer 409).
    Its primitives drive the torch host's adapters (a vLLM host's trainer), its samplers the serving engine."""
    if host is None or isinstance(host, FakePolicyHost):
        return None
    from swarm.tinker.service import TinkerService  # lazy: torch and peft, which a fake-engine server never loads

    # the resolved path too: the SDK's samplers are told it as their base model (their get_tokenizer loads it)
    names = list(dict.fromkeys([config.served_model_name, config.model_dir.name, str(config.model_dir)]))
    names += [] if str(config.model_dir.resolve()) in names else [str(config.model_dir.resolve())]
    hooks = TinkerHooks(config, host, router)
    torch_host = host.trainer if hooks.vllm else host
    max_context = host.max_positions if hooks.vllm else host.base.max_positions
    return TinkerService(
        torch_host,
        config.out_dir / "tinker",
        names,
        max_context,
        config.lease_seconds,
        hooks,
        config.lora,
        tokenizer_id=str(config.model_dir.resolve()),
    )


__all__ = ["TinkerHooks", "tinker_service"]
