"""One policy-gradient update of a causal LM on `TrainSample`s (torch).

Reads top to bottom: episode advantages from group rewards -> right-padded
micro-batches under a token budget -> recompute logprobs -> PPO-clip loss
(+ optional KL to a frozen reference, entropy bonus) -> accumulate -> clip ->
AdamW. The math lives in `swarm.algorithms`; this module only shapes tensors.

What keeps it at the speed of a bare forward/backward/AdamW step (measured by
`bench/train_step.py`, written up in docs/training-speed.md):

* the LM head and the log-softmax run only on trained positions (the policy's
  tokens), not on every prompt and padding position: for a chat prompt with a
  short answer that is most of them, and for a 150k vocabulary most of the memory;
* one log-softmax per micro-batch feeds the logprobs and the entropy; the entropy
  is only a metric (no graph) unless `entropy_coef` is set;
* the reference model runs only when `kl_coef` is set;
* metrics stay on the device until the end of the step: one host sync, not
  several per micro-batch;
* tensors are built from flat lists in one copy per field, not one per sample;
* a prompt shared by several samples (a GRPO group's) runs once per micro-batch, its KV
  cache indexed out to the samples (swarm/engine/shared_prefix.py), when that saves at
  least a quarter of the positions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F

from swarm.algorithms import compute_advantages, kl_k3, loss_scales, ppo_clip_loss
from swarm.algorithms.distill import full_reverse_kl
from swarm.engine.base import TrainConfig, TrainSample
from swarm.engine.lora import adapters_off, unwrap
from swarm.engine.precision import grads_to_clip
from swarm.engine.shared_prefix import SharedPrefixBatch, plan, shared_hidden, usable

#: Model types whose logits are exactly `lm_head(final hidden state)` (no soft-capping,
#: no logit scale): for these the head runs on trained positions only.
PLAIN_HEAD_MODELS = frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral", "mixtral"})

METRICS = ("loss", "pg_loss", "clipfrac", "kl", "kl_ref", "entropy")


def sample_advantages(samples: Sequence[TrainSample], config: TrainConfig) -> list[float]:
    """One advantage per sample: its episode's group-relative advantage."""
    episodes: dict[str, tuple[float, str]] = {}
    for s in samples:
        key = f"{s.episode_id}\x00{s.reward}"  # team agents scored apart count apart
        episodes.setdefault(key, (s.reward, s.group_id))
    keys = list(episodes)
    adv = compute_advantages(
        [episodes[k][0] for k in keys], [episodes[k][1] for k in keys], config.advantage, config.normalize_std
    )
    by_key = dict(zip(keys, adv))
    return [by_key[f"{s.episode_id}\x00{s.reward}"] for s in samples]


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Group sample indices so that (rows x longest row) stays within `budget` tokens.

    Sorting by length keeps padding low; a single sample longer than the budget
    still gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:  # ascending: the newest index is the longest of the batch
        if cur and (len(cur) + 1) * lengths[i] > budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


class MicroBatch:
    """Padded ids and, at the trained positions only, targets and per-token data.

    `pos` indexes the flattened [rows, width-1] grid of "position t predicts token
    t+1": exactly the positions whose target the loss trains (mask 1).
    """

    def __init__(
        self,
        samples: Sequence[TrainSample],
        idx: list[int],
        adv: list[float],
        scales: list[float],
        device: torch.device,
        token_adv: Sequence[Sequence[float]] | None = None,
    ) -> None:
        lengths = [len(samples[i].input_ids) for i in idx]
        width = max(lengths)
        n = len(idx)
        flat_ids: list[int] = []
        flat_mask: list[int] = []
        flat_old: list[float] = []
        flat_extra: list[float] = []
        row_w: list[float] = []
        row_adv: list[float] = []
        for i, length in zip(idx, lengths):
            s = samples[i]
            pad = width - length
            flat_ids += s.input_ids
            flat_ids += [0] * pad
            flat_mask += s.loss_mask[1:]
            flat_mask += [0] * pad
            flat_old += s.rollout_logprobs[1:]
            flat_old += [0.0] * pad
            if token_adv is not None:
                flat_extra += token_adv[i][1:]
                flat_extra += [0.0] * pad
            row_w.append(s.weight * scales[i])
            row_adv.append(adv[i])
        ids = torch.tensor(flat_ids, dtype=torch.long).view(n, width)
        lens = torch.tensor(lengths)
        self.attn = (torch.arange(width).unsqueeze(0) < lens.unsqueeze(1)).long()
        mask = torch.tensor(flat_mask, dtype=torch.bool)
        pos = mask.nonzero().squeeze(-1)
        rows = pos // (width - 1) if width > 1 else pos
        self.tokens = int(sum(lengths))
        self.ids = ids.to(device, non_blocking=True)
        self.attn = self.attn.to(device, non_blocking=True)
        self.pos = pos.to(device, non_blocking=True)
        self.targets = ids[:, 1:].reshape(-1)[pos].to(device, non_blocking=True)
        self.old = torch.tensor(flat_old, dtype=torch.float32)[pos].to(device, non_blocking=True)
        self.adv = torch.tensor(row_adv, dtype=torch.float32)[rows].to(device, non_blocking=True)
        if token_adv is not None:  # per-token advantage terms (distillation) on top of the episode's
            self.adv += torch.tensor(flat_extra, dtype=torch.float32)[pos].to(device, non_blocking=True)
        self.w = torch.tensor(row_w, dtype=torch.float32)[rows].to(device, non_blocking=True)


