"""What the Tinker API (swarm/tinker) gets of this server: its policies, added and removed as
`swarm ctl policy add|remove` does, and claims for them refused.

The Tinker package stands below the server (tests/test_architecture.py), so it never imports it;
the server hands it these hooks instead (`PolicyHooks` in swarm/tinker/service.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from swarm.config.policies import PolicySpec
from swarm.config.server import ServerConfig
from swarm.engine.fake import FakePolicyHost
from swarm.server.exceptions import Conflict
from swarm.server.policies import PolicyRouter
from swarm.server.policy_routes import start_policy, stop_policy
from swarm.server.state import Swarm


class TinkerHooks:
    """What the Tinker API (swarm/tinker) needs of this server: a policy added and removed as
    `swarm ctl policy add|remove` does (its own `Swarm`, so the OpenAI routes serve it by name), with
    claims for it refused (409 `policy_trained_by_primitives`: its trainer is the primitives' client)."""

    def __init__(self, config: ServerConfig, host: Any, router: PolicyRouter) -> None:
        self.config, self.host, self.router = config, host, router
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
        return engine

    async def remove(self, name: str) -> None:
        swarm = self.router.remove(name)
        swarm.stopping = True
        await stop_policy(swarm)
        await asyncio.to_thread(self.host.remove, name)
        self.made.discard(name)

    def swarm_policies(self) -> list[str]:
        return [n for n in self.router.names() if n not in self.made]


def tinker_service(config: ServerConfig, host: Any, router: PolicyRouter) -> Any:
    """The Tinker API's service of a torch policy server (None otherwise, a vLLM one included: its routes
    answer 409; its primitives drive the torch host's adapters and batcher directly)."""
    if host is None or isinstance(host, FakePolicyHost) or config.engine == "vllm":
        return None
    from swarm.tinker.service import TinkerService  # lazy: torch and peft, which a fake-engine server never loads

    names = [config.served_model_name, config.model_dir.name, str(config.model_dir)]
    hooks = TinkerHooks(config, host, router)
    return TinkerService(
        host, config.out_dir / "tinker", names, host.base.max_positions, config.lease_seconds, hooks, config.lora
    )


__all__ = ["TinkerHooks", "tinker_service"]
