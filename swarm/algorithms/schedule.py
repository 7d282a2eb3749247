"""The learning rate at a step: linear warmup, then a cosine decay to a floor (pure; no torch).

Why a schedule at all: at a constant lr, Adam's steps keep a floor under how close a policy can
get to its target. That floor is what stalls on-policy distillation short of its teacher
(docs/distillation.md). A short warmup also lets a higher peak lr through Adam's first steps,
whose second-moment estimates are still poor. This is the shape TRL and tinker-cookbook users
know: `warmup` steps rising linearly to `lr`, then `decay` steps falling along a half cosine to
`lr x min_ratio`, which then holds.

The step is the number of steps trained before this one. A resumed run restores that count from
its checkpoint, so the schedule goes on where it was and has no state of its own to save.
"""

from __future__ import annotations

import math


def lr_at(lr: float, step: int, warmup: int = 0, decay: int = 0, min_ratio: float = 0.0) -> float:
    """The lr of the step after `step` trained ones. With `warmup == decay == 0` it is `lr`."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup and step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if not decay:
        return lr
    frac = min(1.0, (step - warmup) / decay)
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * frac)))


__all__ = ["lr_at"]
