"""The widths of a decoder's projection layers, read from its config.json alone (no torch).

Why: a LoRA rank wider than a target layer is refused by the engine once the server has loaded
the model, so `swarm train --lora-rank 4096` started a server, waited for it and failed a run
before it said so. The usual decoders (Llama, Qwen2/3, Mistral) name their projections the same
way and derive their shapes from a handful of config fields, so the same refusal can be given
before anything starts. Anything else (another architecture, a target this table does not know)
answers None: the engine's own check (swarm/engine/lora.py, by peft's matching) stays the
authority, and this one only ever refuses what it would refuse too.
"""

from __future__ import annotations

import json
from pathlib import Path

from swarm.config.lora import ALL_LINEAR, LoraSettings, rank_too_wide
from swarm.config.server import ServerConfig

#: model types whose attention and MLP projections are q/k/v/o and gate/up/down, shaped as below
DECODERS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def projection_widths(config: dict) -> dict[str, tuple[int, int]] | None:
    """(in, out) of each projection of one decoder layer, or None for an architecture not known here."""
    if config.get("model_type") not in DECODERS:
        return None
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        mlp = int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, mlp),
        "up_proj": (hidden, mlp),
        "down_proj": (mlp, hidden),
    }


def rank_problem(model_dir: Path, settings: LoraSettings) -> str | None:
    """Why `settings.rank` cannot train on the model in `model_dir`, or None (fits, or not known here)."""
    if not settings.enabled:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    widths = projection_widths(config) if isinstance(config, dict) else None
    if widths is None:
        return None
    names = list(widths) if settings.targets == ALL_LINEAR else [t.strip() for t in settings.targets.split(",")]
    if not names or any(n not in widths for n in names):
        return None  # a target not in the table (a regex, another layer): the engine matches it
    name = min(names, key=lambda n: min(widths[n]))
    return rank_too_wide(settings.rank, name, *widths[name])


def lora_problems(server: ServerConfig) -> list[str]:
    """A LoRA rank wider than a target layer, from the model's config.json (the engine would refuse it
    only once a server had started, `swarm serve` after writing its config.yaml); one line per policy."""
    if server.policies:
        ranked = [(f"policy {p.name}: ", server.for_policy(p).lora) for p in server.policies]
    else:
        ranked = [("", server.lora)]
    return [
        f"--lora-rank: {prefix}{problem}"
        for prefix, lora in ranked
        if (problem := rank_problem(Path(server.model_dir), lora))
    ]


__all__ = ["DECODERS", "lora_problems", "projection_widths", "rank_problem"]