def _head_and_base(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(LM head, base model) when the logits are exactly `head(base(...))`, else None.
    Through a peft (LoRA) wrapper: the HF model inside, whose layers carry the adapter."""
    model = unwrap(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, "base_model", None)
    if (
        head is not None
        and base is not None
        and base is not model
        and getattr(model.config, "model_type", None) in PLAIN_HEAD_MODELS
    ):
        return head, base
    return None


def trained_logits(model: torch.nn.Module, mb: MicroBatch | SharedPrefixBatch) -> torch.Tensor:
    """Logits [N, V] at the trained positions only (N = trained tokens of the micro-batch)."""
    parts = _head_and_base(model)
    if isinstance(mb, SharedPrefixBatch):
        assert parts is not None, "shared-prefix batches are planned only for plain-head models"
        return parts[0](shared_hidden(parts[1], mb))
    if parts is not None:
        head, base = parts
        hidden = base(input_ids=mb.ids, attention_mask=mb.attn, use_cache=False).last_hidden_state[:, :-1]
        return head(hidden.reshape(-1, hidden.shape[-1])[mb.pos])
    logits = model(input_ids=mb.ids, attention_mask=mb.attn, use_cache=False).logits[:, :-1]
    return logits.reshape(-1, logits.shape[-1])[mb.pos]


def policy_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[TrainSample],
    config: TrainConfig,
    reference: torch.nn.Module | None = None,
    share_prefix: bool = True,
    token_advantages: Sequence[Sequence[float]] | None = None,
    teacher: torch.nn.Module | None = None,
    update: AbstractContextManager[Any] | None = None,
    switch_mode: bool = True,
) -> dict[str, float]:
    """One optimisation step; returns its metrics. `optimizer` may be a `MasterWeightAdamW`.
    `share_prefix=False` always takes the plain forward (benchmarks and tests compare).

    `token_advantages` (one list per sample, aligned with its `input_ids`, like its rollout
    logprobs) are added to each trained token's advantage: on-policy distillation's per-token
    term (swarm/algorithms/distill.py). The episode's group advantage is scaled by
    `config.reward_coef` first, so `reward_coef=0` trains on those terms alone.

    `teacher` (a frozen local model, `--distill-mode full`) adds `config.distill_coef` times the
    exact reverse KL to it at every trained position to the loss.

    For a step that runs beside generation on the same model (several policies on one base,
    swarm/engine/policies.py): `update` is entered around the weight update alone (the optimizer's
    step, whether it steps or skips), where the caller keeps forwards out; `switch_mode=False`
    leaves the model in eval mode throughout, which the caller may ask only when every dropout of
    the model is 0 (then train and eval mode compute the same), since the mode is the whole
    model's and a forward of another thread would see it."""
    if not samples:
        raise ValueError("empty batch")
    for s in samples:
        if not (len(s.input_ids) == len(s.loss_mask) == len(s.rollout_logprobs)):
            raise ValueError(f"sample of episode {s.episode_id}: ids, mask and logprobs differ in length")
    if token_advantages is not None and [len(a) for a in token_advantages] != [len(s.input_ids) for s in samples]:
        raise ValueError("token advantages do not align with the samples' ids")
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    for group in optimizer.param_groups:  # live-editable knobs take effect here
        group["lr"] = config.lr
        group["weight_decay"] = config.weight_decay
    adv = [a * config.reward_coef for a in sample_advantages(samples, config)]
    scales, denom = loss_scales([s.loss_mask[1:] for s in samples], [s.weight for s in samples], config.loss_agg)
    if switch_mode:
        model.train()
    optimizer.zero_grad(set_to_none=True)
    totals = torch.zeros(len(METRICS), device=device)
    norms = torch.zeros(config.ppo_epochs, device=device)
    distill = teacher is not None and bool(config.distill_coef)
    shared = (
        plan(samples, config.micro_batch_tokens)
        if share_prefix
        and _head_and_base(model) is not None
        and usable(model)
        and (not distill or _head_and_base(teacher) is not None)
        else None
    )
    distill_kl = torch.zeros((), device=device)  # summed over trained tokens, in the first pass
    parts = shared or micro_batches([len(s.input_ids) for s in samples], config.micro_batch_tokens)
    mbs = [
        SharedPrefixBatch(samples, part, adv, scales, device, token_advantages)
        if shared is not None
        else MicroBatch(samples, part, adv, scales, device, token_advantages)
        for part in parts
    ]
    tokens = sum(mb.tokens for mb in mbs)
    trained = sum(int(mb.pos.numel()) for mb in mbs)
    skipped = 0
    # `ppo_epochs` passes over the same batch, an optimizer update after each (PPO's epochs): the
    # rollout logprobs stay the "old" policy, so the clip bounds how far the later passes move
    for epoch in range(config.ppo_epochs):
        norms[epoch], finite = _one_pass(
            model, optimizer, mbs, config, denom, totals, reference, teacher if distill else None,
            distill_kl if epoch == 0 else None, update,
        )  # fmt: skip
        skipped += not finite
    if switch_mode:
        model.eval()
    values = torch.cat([totals / config.ppo_epochs, norms.mean().reshape(1)]).tolist()
    dt = time.perf_counter() - t0
    return {
        **dict(zip(METRICS, values[:-1])),
        "grad_norm": values[-1],
        "skipped": float(skipped),
        "samples": float(len(samples)),
        "tokens": float(tokens),
        "trained_tokens": float(trained),
        "tokens_per_s": config.ppo_epochs * tokens / dt if dt > 0 else 0.0,
        "shared_prefix": float(shared is not None),
        "step_s": dt,
        "adv_mean": sum(adv) / len(adv),
        "adv_abs_mean": sum(abs(x) for x in adv) / len(adv),
        "lr": config.lr,
        **({"distill_kl": float(distill_kl) / max(trained, 1), "distill_tokens": float(trained)} if distill else {}),
    }


def _one_pass(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mbs: Sequence[MicroBatch | SharedPrefixBatch],
    config: TrainConfig,
    denom: float,
    totals: torch.Tensor,
    reference: torch.nn.Module | None,
    teacher: torch.nn.Module | None,
    distill_kl: torch.Tensor | None,
    update: AbstractContextManager[Any] | None,
) -> tuple[torch.Tensor, bool]:
    """Forward and backward over every micro-batch, then one clipped optimizer update; adds the
    metrics to `totals` (and the exact distillation KL to `distill_kl` when given). Returns the
    gradient norm and whether it was finite (a non-finite one skips the update)."""
    device = totals.device
    for mb in mbs:
        if mb.pos.numel() == 0:
            continue  # nothing trained in these samples (all-prompt): no gradient to take
        logp_all = F.log_softmax(trained_logits(model, mb).float(), dim=-1)
        logp = logp_all.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
        terms = ppo_clip_loss(logp, mb.old, mb.adv, mb.w, denom, config.clip_eps, config.clip_eps_high)
        loss = terms.loss
        with torch.set_grad_enabled(bool(config.entropy_coef)):
            ent = -(logp_all.exp() * logp_all).sum(-1).mul(mb.w).sum() / denom
        if config.entropy_coef:
            loss = loss - config.entropy_coef * ent
        kl_ref = torch.zeros((), device=device)
        if reference is not None and config.kl_coef:
            with torch.no_grad(), adapters_off(reference):  # a LoRA model's reference: its base, adapters off
                ref_logp = F.log_softmax(trained_logits(reference, mb).float(), -1)
                ref_logp = ref_logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
            kl_ref = (kl_k3(logp, ref_logp) * mb.w).sum() / denom
            loss = loss + config.kl_coef * kl_ref
        if teacher is not None:
            with torch.no_grad():
                teacher_logits = trained_logits(teacher, mb).float()
                if config.teacher_temperature != 1.0:  # a positions x vocabulary division, only when asked for
                    teacher_logits = teacher_logits / config.teacher_temperature
                teacher_logp = F.log_softmax(teacher_logits, -1)
            kl_pos = full_reverse_kl(logp_all, teacher_logp)
            loss = loss + config.distill_coef * (kl_pos * mb.w).sum() / denom
            if distill_kl is not None:
                distill_kl += kl_pos.detach().sum()
        loss.backward()
        totals += torch.stack(
            [loss.detach(), terms.pg_loss, terms.clipfrac, terms.approx_kl, kl_ref.detach(), ent.detach()]
        )
    params = grads_to_clip(model, optimizer)
    grad_norm = (
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm) if params else torch.zeros((), device=device)
    )
    finite = bool(torch.isfinite(grad_norm))  # the update's one host sync
    with update if update is not None else contextlib.nullcontext():
        if finite:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach().float(), finite
