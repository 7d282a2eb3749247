"""`swarm model export RUN_OR_CHECKPOINT --merge OUT`: a LoRA run's policy as a plain Hugging Face model.

    export_merged(Path("runs/lora"), Path("models/lora-merged"))   # the run's last checkpoint

A LoRA checkpoint holds only the adapter; vLLM, `swarm eval`, `transformers` and anything else
that loads a model directory want whole weights. This writes the base with the adapter merged
in (swarm/model/adapter.py: merged in fp32, saved in the base's own dtype), the tokenizer and
chat template, and `roost_export.json` saying where it came from. A full-parameter checkpoint
is written as it is (nothing to merge), so the command works on any run.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from swarm.engine.lora import is_adapter_dir, read_adapter_config
from swarm.engine.precision import DTYPES
from swarm.model.adapter import base_of, load_causal_lm, tokenizer_dir
from swarm.model.evaluate import run_models

EXPORT_FILE = "roost_export.json"


def _base_dtype(base: Path) -> torch.dtype:
    """The dtype the base model's weights are stored in (fp32 when its config names none)."""
    config = json.loads((base / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    return DTYPES.get(str(name), torch.float32)


def export_merged(source: Path, out: Path) -> Path:
    """Write the model of `source` (a checkpoint, or a run folder: its last checkpoint) to `out`, merged.

    Refuses a non-empty `out` (never overwrites a model) with FileExistsError; FileNotFoundError
    when `source` holds no model or the adapter's base is gone.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; name a new directory")
    checkpoint, _ = run_models(Path(source))
    adapter = is_adapter_dir(checkpoint) and not (checkpoint / "config.json").is_file()
    if not adapter and not (checkpoint / "config.json").is_file():
        raise FileNotFoundError(f"{source} is neither a model directory, a checkpoint nor a run folder")
    model = load_causal_lm(checkpoint)
    provenance: dict[str, object] = {"source": str(Path(checkpoint).resolve()), "merged_adapter": adapter}
    if adapter:
        base = base_of(checkpoint)
        model = model.to(_base_dtype(base))
        saved = read_adapter_config(checkpoint)
        provenance.update(
            base_model=str(base),
            lora_rank=saved.get("r"),
            lora_alpha=saved.get("lora_alpha"),
            lora_targets=saved.get("target_modules"),
        )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir(checkpoint)).save_pretrained(out)
    (out / EXPORT_FILE).write_text(json.dumps(provenance, indent=2, default=list))
    return out


__all__ = ["EXPORT_FILE", "export_merged"]
