"""What a saved LoRA adapter's files say, read without torch or peft.

A checkpoint of a LoRA policy is a peft adapter folder (`adapter_config.json` beside the weights). The
server checks one against the settings a policy is added with before it builds anything for it, and a
fake-engine server must not import torch to do so; the modelling side (attach, save, load) is
swarm/engine/lora.py, which takes these from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarm.config.lora import LoraSettings

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraError(ValueError):
    """An adapter that cannot be built or loaded as asked; the message says why and what to change."""


def is_adapter_dir(path: Path) -> bool:
    """A directory holding a peft adapter (a LoRA checkpoint), not a whole model."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def read_adapter_config(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())


def check_saved(path: Path, settings: LoraSettings) -> None:
    """`LoraError` unless the checkpoint at `path` holds an adapter of `settings`' rank and alpha: read
    from its config alone, so a policy can be checked before anything is built for it."""
    path = Path(path)
    if not is_adapter_dir(path):
        raise LoraError(
            f"checkpoint {path} holds no LoRA adapter ({ADAPTER_CONFIG} missing): a full-parameter "
            "checkpoint resumes without --lora-rank"
        )
    saved = read_adapter_config(path)
    if int(saved.get("r", -1)) != settings.rank or float(saved.get("lora_alpha", -1)) != settings.alpha:
        raise LoraError(
            f"checkpoint {path} holds a rank-{saved.get('r')} adapter with alpha "
            f"{saved.get('lora_alpha')}; this engine was started with --lora-rank {settings.rank} "
            f"--lora-alpha {settings.alpha:g}"
        )


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "LoraError", "check_saved", "is_adapter_dir", "read_adapter_config"]
