"""Tinker's built-in losses on per-token tensors (data in, data out; no I/O, no model).

    terms = tinker_loss("ppo", logp, {"advantages": a, "logprobs": old}, {"clip_low_threshold": 0.8})
    terms.loss.backward()                     # a scalar: the SUM over every token of every datum

The formulas are the ones Tinker documents for its `loss_fn` names (a researcher's loop written
against Tinker must mean the same thing here), over flat 1-D tensors of one or many datums
concatenated. `logp` are the policy's logprobs of `target_tokens` (with grad); the inputs are the
datum's `loss_fn_inputs` (`weights`, `advantages`, `logprobs` = the sampler's). Every loss is a
sum, not a mean: Tinker's client scales (weights, advantages) where it wants a mean, and so the
per-token `elementwise` terms add up to `loss` exactly.

    cross_entropy        -(weights * logp)
    importance_sampling  -(ratio * advantages),                 ratio = exp(logp - sampler logprobs)
    ppo                  -min(ratio * A, clip(ratio, lo, hi) * A)   lo/hi: clip_low/high_threshold
    cispo                -(stopgrad(clip(ratio, lo, hi)) * logp * A)
    dro                  -(logp * A - beta / 2 * (logp - sampler logprobs)^2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

#: loss name -> the `loss_fn_inputs` it reads besides `target_tokens`
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}
#: loss name -> the `loss_fn_config` keys it reads, with Tinker's defaults
LOSS_CONFIG: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
}
LOSSES = tuple(LOSS_INPUTS)


class LossInputError(ValueError):
    """Inputs a loss cannot take (unknown name, missing or non-finite input, a bad config):
    `code` is the stable machine-readable reason the server answers with (400)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class LossTerms:
    loss: torch.Tensor  # scalar, with grad through `logp`
    elementwise: torch.Tensor  # per token, detached: sums to `loss`
    metrics: dict[str, float]


def loss_config(name: str, given: Mapping[str, float | str] | None) -> dict[str, float]:
    """The config a loss runs with: its defaults, overridden by `given`; unknown keys refused."""
    if name not in LOSS_CONFIG:
        raise LossInputError("unknown_loss", f"unknown loss_fn {name!r}; built in: {', '.join(LOSSES)}")
    out = dict(LOSS_CONFIG[name])
    for key, value in (given or {}).items():
        if key not in out:
            known = ", ".join(out) or "none"
            raise LossInputError("invalid_loss_config", f"loss {name!r} takes no config key {key!r} (known: {known})")
        if isinstance(value, str) or not math.isfinite(float(value)):
            raise LossInputError("invalid_loss_config", f"loss_fn_config[{key!r}] must be a finite number")
        out[key] = float(value)
    if "clip_low_threshold" in out and not 0 <= out["clip_low_threshold"] <= 1 <= out["clip_high_threshold"]:
        raise LossInputError(
            "invalid_loss_config", "clip thresholds must satisfy 0 <= clip_low_threshold <= 1 <= clip_high_threshold"
        )
    if "beta" in out and out["beta"] < 0:
        raise LossInputError("invalid_loss_config", "beta must be >= 0")
    return out


def check_inputs(name: str, n_tokens: int, inputs: Mapping[str, list[float]]) -> None:
    """Refuse, before any compute, a datum whose inputs do not fit the loss (nothing is applied)."""
    if name not in LOSS_INPUTS:
        raise LossInputError("unknown_loss", f"unknown loss_fn {name!r}; built in: {', '.join(LOSSES)}")
    for key in LOSS_INPUTS[name]:
        if key not in inputs:
            if key == "weights":
                continue  # cross_entropy without weights: every token weighs 1
            raise LossInputError("missing_loss_input", f"loss {name!r} needs loss_fn_inputs[{key!r}]")
    for key, values in inputs.items():
        if len(values) != n_tokens:
            raise LossInputError(
                "length_mismatch",
                f"loss_fn_inputs[{key!r}] has {len(values)} values for {n_tokens} input tokens",
            )
        if not all(math.isfinite(v) for v in values):
            raise LossInputError("non_finite_input", f"loss_fn_inputs[{key!r}] holds NaN or infinite values")


def _ratio(logp: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return (logp - old).clamp(-20.0, 20.0).exp()


def tinker_loss(
    name: str,
    logp: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    config: Mapping[str, float] | None = None,
) -> LossTerms:
    """The loss `name` over flat tokens: `logp` [N] (with grad), `inputs[key]` [N] float tensors."""
    cfg = loss_config(name, config)  # (also validates the name)
    ones = torch.ones_like(logp)
    if name == "cross_entropy":
        per = -(inputs.get("weights", ones) * logp)
    else:
        adv, old = inputs["advantages"], inputs["logprobs"]
        if name == "importance_sampling":
            per = -(_ratio(logp, old) * adv)
        elif name == "ppo":
            ratio = _ratio(logp, old)
            clipped = ratio.clamp(cfg["clip_low_threshold"], cfg["clip_high_threshold"])
            per = -torch.minimum(ratio * adv, clipped * adv)
        elif name == "cispo":
            clipped = _ratio(logp, old).clamp(cfg["clip_low_threshold"], cfg["clip_high_threshold"]).detach()
            per = -(clipped * logp * adv)
        else:  # dro
            per = -(logp * adv - 0.5 * cfg["beta"] * (logp - old) ** 2)
    loss = per.sum()
    return LossTerms(loss=loss, elementwise=per.detach(), metrics={"loss:sum": float(loss.detach())})


__all__ = [
    "LOSSES",
    "LOSS_CONFIG",
    "LOSS_INPUTS",
    "LossInputError",
    "LossTerms",
    "check_inputs",
    "loss_config",
    "tinker_loss",
]
