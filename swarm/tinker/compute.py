"""Tinker's primitives on one LoRA policy of the shared base (torch): forward, forward_backward,
optim_step, teacher-forced logprobs.

    acc = GradStash()
    out = forward_backward(policy, datums, "ppo", {"clip_low_threshold": 0.9}, acc)   # grads into acc
    metrics = optim_step(policy, AdamStep(lr=1e-4, ...), acc)                         # applied, cleared

Tinker's semantics, not the swarm trainer's: gradients of successive `forward_backward` calls add
up until `optim_step` applies them with the Adam hyperparameters that step names (the client owns
the schedule), and the loss is the sum the loss module defines (`swarm.algorithms.tinker_losses`).

Between a policy's `forward_backward` and its `optim_step` other policies of the host may train
(the swarm trainer's steps zero and clip every gradient the model holds), so the accumulated
gradients of this adapter are kept beside the model (`GradStash`), not in `param.grad`: each call
puts them back, adds its own, and takes them out again, all under the host's lock.

Every call holds the host's lock, as a swarm step does: peft's active adapter and the module's
train/eval mode are model-wide, so no generation forward may run while they are switched.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from swarm.algorithms.tinker_losses import tinker_loss
from swarm.engine.adapter_routing import route
from swarm.engine.policies import PolicyEngine
from swarm.engine.policy_step import micro_batches
from swarm.engine.precision import MasterWeightAdamW
from swarm.tinker.wire import MASK_LOGPROB

TOKEN_BUDGET = 8192  # tokens per micro-batch of a forward(_backward): rows x longest row


@dataclass
class Datum:
    """One training example: `tokens` in, `targets` (same length) predicted, per-token loss inputs."""

    tokens: list[int]
    targets: list[int]
    inputs: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class AdamStep:
    lr: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0: no clipping


class GradStash:
    """A policy's accumulated gradients between forward_backward calls (None: nothing accumulated)."""

    def __init__(self) -> None:
        self.grads: list[torch.Tensor | None] | None = None
        self.datums = 0

    def restore(self, params: list[torch.Tensor]) -> None:
        for p, g in zip(params, self.grads or [None] * len(params)):
            p.grad = g

    def take(self, params: list[torch.Tensor]) -> None:
        self.grads = [p.grad for p in params]
        for p in params:
            p.grad = None

    def clear(self) -> None:
        self.grads = None
        self.datums = 0


def _params(policy: PolicyEngine) -> list[torch.Tensor]:
    """The adapter's parameters, as its optimizer holds them (the model's own, or their fp32 masters'
    model twins)."""
    opt = policy.optimizer
    if isinstance(opt, MasterWeightAdamW):
        return list(opt.params)  # type: ignore[attr-defined]
    return [p for g in opt.param_groups for p in g["params"]]


