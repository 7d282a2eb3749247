"""`VerlEngine`: the `Engine` a swarm server drives when `--engine verl`.

The swarm server stays what it is (episodes, timeline, buffer, batcher, trainer
loop); this engine turns its two calls into verl's:

* `generate`/`stream` go to verl's rollout replicas (vLLM, on the GPUs) through the
  `SlotBroker` actor and verl's `LLMServerClient`; every completion carries the
  weight version verl reports.
* `train_step(batch)` takes one verl slot uid per Roost group, writes the batch as V1
  records into TransferQueue and waits until verl's trainer has trained on it and
  issued the next step's slots (after its weight sync to vLLM). verl computes the
  advantages and the PPO loss itself, with the settings `swarm.engine.verl.config`
  mapped; its per-step metrics go to verl's own logger (`trainer.logger`).

Start-up (`VerlEngine(config)`): compose and validate verl's config, attach to the
job's Ray cluster (`RAY_ADDRESS`, set by `scheduler.verl`'s Slurm job) or start a
local one, run verl's `run_ppo(config, TaskRunnerV1)` in a thread, and wait for the
adapter's broker to appear. Checkpoints are verl's (`trainer.save_freq`,
`trainer.resume_mode=auto` under `out_dir/verl`); `save` records which verl step a
Roost checkpoint corresponds to.

Nothing here ran on a GPU (README, "Engines: verl"): verl 0.9.1 has no CPU training
engine and its rollout needs vLLM on CUDA.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray

from swarm.config.server import ServerConfig
from swarm.engine.base import Completion, GenerateRequest, TokenChunk, TrainBatch, UnsupportedRequest
from swarm.engine.verl.adapter import BROKER_NAME, BROKER_NAMESPACE, HEAD_NODE_ENV
from swarm.engine.verl.config import verl_config
from swarm.engine.verl.records import group_records

STARTUP_TIMEOUT_S = 1800.0  # model load + vLLM start + first weight sync on a big model
STEP_TIMEOUT_S = 3600.0
POINTER = "verl_checkpoint.json"


class VerlEngine:
    """verl's V1 trainer behind Roost's `Engine` interface (see the module docstring)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.model_dir = Path(config.model_dir)
        self.policy_version = 0
        self.verl_cfg = verl_config(config)
        self._failure: BaseException | None = None
        self._init_ray()
        self._thread = threading.Thread(target=self._run_trainer, name="verl-trainer", daemon=True)
        self._thread.start()
        self.broker = self._wait_for_broker()

    def _init_ray(self) -> None:
        """Attach to the job's cluster (or start a local one) with verl's runtime env plus ours."""
        from omegaconf import OmegaConf  # lazy: ships with verl
        from verl.trainer.constants_ppo import get_ppo_ray_runtime_env  # lazy: verl is optional

        runtime_env = get_ppo_ray_runtime_env(self.verl_cfg)
        env = runtime_env.setdefault("env_vars", {})
        env["TRANSFER_QUEUE_ENABLE"] = "1"  # as verl.trainer.main_ppo.run_ppo sets it
        # every worker imports this package: put the checkout on its path unless installed there
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")] if p
        )
        address = self.config.verl.ray_address or os.environ.get("RAY_ADDRESS")
        ray.init(
            address=address, runtime_env=OmegaConf.to_container(OmegaConf.create(runtime_env)), ignore_reinit_error=True
        )
        # known only once Ray runs; the adapter reads it inside verl's TaskRunner
        os.environ[HEAD_NODE_ENV] = ray.get_runtime_context().get_node_id()

    def _run_trainer(self) -> None:
        from verl.trainer.main_ppo import TaskRunnerV1, run_ppo  # lazy: verl is optional

        try:
            run_ppo(
                self.verl_cfg,
                task_runner_class=TaskRunnerV1.options(
                    runtime_env={"env_vars": {HEAD_NODE_ENV: os.environ[HEAD_NODE_ENV]}}
                ),
            )
        except BaseException as exc:  # surfaced by the next engine call
            self._failure = exc

    def _check(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"verl's trainer stopped: {self._failure!r}") from self._failure

    def _wait_for_broker(self) -> Any:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            self._check()
            try:
                return ray.get_actor(BROKER_NAME, namespace=BROKER_NAMESPACE)
            except ValueError:
                time.sleep(2.0)
        raise TimeoutError(f"verl's trainer did not start its rollout adapter within {STARTUP_TIMEOUT_S:.0f}s")

    async def generate(self, request: GenerateRequest) -> Completion:
        self._check()
        p = request.params
        _refuse_unsupported(p.top_logprobs, p.response_format)
        stops = list(p.stop_token_ids)
        out = await self.broker.generate.remote(uuid.uuid4().hex, list(request.prompt_ids), p.max_tokens, stops, p.seed)
        finish = {"aborted": "abort"}.get(
            out["stop_reason"], "length" if len(out["token_ids"]) >= p.max_tokens else "stop"
        )
        return Completion(
            prompt_ids=list(request.prompt_ids),
            token_ids=out["token_ids"],
            logprobs=out["log_probs"],
            finish_reason=finish,
            policy_version=out["weight_version"],
        )

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        """verl's token-in/token-out call is not streamed: one chunk with the whole completion."""
        c = await self.generate(request)
        yield TokenChunk(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Hand one step's groups to verl and wait until it trained on them and synced the weights."""
        self._check()
        samples = batch.samples
        groups = list(dict.fromkeys(s.group_id for s in samples))
        t0 = time.perf_counter()
        slots = ray.get(self.broker.take_slots.remote(len(groups), STEP_TIMEOUT_S))
        step = max(s for _, s in slots)
        records, uids = group_records(samples, [u for u, _ in slots], step)
        oldest = {g: min(s.policy_version for s in samples if s.group_id == g) for g in groups}
        ray.get(self.broker.put_groups.remote(records, [(u, oldest[g]) for u, g in zip(uids, groups)]))
        ray.get(self.broker.wait_issue_step.remote(step + 1, STEP_TIMEOUT_S))
        self._check()
        self.policy_version += 1
        return {
            "verl_step": float(step),
            "samples": float(len(samples)),
            "groups": float(len(groups)),
            "trained_tokens": float(sum(sum(s.loss_mask) for s in samples)),
            "step_s": time.perf_counter() - t0,
            "lr": batch.config.lr,
        }

    def save(self, path: Path) -> None:
        """verl writes its own checkpoints; record which of them this Roost checkpoint means."""
        root = Path(self.verl_cfg.trainer.default_local_dir)
        latest = root / "latest_checkpointed_iteration.txt"
        path.mkdir(parents=True, exist_ok=True)
        (path / POINTER).write_text(
            json.dumps(
                {
                    "verl_dir": str(root),
                    "verl_step": int(latest.read_text().strip()) if latest.exists() else None,
                    "policy_version": self.policy_version,
                }
            )
        )

    def load(self, path: Path) -> None:
        """verl resumes itself (`resume_mode=auto`) from the same directory; check that it is the one recorded."""
        pointer = json.loads((path / POINTER).read_text())
        if Path(pointer["verl_dir"]) != Path(self.verl_cfg.trainer.default_local_dir):
            raise ValueError(
                f"checkpoint {path} belongs to verl run {pointer['verl_dir']}, not "
                f"{self.verl_cfg.trainer.default_local_dir}"
            )

    async def close(self) -> None:
        if ray.is_initialized():
            ray.shutdown()


def _refuse_unsupported(top_logprobs: int, response_format: str | None) -> None:
    """verl's token-in/token-out client (`LLMServerClient.generate`) returns only the sampled tokens'
    logprobs and takes no structured-output parameters: refuse rather than silently ignore."""
    if top_logprobs > 0:
        raise UnsupportedRequest(
            "unsupported_top_logprobs",
            "the verl engine cannot return top_logprobs (verl's rollout client reports only "
            "the sampled tokens' logprobs); use the torch or vllm engine",
        )
    if response_format is not None and json.loads(response_format).get("type") not in (None, "text"):
        raise UnsupportedRequest(
            "unsupported_response_format",
            "the verl engine cannot constrain decoding (verl's rollout client takes no "
            "structured-output parameters); use the torch or vllm engine",
        )


__all__ = ["VerlEngine"]
