"""`LoraSettings`: a low-rank adapter (LoRA) over a frozen base, nested in `ServerConfig` as `lora`.

Pure pydantic (no peft, no torch), so a config carries it on a machine without them; the
torch engine reads this one object (swarm/engine/lora.py builds peft's `LoraConfig` from it).
One object per adapter: a later `policies:` list gives each named policy its own.

`rank` 0 (the default) is full fine-tuning, exactly as before this model existed. With
`rank` r > 0 only the adapter trains: the base stays bit-identical, the KL reference is the
base with the adapter switched off, and checkpoints hold the adapter and its optimizer state.

The learning rate: LoRA usually wants about 10x the full-parameter rate (its updates are
confined to r directions per layer, and its B matrix starts at zero, so early steps move the
policy far less than the same lr does in full fine-tuning). That is `lr_scale`, shown in the
help and the README, never applied silently: the adapter's lr is `train.lr x lr_scale`, and
each step's metrics row logs the lr actually used. `swarm ctl set --lr` keeps working (scaled).
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from swarm.config.options import Flag

#: peft's name for "every linear layer but the output head": attention and MLP projections
ALL_LINEAR = "all-linear"


class LoraSettings(BaseModel):
    """A LoRA adapter trained over a frozen base (rank 0: full fine-tuning, no adapter)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cli_panel: ClassVar[str] = "training"  # the --help panel of its fields (swarm/config/options.py)

    rank: Annotated[int, Flag(name="--lora-rank", knob="lora_rank", study=(0, 64))] = Field(
        0,
        ge=0,
        description="LoRA rank r: train a rank-r adapter per target layer over the frozen base "
        "(0: full fine-tuning). Must not exceed any target layer's width",
    )
    alpha: Annotated[float, Flag(name="--lora-alpha", knob="lora_alpha", study=(1.0, 128.0))] = Field(
        16.0, gt=0.0, description="LoRA alpha: the adapter's output is scaled by alpha / rank"
    )
    targets: Annotated[str, Flag(name="--lora-targets", knob="lora_targets")] = Field(
        ALL_LINEAR,
        description="comma-separated module names the adapter wraps (e.g. q_proj,v_proj); "
        "all-linear: every linear layer of attention and MLP (not the LM head)",
    )
    dropout: Annotated[float, Flag(name="--lora-dropout", knob="lora_dropout", study=(0.0, 0.2))] = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="dropout on the adapter's input while training (above 0 the "
        "recomputed logprobs differ from the rollout's: PPO ratio != 1 on-policy)",
    )
    lr_scale: Annotated[float, Flag(name="--lora-lr-scale", knob="lora_lr_scale", study=(1.0, 100.0))] = Field(
        10.0,
        gt=0.0,
        description="with rank > 0 the adapter trains at train.lr x this (LoRA usually wants "
        "~10x the full-parameter lr); each step's metrics log the lr used",
    )

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",") if n.strip()]
        if not names:
            raise ValueError("name at least one module (or all-linear)")
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_.\-]+", n)]
        if bad:
            raise ValueError(f"not a module name: {bad[0]!r}")
        if ALL_LINEAR in names and len(names) > 1:
            raise ValueError("all-linear already names every linear layer; give it alone")
        return ",".join(names)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def target_modules(self) -> str | list[str]:
        """What peft's `LoraConfig(target_modules=...)` takes: `all-linear` or the names."""
        return ALL_LINEAR if self.targets == ALL_LINEAR else self.targets.split(",")


def rank_too_wide(rank: int, layer: str, fan_in: int, fan_out: int) -> str | None:
    """Why a rank-`rank` adapter cannot wrap the `fan_in` x `fan_out` layer `layer`, or None when it can.

    One sentence for both places that check: `swarm train` before it starts a server, from the
    model's config.json (swarm/model/widths.py), and the engine on the loaded model (swarm/engine/lora.py)."""
    width = min(fan_in, fan_out)
    if rank <= width:
        return None
    return (
        f"LoRA rank {rank} is larger than the width of target layer {layer} ({fan_in} in, {fan_out} out): "
        f"a rank-r adapter of that layer can have rank at most {width}; choose a rank <= {width} or fewer "
        "target layers"
    )


__all__ = ["ALL_LINEAR", "LoraSettings", "rank_too_wide"]
