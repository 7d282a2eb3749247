"""Several LoRA policies on one base model: a `PolicyHost` and one `PolicyEngine` view per policy.

    host = PolicyHost(model_dir)                     # the base, loaded once, frozen
    a = host.add("planner", LoraSettings(rank=8))    # an adapter, its own optimizer and version
    b = host.add("executor", LoraSettings(rank=16))
    await a.generate(request)                        # rows of a and b share each forward pass
    a.train_step(batch)                              # trains a's adapter only: b and the base stay bit-identical

Why one base for many policies: a team's roles, a study's trials or a Tinker user's runs would
otherwise each load the whole model and its AdamW state; here each costs an adapter (megabytes)
and the optimizer state of the adapter only.

Each `PolicyEngine` is an `Engine` (swarm/engine/base.py) of its own, so the server wires one
`Swarm` per policy exactly as it wires one for a whole engine: its own windows, groups, trainer,
checkpoints and metrics. What they share is the host's model and its continuous batcher: a
forward pass runs the rows of every policy together, each row through its own adapter (peft's
per-row `adapter_names`, swarm/engine/adapter_routing.py `rows_scope`), and a prompt prefilled by one
adapter is never reused for another (swarm/engine/continuous.py).

A step runs beside the other policies' generation. Nothing in it switches the shared model:
adapters are chosen per thread (swarm/engine/adapter_routing.py: the step's forwards run its own
adapter, its KL reference the base, while the batcher's thread runs each row's), and the model
stays in eval mode, which computes what train mode does when every dropout is 0. Only the weight
update itself (the optimizer's step, dropping the policy's cached prefills, its version) holds
the host's lock, between two forwards; the server's `GenerationGate` of the training policy
holds back that policy's own calls until its new weights are in. Steps of different policies
run at once too, as many as the cores hold (`StepSlots`, swarm/engine/step_slots.py): each has
its own adapter, gradients and optimizer. Adding and removing a policy change the model's layers
and wait for every step. A policy with dropout (or a base whose attention has it) needs train
mode, which is the whole model's: while any such policy is served, every step holds the model
alone, as a single-policy engine does.

The KL reference is the base with every adapter off (for this thread only), as for one adapter.
Checkpoints hold one policy's adapter, its optimizer state and its version: the same files a
single-adapter run writes, so `swarm model export --merge`, `swarm eval` and resume read them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import torch

from swarm.config.lora import LoraSettings
from swarm.config.policies import check_name
from swarm.engine.adapter_routing import adapter_parameters, install, route, rows_scope, train_every_adapter
from swarm.engine.base import Completion, GenerateRequest, TokenChunk, TrainBatch
from swarm.engine.lora import LoraError, add_adapter, attach, load_adapter, save_adapter
from swarm.engine.policy_step import policy_step
from swarm.engine.precision import MasterWeightAdamW, build_optimizer
from swarm.engine.step_slots import StepSlots
from swarm.engine.torch_engine import (
    OPTIMIZER_FILE,
    STATE_FILE,
    EngineError,
    GenMark,
    TorchEngine,
    generation_since,
    load_optimizer,
)


def step_slots(device: torch.device) -> int:
    """Steps at once: a CPU's cores over the threads one step's torch uses; one on a GPU, where a second
    step would queue on the same device and only add its activations' memory (autograd runs every
    backward on a CUDA device in that device's one thread)."""
    if device.type != "cpu":
        return 1
    return max(1, len(os.sched_getaffinity(0)) // max(1, torch.get_num_threads()))


class PolicyHost:
    """The shared base (a `TorchEngine` that trains nothing itself) and its named LoRA policies."""

    def __init__(
        self,
        model_dir: Path,
        seed: int = 0,
        device: str | None = None,
        max_batch: int = 128,
        dtype: str | None = None,
    ) -> None:
        self.base = TorchEngine(
            model_dir, seed=seed, device=device, max_batch=max_batch, reference=False, dtype=dtype, trainable=False
        )
        self.base.model.requires_grad_(False)  # the base never trains: only adapters get gradients
        self.model_dir = Path(model_dir)
        self.peft: Any = None  # the peft wrapper, made with the first policy
        self.policies: dict[str, PolicyEngine] = {}
        self._adapters = 0  # adapters ever added: each gets a fresh peft name
        #: steps of different policies at once, as many as the cores hold (one on a GPU), beside generation;
        #: what changes the model itself (adding or removing a policy, train mode) alone
        self.slots = StepSlots(step_slots(self.base.device))
        #: whether a step may run beside generation: no dropout anywhere (eval mode computes what train mode does)
        self.steps_beside_generation = True

    @property
    def lock(self) -> Any:
        """Held by every forward of the batcher and every weight update: one at a time."""
        return self.base._lock

    @contextlib.contextmanager
    def step_turn(self) -> Iterator[bool]:
        """A step's turn; True: it runs beside generation and other steps (eval mode, no dropout anywhere),
        False: it holds the model alone (train mode is the whole model's). Neither changes meanwhile:
        adding or removing a policy waits for every running step."""
        with self.slots.step():
            if self.steps_beside_generation:
                yield True
                return
        with self.exclusive():
            yield False

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """No step, no forward: for what changes the model's layers or an adapter's weights outside a step."""
        with self.slots.exclusive(), self.lock:
            yield

    def add(self, name: str, settings: LoraSettings) -> PolicyEngine:
        """A new policy: a fresh adapter (equal to the base until it trains) with its own optimizer.

        ValueError for a name in use or not usable; `LoraError` for settings the model cannot take.
        """
        check_name(name)
        if not settings.enabled:
            raise LoraError(
                f"policy {name!r} has --lora-rank 0 (full fine-tuning): policies that share a base train "
                "LoRA adapters; give it --lora-rank r > 0, or serve it alone"
            )
        with self.exclusive():
            if name in self.policies:
                raise ValueError(f"a policy named {name!r} already exists")
            # peft's name for it: never the policy's own, which may hold '.' (a module path separator
            # to torch) or be a substring of 'lora_' (peft then mistakes keys when loading)
            adapter = f"policy{self._adapters}"
            if self.peft is None:
                self.peft = attach(self.base.model, settings, self.model_dir, adapter_name=adapter)
                self.base.batcher.adapter_scope = rows_scope
                self.base.model = self.peft
            else:
                add_adapter(self.peft, adapter, settings, self.model_dir)
            install(self.peft)  # layers peft wrapped for these targets just now are of its own classes: route them
            train_every_adapter(self.peft)
            self._adapters += 1
            self.peft.eval()  # peft hands the model back in training mode; steps switch it themselves
            policy = PolicyEngine(self, name, adapter, settings)
            self.policies[name] = policy
            self._check_dropout()
        return policy

    def _check_dropout(self) -> None:
        config = getattr(self.base.network, "config", None)
        attention = float(getattr(config, "attention_dropout", 0.0) or 0.0)
        self.steps_beside_generation = attention == 0 and not any(
            isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.peft.modules()
        )

    def remove(self, name: str) -> None:
        """Drop a policy: its adapter and optimizer state are freed (its checkpoints stay on disk)."""
        with self.exclusive():
            policy = self.policies.pop(name, None)
            if policy is None:
                raise KeyError(name)
            self.base.batcher.drop_adapter(policy.adapter)  # its calls in flight end ("abort")
            if self.policies:
                if policy.adapter in self.peft.base_model.active_adapters:  # else peft warns it picks another
                    self.peft.base_model.set_adapter(next(iter(self.policies.values())).adapter)
                self.peft.delete_adapter(policy.adapter)
                train_every_adapter(self.peft)
                self._check_dropout()
            else:  # peft keeps one adapter at least: the last one is zeroed out of use instead
                self.peft.base_model.set_adapter([])  # type: ignore[arg-type]
            policy.optimizer = None

    def policy(self, name: str) -> PolicyEngine:
        return self.policies[name]

    async def close(self) -> None:
        await self.base.close()


class PolicyEngine:
    """One policy of a `PolicyHost`: the `Engine` a server's `Swarm` drives."""

    def __init__(self, host: PolicyHost, name: str, adapter: str, settings: LoraSettings) -> None:
        self.host = host
        self.name = name
        self.adapter = adapter  # peft's name for this policy's adapter
        self.lora = settings
        self.model_dir = host.model_dir
        self.tokenizer = host.base.tokenizer
        self.max_positions = host.base.max_positions
        self.policy_version = 0
        self.share_prefix = host.base.placement.share_prefix
        self._gen_mark: GenMark = (0.0, 0, 0, 0)
        self.optimizer: Any = build_optimizer(host.peft, host.base.placement, adapter_parameters(host.peft, adapter))

    # -- generation -------------------------------------------------------------
    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        self._live()  # never submit a row naming a deleted adapter: its whole batch would fail
        async for chunk in self.host.base.stream(request, adapter=self.adapter):
            yield chunk

    async def generate(self, request: GenerateRequest) -> Completion:
        self._live()
        version = self.policy_version
        out = await self.host.base.generate(request, adapter=self.adapter)
        out.policy_version = version
        return out

    def _live(self) -> Any:
        """The peft model, while this policy is served; `EngineError` once it was removed."""
        if self.optimizer is None:
            raise EngineError(f"policy {self.name!r} was removed")
        return self.host.peft

    # -- training ---------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        config = batch.config.model_copy(update={"lr": batch.config.lr * self.lora.lr_scale})
        host = self.host
        published: dict[str, float] = {}

        @contextlib.contextmanager
        def update(hold: bool) -> Iterator[None]:  # the new weights, their prefills and version appear together
            with host.lock if hold else contextlib.nullcontext():
                yield
                host.base.batcher.weights_changed(self.adapter)
                self.policy_version += 1
                gen, self._gen_mark = generation_since(host.base.batcher, self._gen_mark)
                published.update(gen)

        with host.step_turn() as beside, route(self.adapter):
            model = self._live()
            metrics = policy_step(
                model,
                self.optimizer,
                batch.samples,
                config,
                reference=model if config.kl_coef else None,  # the base: this thread's adapters off
                share_prefix=self.share_prefix,
                token_advantages=batch.token_advantages,
                teacher=batch.teacher,
                update=update(hold=beside),
                switch_mode=not beside,
            )
        metrics["policy_version"] = float(self.policy_version)
        metrics.update(published)  # the shared engine's generation since this policy's last step: every policy's rows
        return metrics

    def logprobs(self, ids: list[int]) -> list[float]:
        """Teacher-forced logprob of each token after the first, through this policy's adapter."""
        with self.host.lock, torch.inference_mode():
            self._live()
            t = torch.tensor([ids], device=self.host.base.device)
            with route(self.adapter):
                logits = self.host.base.network(input_ids=t).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, t[0, 1:].unsqueeze(-1)).squeeze(-1)
        return lp.tolist()

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """This policy's adapter weights (copies), for checks and tests."""
        from peft import get_peft_model_state_dict  # lazy: peft is loaded (a host has adapters)

        with self.host.lock:
            return {
                k: v.detach().clone()
                for k, v in get_peft_model_state_dict(self._live(), adapter_name=self.adapter).items()
            }

    # -- persistence ------------------------------------------------------------
    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {
            "policy_version": self.policy_version,
            "policy": self.name,
            "base_model": str(self.model_dir.resolve()),
            "lora": self.lora.model_dump(mode="json"),
        }
        with self.host.lock:
            save_adapter(self._live(), path, adapter_name=self.adapter)
            self.tokenizer.save_pretrained(path)
            torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)
            (path / STATE_FILE).write_text(json.dumps(state))

    def load(self, path: Path) -> None:
        path = Path(path)
        with self.host.exclusive():
            model = self._live()
            try:
                load_adapter(model, path, self.lora, adapter_name=self.adapter)
            except LoraError as exc:
                raise EngineError(str(exc)) from None
            self.host.base.batcher.weights_changed(self.adapter)
            if isinstance(self.optimizer, MasterWeightAdamW):
                self.optimizer.sync_from_model()
            if (path / OPTIMIZER_FILE).exists():
                load_optimizer(self.optimizer, model, path / OPTIMIZER_FILE, self.host.base.device)
            if (path / STATE_FILE).exists():
                self.policy_version = int(json.loads((path / STATE_FILE).read_text())["policy_version"])

    def counters(self) -> dict[str, int]:
        return {}

    async def close(self) -> None:
        """The host owns the model: closing one policy's view closes nothing."""
        await asyncio.sleep(0)


__all__ = ["PolicyEngine", "PolicyHost", "check_name"]
