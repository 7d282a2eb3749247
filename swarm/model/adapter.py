"""A torch engine checkpoint as one Hugging Face model, whether it holds a whole model or a LoRA adapter.

    model = load_causal_lm(Path("runs/x/server/checkpoints/step_000010"))   # merged when an adapter
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(path))

A LoRA checkpoint (swarm/engine/lora.py) holds the adapter, its optimizer state and the
directory of the base it was trained on (`engine_state.json: base_model`, and peft's own
`adapter_config.json: base_model_name_or_path`), never the base itself. To run it the base is
loaded in fp32 (so merging rounds nothing), the adapter is attached with peft and merged into
the weights: one plain model, as fast as the base, equal to base + adapter within float rounding.
`swarm eval` and `swarm model export --merge` (swarm/model/export.py) go through here.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from swarm.engine.lora import is_adapter_dir, quiet_peft, read_adapter_config
from swarm.engine.torch_engine import STATE_FILE


def base_of(checkpoint: Path) -> Path:
    """The base model directory a LoRA checkpoint was trained on; FileNotFoundError when it is gone."""
    checkpoint = Path(checkpoint)
    state = checkpoint / STATE_FILE
    recorded = json.loads(state.read_text()).get("base_model") if state.is_file() else None
    recorded = recorded or read_adapter_config(checkpoint).get("base_model_name_or_path")
    if not recorded:
        raise FileNotFoundError(f"{checkpoint} is a LoRA adapter that records no base model")
    base = Path(recorded)
    if not (base / "config.json").is_file():
        raise FileNotFoundError(
            f"the base model of the LoRA adapter {checkpoint}, {base}, is not a Hugging Face "
            "model directory (moved or deleted?)"
        )
    return base


def merged_model(checkpoint: Path) -> PreTrainedModel:
    """Base (fp32) + the checkpoint's adapter, merged into plain weights (no peft left in the model)."""
    from peft import PeftModel  # lazy: peft (and accelerate) take seconds; only an adapter needs them

    base = AutoModelForCausalLM.from_pretrained(base_of(checkpoint), dtype=torch.float32)
    with quiet_peft():
        return PeftModel.from_pretrained(base, str(checkpoint)).merge_and_unload()


def load_causal_lm(path: Path) -> PreTrainedModel:
    """A model directory or checkpoint as a Hugging Face causal LM (an adapter merged into its base)."""
    path = Path(path)
    if is_adapter_dir(path) and not (path / "config.json").is_file():
        return merged_model(path)
    return AutoModelForCausalLM.from_pretrained(path)


def tokenizer_dir(path: Path) -> Path:
    """Where the tokenizer of `path` is: the checkpoint itself (the engine saves it there), else its base."""
    path = Path(path)
    if (path / "tokenizer_config.json").is_file() or not is_adapter_dir(path):
        return path
    return base_of(path)


__all__ = ["base_of", "load_causal_lm", "merged_model", "tokenizer_dir"]
