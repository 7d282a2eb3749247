"""The Ray side of the verl engine: verl's AgentLoopManager replacement and the slot broker.

verl's `TaskRunnerV1` builds `SwarmRolloutAdapter` (via
`actor_rollout_ref.rollout.agent.agent_loop_manager_class`) with the trainer's
`LLMServerClient` and calls only its non-blocking `generate_sequences(batch)`
(docs/verl.md, "How verl is driven"). The adapter hands each batch's slot uids to
`SlotBroker`, a named Ray actor that the swarm server's `VerlEngine` reaches from
its own process:

* generation: `broker.generate` -> `LLMServerClient.generate` (token-in/token-out,
  verl's load balancer and, in colocate_async, its admission gate), with the weight
  version verl reports;
* training: `broker.take_slots(n)` hands the engine n slot uids; the engine writes one
  Roost group per uid with `broker.put_groups` (records of `swarm.engine.verl.records`
  into TransferQueue, then the uid's `finished` tag), which is what verl's ReplayBuffer
  waits for before it trains.

Runs only where verl and Ray are installed (`pip install 'roost[verl]'`).
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import Any

import ray
import transfer_queue as tq
from verl.utils import tensordict_utils as tu

from swarm.engine.verl.records import Record

BROKER_NAME = "roost-swarm-broker"
BROKER_NAMESPACE = "roost"
HEAD_NODE_ENV = "ROOST_VERL_HEAD_NODE"


@ray.remote
class SlotBroker:
    """Slots issued by verl's trainer, matched with groups the swarm server finished."""

    def __init__(self, llm_client: Any, temperature: float) -> None:
        tq.init()  # attaches to the trainer's TransferQueue controller (one per Ray cluster)
        self.llm = llm_client
        self.temperature = temperature
        self.slots: deque[tuple[str, int]] = deque()
        self.issued = asyncio.Condition()
        self.latest_issue_step = 0
        self.weight_version = 0

    async def add_slots(self, uids: list[str], global_steps: int) -> None:
        async with self.issued:
            self.slots.extend((u, int(global_steps)) for u in uids)
            self.latest_issue_step = max(self.latest_issue_step, int(global_steps))
            self.issued.notify_all()

    async def take_slots(self, n: int, timeout_s: float) -> list[tuple[str, int]]:
        """n slots, oldest first, waiting up to `timeout_s` for verl to issue them."""
        async with self.issued:
            await asyncio.wait_for(self.issued.wait_for(lambda: len(self.slots) >= n), timeout_s)
            return [self.slots.popleft() for _ in range(n)]

    async def wait_issue_step(self, step: int, timeout_s: float) -> int:
        """Block until verl issued slots of step >= `step` (it finished the steps before)."""
        async with self.issued:
            await asyncio.wait_for(self.issued.wait_for(lambda: self.latest_issue_step >= step), timeout_s)
            return self.latest_issue_step

    async def put_groups(self, records: list[Record], groups: list[tuple[str, int]]) -> None:
        """Write the records to TransferQueue, then mark each slot uid finished (docs/verl.md, "Records")."""
        if records:
            await tq.async_kv_batch_put(
                keys=[r.key for r in records],
                partition_id="train",
                fields=tu.list_of_dict_to_tensordict([r.fields for r in records]),
                tags=[r.tag for r in records],
            )
        for uid, oldest_version in groups:
            # re-base the staleness clock to the oldest weights that generated the group (docs/verl.md, "Slots")
            await tq.async_kv_put(
                key=uid, partition_id="train", tag={"status": "finished", "global_steps": int(oldest_version) + 1}
            )

    async def generate(
        self, request_id: str, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int], seed: int | None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": 1.0,
            "top_k": -1,
            "logprobs": True,
            "max_tokens": int(max_tokens),
        }  # always explicit (docs/verl.md, "Generation")
        if stop_token_ids:
            params["stop_token_ids"] = list(stop_token_ids)
        if seed is not None:
            params["seed"] = int(seed)
        out = await self.llm.generate(request_id, prompt_ids=list(prompt_ids), sampling_params=params)
        version = int((out.extra_fields or {}).get("global_steps", self.weight_version) or 0)
        self.weight_version = max(self.weight_version, version)
        return {
            "token_ids": list(out.token_ids),
            "log_probs": list(out.log_probs or []),
            "stop_reason": out.stop_reason,
            "weight_version": version,
        }


class SwarmRolloutAdapter:
    """verl's AgentLoopManager contract: `create(...)`, then non-blocking `generate_sequences`."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    @classmethod
    def create(
        cls, config: Any, llm_client: Any, teacher_client: Any = None, reward_loop_worker_handles: Any = None, **_: Any
    ) -> SwarmRolloutAdapter:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: only on a cluster

        # near the swarm server (VerlEngine puts its node id in every worker's environment):
        # verl's TaskRunner, where this runs, may land on any node (docs/verl.md, "Ray and Slurm")
        head = os.environ.get(HEAD_NODE_ENV)
        options: dict[str, Any] = {"name": BROKER_NAME, "namespace": BROKER_NAMESPACE, "max_concurrency": 4096}
        if head is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=head, soft=True)
        broker = SlotBroker.options(**options).remote(llm_client, float(config.actor_rollout_ref.rollout.temperature))
        return cls(broker)

    def generate_sequences(self, prompts: Any) -> None:
        """Register the batch's slot uids and return at once (verl's extend_guide contract)."""
        uids = [str(u) for u in tu.get(prompts, "uid")]
        self.broker.add_slots.remote(uids, int(tu.get(prompts, "global_steps")))


__all__ = ["BROKER_NAME", "BROKER_NAMESPACE", "HEAD_NODE_ENV", "SlotBroker", "SwarmRolloutAdapter"]
