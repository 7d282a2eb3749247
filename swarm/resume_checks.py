"""What a resumed run's checkpoint can take: `swarm train --resume` with settings its server would refuse
at load (a line deep in the server's log, and a failed run) is refused before anything starts.

    resume_problems(spec, out)   # ["--lora-rank: the run in R trains every weight (...): resume it without ..."]

Read from the checkpoint's files as the server reads them (swarm/engine/adapter_files.py for adapters,
config.json for a full checkpoint's shape).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarm.config.lora import LoraSettings
from swarm.config.run import RunConfig
from swarm.engine.adapter_files import LoraError, check_saved, is_adapter_dir, read_adapter_config
from swarm.server.checkpoint import Checkpointer

__all__ = ["SHAPE_KEYS", "resume_problems"]


def resume_problems(spec: RunConfig, out: Path) -> list[str]:
    """What the server of a `--resume` would refuse of the checkpoint it loads, found only once it had
    started (a line deep in its log, and the run failed): an adapter where the settings train every weight,
    every weight where they train an adapter, another rank or alpha, a model of another shape. Read from
    the checkpoint's files as the server reads them (the torch and vllm engines; the fake one loads none)."""
    if spec.server.engine not in ("torch", "vllm") or spec.team is not None or spec.attach is not None:
        return []  # a --team run's servers and an attached policy are checked where they start
    folders = {"": out / "server"}
    if spec.roles:
        folders = {f"policy {role}: ": out / "server" / "policies" / role for role in spec.roles}
    found = []
    for prefix, folder in folders.items():
        latest = Checkpointer(folder / "checkpoints").latest()
        if latest is None:
            continue
        if problem := _lora_fit(latest, spec.trained_lora, out):
            found.append(f"--lora-rank: {prefix}{problem}")
        elif problem := _shape_fit(latest, Path(spec.server.model_dir), out):
            found.append(f"--model: {prefix}{problem}")
    return found


def _lora_fit(checkpoint: Path, lora: LoraSettings, out: Path) -> str | None:
    """Whether the settings train what `checkpoint` holds (swarm/engine/adapter_files.py's check)."""
    its = f"its checkpoint {checkpoint.name}"
    if not is_adapter_dir(checkpoint):
        if not lora.enabled:
            return None
        return (
            f"the run in {out} trains every weight ({its} holds no LoRA adapter): resume it without --lora-rank "
            "(or with --lora-rank 0)"
        )
    if lora.enabled:
        try:
            check_saved(checkpoint, lora)
            return None
        except LoraError:
            pass
    saved = read_adapter_config(checkpoint)
    rank, alpha = saved.get("r"), saved.get("lora_alpha")
    asked = f", not rank {lora.rank}, alpha {lora.alpha:g}" if lora.enabled else ""
    return (
        f"the run in {out} trains a LoRA adapter of rank {rank}, alpha {alpha} ({its}){asked}: resume it with "
        f"--lora-rank {rank} --lora-alpha {alpha}"
    )


#: the keys of a model's config.json that shape its weights: a full checkpoint loads only into the same
SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)


def _shape_fit(checkpoint: Path, model: Path, out: Path) -> str | None:
    """Whether a full checkpoint's weights fit `model` (the server refuses them at load: another --model
    than the run's); nothing to say when either config.json is missing or unreadable."""
    saved, given = _model_config(checkpoint), _model_config(model)
    if saved is None or given is None:
        return None
    differ = [f"{k} {saved.get(k)}, the model's {given.get(k)}" for k in SHAPE_KEYS if saved.get(k) != given.get(k)]
    if not differ:
        return None
    return (
        f"{model} is not the model the run in {out} trains (its checkpoint {checkpoint.name}: "
        f"{'; '.join(differ)}): resume it with that run's --model"
    )


def _model_config(folder: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None