def _logprobs(policy: PolicyEngine, datums: list[Datum], idx: list[int]) -> torch.Tensor:
    """[rows, width] logprob of each row's target at each position (padding: 0), with grad if enabled."""
    base = policy.host.base
    width = max(len(datums[i].tokens) for i in idx)
    ids = torch.zeros((len(idx), width), dtype=torch.long)
    tgt = torch.zeros((len(idx), width), dtype=torch.long)
    attn = torch.zeros((len(idx), width), dtype=torch.long)
    for r, i in enumerate(idx):
        n = len(datums[i].tokens)
        ids[r, :n] = torch.tensor(datums[i].tokens)
        tgt[r, :n] = torch.tensor(datums[i].targets)
        attn[r, :n] = 1
    ids, tgt, attn = ids.to(base.device), tgt.to(base.device), attn.to(base.device)
    logits = base.network(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
    return F.log_softmax(logits, dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)


def forward_backward(
    policy: PolicyEngine,
    datums: list[Datum],
    loss_fn: str,
    config: dict[str, float],
    stash: GradStash,
    forward_only: bool = False,
) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """Per datum {"logprobs", "elementwise_loss"} and the metrics ("loss:sum"); with
    `forward_only=False` the loss's gradients are added to `stash`. Inputs were checked by the caller."""
    t0 = time.perf_counter()
    host = policy.host
    outputs: list[dict[str, np.ndarray]] = [{} for _ in datums]
    total = 0.0
    with host.exclusive(), route(policy.adapter):  # train mode below is the whole model's: nothing beside it
        model = policy._live()
        params = _params(policy)
        if not forward_only:
            stash.restore(params)
        model.train(not forward_only)
        try:
            with torch.set_grad_enabled(not forward_only):
                for idx in micro_batches([len(d.tokens) for d in datums], TOKEN_BUDGET):
                    lp = _logprobs(policy, datums, idx)
                    flat_lp, spans = [], []
                    keys = {k for i in idx for k in datums[i].inputs}
                    flat_in: dict[str, list[float]] = {k: [] for k in keys}
                    for r, i in enumerate(idx):
                        n = len(datums[i].tokens)
                        flat_lp.append(lp[r, :n])
                        spans.append((i, n))
                        for key in keys:  # only `weights` may be left out (then 1), as checked before
                            flat_in[key].extend(datums[i].inputs.get(key, [1.0] * n))
                    logp = torch.cat(flat_lp)
                    tensors = {k: torch.tensor(v, dtype=torch.float32, device=logp.device) for k, v in flat_in.items()}
                    terms = tinker_loss(loss_fn, logp, tensors, config)
                    if not forward_only:
                        terms.loss.backward()
                    total += float(terms.loss.detach())
                    lp_host = logp.detach().cpu().numpy()
                    el_host = terms.elementwise.cpu().numpy()
                    at = 0
                    for i, n in spans:
                        outputs[i] = {"logprobs": lp_host[at : at + n], "elementwise_loss": el_host[at : at + n]}
                        at += n
        finally:
            if not forward_only:
                stash.take(params)
                stash.datums += len(datums)
            model.eval()
    return outputs, {"loss:sum": total, "step_s:max": time.perf_counter() - t0}


def optim_step(policy: PolicyEngine, step: AdamStep, stash: GradStash) -> dict[str, float]:
    """Apply the accumulated gradients with AdamW as `step` says; clears them. A non-finite gradient
    norm skips the update (metrics `skipped` 1), as the swarm trainer's step does."""
    host = policy.host
    with host.exclusive():
        policy._live()
        params = _params(policy)
        stash.restore(params)
        opt = policy.optimizer
        for group in opt.param_groups:
            group.update(lr=step.lr, betas=(step.beta1, step.beta2), eps=step.eps, weight_decay=step.weight_decay)
        if isinstance(opt, MasterWeightAdamW):  # bf16 weights: the fp32 masters take the grads
            grads = [m for m in opt.gather_grads() if m.grad is not None]
        else:
            grads = [p for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in grads]) if grads else torch.zeros(())
        finite = bool(torch.isfinite(norm))
        if grads and finite and step.grad_clip_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(grads, step.grad_clip_norm, norm)
        if grads and finite:
            opt.step()
        opt.zero_grad(set_to_none=True)
        stash.clear()
        host.base.batcher.weights_changed(policy.adapter)
        policy.policy_version += 1
    return {"grad_norm": float(norm), "skipped": float(not (grads and finite)), "lr": step.lr}


def prompt_logprobs(
    policy: PolicyEngine | None, host: Any, ids: list[int], topk: int = 0
) -> tuple[list[float], tuple[np.ndarray, np.ndarray] | None]:
    """Teacher-forced logprob of each prompt token given the ones before it (the first: NaN, Tinker's
    None), through `policy`'s adapter (None: the base with every adapter off); with `topk` also the
    k most likely tokens at each position."""
    from swarm.engine.lora import adapters_off  # lazy: peft helpers, loaded with the host

    with host.lock, torch.inference_mode():
        t = torch.tensor([ids], device=host.base.device)
        if policy is not None:
            policy._live()
            ctx: Any = route(policy.adapter)
        else:
            ctx = adapters_off(host.peft) if host.peft is not None else torch.inference_mode()
        with ctx:
            logits = host.base.network(input_ids=t).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)
        lp = logp.gather(-1, t[0, 1:].unsqueeze(-1)).squeeze(-1)
        values = [math.nan, *lp.tolist()]
        top = None
        if topk > 0:
            v, i = logp.topk(min(topk, logp.shape[-1]), dim=-1)
            ids_np = np.concatenate([np.zeros((1, v.shape[1]), np.int32), i.cpu().numpy().astype(np.int32)])
            lps_np = np.concatenate([np.full((1, v.shape[1]), MASK_LOGPROB, np.float32), v.cpu().numpy()])
            top = (ids_np, lps_np)
    return values, top


__all__ = ["AdamStep", "Datum", "GradStash", "forward_backward", "optim_step", "prompt_logprobs"]
