"""One policy-gradient update of a causal LM on `TrainSample`s (torch).

Reads top to bottom: episode advantages from group rewards -> right-padded
micro-batches under a token budget -> recompute logprobs -> PPO-clip loss
(+ optional KL to a frozen reference, entropy bonus) -> accumulate -> clip ->
AdamW. The math lives in `swarm.algorithms`; this module only shapes tensors.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from swarm.algorithms import (
    compute_advantages, entropy_from_logits, kl_k3, loss_scales, ppo_clip_loss, token_logprobs,
)
from swarm.engine.base import TrainConfig, TrainSample


def sample_advantages(samples: Sequence[TrainSample], config: TrainConfig) -> list[float]:
    """One advantage per sample: its episode's group-relative advantage."""
    episodes: dict[str, tuple[float, str]] = {}
    for s in samples:
        key = f"{s.episode_id}\x00{s.reward}"  # team agents scored apart count apart
        episodes.setdefault(key, (s.reward, s.group_id))
    keys = list(episodes)
    adv = compute_advantages([episodes[k][0] for k in keys], [episodes[k][1] for k in keys],
                             config.advantage, config.normalize_std)
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
    for i in order:
        if cur and (len(cur) + 1) * max(lengths[i], max(lengths[j] for j in cur)) > budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def _tensors(samples: Sequence[TrainSample], idx: list[int], adv: list[float], scales: list[float],
             device: torch.device):
    width = max(len(samples[i].input_ids) for i in idx)
    n = len(idx)
    ids = torch.zeros(n, width, dtype=torch.long)
    attn = torch.zeros(n, width, dtype=torch.long)
    w = torch.zeros(n, width)
    old = torch.zeros(n, width)
    a = torch.zeros(n, width)
    for r, i in enumerate(idx):
        s = samples[i]
        L = len(s.input_ids)
        ids[r, :L] = torch.tensor(s.input_ids)
        attn[r, :L] = 1
        w[r, :L] = torch.tensor(s.loss_mask, dtype=torch.float32) * (s.weight * scales[i])
        old[r, :L] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        a[r, :L] = adv[i]
    # position t predicts token t+1: shift targets and per-token data left by one
    to = lambda t: t.to(device)  # noqa: E731
    return to(ids), to(attn), to(w[:, 1:]), to(old[:, 1:]), to(a[:, 1:])


def policy_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[TrainSample],
    config: TrainConfig,
    reference: torch.nn.Module | None = None,
) -> dict[str, float]:
    if not samples:
        raise ValueError("empty batch")
    for s in samples:
        if not (len(s.input_ids) == len(s.loss_mask) == len(s.rollout_logprobs)):
            raise ValueError(f"sample of episode {s.episode_id}: ids, mask and logprobs differ in length")
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    for group in optimizer.param_groups:  # live-editable knobs take effect here
        group["lr"] = config.lr
        group["weight_decay"] = config.weight_decay
    adv = sample_advantages(samples, config)
    scales, denom = loss_scales([s.loss_mask[1:] for s in samples], [s.weight for s in samples], config.loss_agg)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "pg_loss": 0.0, "clipfrac": 0.0, "kl": 0.0, "kl_ref": 0.0, "entropy": 0.0}
    tokens = 0
    for idx in micro_batches([len(s.input_ids) for s in samples], config.micro_batch_tokens):
        ids, attn, w, old, a = _tensors(samples, idx, adv, scales, device)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        logp = token_logprobs(logits, ids[:, 1:])
        terms = ppo_clip_loss(logp, old, a, w, denom, config.clip_eps, config.clip_eps_high)
        loss = terms.loss
        ent = (entropy_from_logits(logits) * w).sum() / denom
        if config.entropy_coef:
            loss = loss - config.entropy_coef * ent
        if reference is not None and config.kl_coef:
            with torch.no_grad():
                ref_logp = token_logprobs(reference(input_ids=ids, attention_mask=attn).logits[:, :-1], ids[:, 1:])
            kl_ref = (kl_k3(logp, ref_logp) * w).sum() / denom
            loss = loss + config.kl_coef * kl_ref
            totals["kl_ref"] += float(kl_ref.detach())
        loss.backward()
        totals["loss"] += float(loss.detach())
        totals["pg_loss"] += float(terms.pg_loss)
        totals["clipfrac"] += float(terms.clipfrac)
        totals["kl"] += float(terms.approx_kl)
        totals["entropy"] += float(ent.detach())
        tokens += int(attn.sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    dt = time.perf_counter() - t0
    return {
        **totals,
        "grad_norm": float(grad_norm),
        "skipped": float(not torch.isfinite(grad_norm)),
        "samples": float(len(samples)),
        "tokens": float(tokens),
        "trained_tokens": float(sum(sum(s.loss_mask) for s in samples)),
        "tokens_per_s": tokens / dt if dt > 0 else 0.0,
        "step_s": dt,
        "adv_mean": sum(adv) / len(adv),
        "adv_abs_mean": sum(abs(x) for x in adv) / len(adv),
        "lr": config.lr,
    }
