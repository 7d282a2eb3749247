"""`TrainConfig`: the knobs of one optimisation step, defined once.

Nested in `ServerConfig` as `train` and live-editable on a running server
(`swarm ctl set`). Every engine reads it (`TrainBatch.config`), so it lives here,
below the engines and the server, rather than in the engine interface.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from swarm.algorithms.choices import Advantage, DistillMode, LossAgg
from swarm.algorithms.schedule import lr_at
from swarm.config.options import Flag


class TrainConfig(BaseModel):
    """Knobs of one optimisation step; live-editable on a running server (`swarm ctl set`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    cli_panel: ClassVar[str] = "training"  # the --help panel of its fields (swarm/config/options.py)

    lr: Annotated[float, Flag(study=(0.0, 1e-2))] = Field(2e-4, ge=0.0, description="learning rate")
    lr_warmup_steps: int = Field(
        0, ge=0, le=1_000_000, description="steps over which the lr rises linearly to lr (0: none)"
    )
    lr_decay_steps: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="steps after the warmup over which the lr falls along a cosine to lr x lr_min_ratio (0: constant)",
    )
    lr_min_ratio: float = Field(0.1, ge=0.0, le=1.0, description="the decayed lr's floor, as a fraction of lr")
    advantage: Advantage = Field(Advantage.grpo, description="group advantage estimator")
    clip_eps: float = Field(0.2, gt=0.0, description="PPO clip epsilon (low side, and high unless clip_eps_high)")
    clip_eps_high: float | None = Field(None, gt=0.0, description="PPO clip epsilon of the high side (DAPO)")
    kl_coef: Annotated[float, Flag(study=(0.0, 10.0))] = Field(
        0.0, ge=0.0, description="KL penalty to the reference (initial) model"
    )
    # not researcher knobs: they mean something only with a --teacher, which a study does not set
    reward_coef: Annotated[float, Flag(studied=False)] = Field(
        1.0,
        ge=0.0,
        description="reward advantage scale (0: distil alone)",
    )
    distill_coef: Annotated[float, Flag(studied=False)] = Field(
        0.0,
        ge=0.0,
        description="weight of the reverse KL to --teacher",
    )
    distill_mode: Annotated[DistillMode, Flag(studied=False)] = Field(
        DistillMode.sampled,
        description="sampled (any teacher) or full: the exact KL (a local teacher)",
    )
    # the teacher's logits divided by it before the softmax: below 1 the student learns a sharper policy than
    # the one the teacher samples at temperature 1 (docs/distillation.md); only a local teacher has logits
    teacher_temperature: Annotated[float, Flag(studied=False)] = Field(
        1.0, gt=0.0, le=10.0, description="the local --teacher's temperature"
    )
    # verl's ppo_epochs, TRL's num_iterations: each pass an optimizer update on the same rollouts, whose
    # logprobs stay the "old" policy, so the clip bounds how far the later passes move (docs/distillation.md)
    ppo_epochs: Annotated[int, Flag(study=(1, 8))] = Field(
        1,
        ge=1,
        le=64,
        description="updates per batch (PPO epochs)",
    )
    entropy_coef: float = Field(0.0, description="entropy bonus coefficient")
    max_grad_norm: float = Field(1.0, gt=0.0, description="gradient-norm clip")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    micro_batch_tokens: Annotated[int, Flag(studied=False)] = Field(
        8192, ge=1, description="tokens per forward/backward micro-batch"
    )
    normalize_std: bool = Field(True, description="GRPO: divide advantages by the group's reward std")
    loss_agg: LossAgg = Field(
        LossAgg.token_mean,
        description="token-mean: every trained token weighs the same; "
        "seq-mean-token-mean: every sample does (task mixes)",
    )

    def at_step(self, step: int) -> TrainConfig:
        """These knobs for the step after `step` trained ones: the lr its schedule gives then."""
        if not (self.lr_warmup_steps or self.lr_decay_steps):
            return self
        lr = lr_at(self.lr, step, self.lr_warmup_steps, self.lr_decay_steps, self.lr_min_ratio)
        return self.model_copy(update={"lr": lr})


__all__ = ["TrainConfig"]
