"""Weight sync of the vllm engine: the full weights against a LoRA adapter, on a >=100M-parameter model.

    python bench/sync_lora.py [--hidden 768 --layers 12 --rank 8 --repeats 5] [--json out.json]

Builds a Qwen2 of random weights locally (the embedded tokenizer's vocabulary; hidden 768,
12 layers, MLP 3072: ~113M parameters, 453 MB in float32; no download), then runs two
`VllmEngine`s on it one after the other, the same vLLM settings but for LoRA: full-parameter
(`WeightPublisher`: write the whole model, validate, drain, in-place reload) and `--lora-rank 8`
(`AdapterPublisher`: write the adapter, validate, load it as a new version, drain, unload the
old). Each times `sync_weights()` (what follows every train step) `--repeats` times after a
warm-up sync, one short generation after each (the new weights serve). Prints the medians of
the total and of its parts, the size of what is written, and the ratio full / adapter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from swarm.config.lora import LoraSettings
from swarm.config.vllm import VllmSettings
from swarm.engine import GenerateRequest, SamplingParams

#: the parts of a sync its metrics time; the rest of `total_s` is writing the file(s), fsync included,
#: and the health check under the lock
PARTS = ("vllm_validate_s", "vllm_reload_s", "vllm_drain_s", "vllm_unload_s")


def build_model(out: Path, hidden: int, layers: int, seed: int = 0) -> tuple[Path, int]:
    """A random-weight Qwen2 of the embedded tokenizer at `out`; its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from swarm.model.build import VOCAB_SIZE, model_config, task_corpus
    from swarm.model.tokenizer import build_tokenizer, save_tokenizer

    tokenizer = build_tokenizer(task_corpus(seed=0, per_task=500), VOCAB_SIZE)
    shape = model_config(tokenizer).to_dict()
    shape.pop("layer_types", None)  # derived from the number of layers
    heads = hidden // 64  # of 64 dimensions, as the tiny model's
    shape.update(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers)
    shape.update(num_attention_heads=heads, num_key_value_heads=heads)
    cfg = Qwen2Config(**shape)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    return out, sum(p.numel() for p in model.parameters())


def _size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [f for f in path.iterdir() if f.suffix == ".safetensors"]
    return sum(f.stat().st_size for f in files) / 2**20


def run(model: Path, work: Path, lora: LoraSettings | None, repeats: int, python: Path | None) -> dict:
    from swarm.engine.vllm.engine import VllmEngine  # lazy: torch and the trainer

    t0 = time.perf_counter()
    engine = VllmEngine(model, work, settings=VllmSettings(python=python, max_model_len=512), lora=lora)
    start_s = time.perf_counter() - t0
    try:
        return {"vllm_start_s": start_s, **time_syncs(engine, repeats)}
    finally:
        asyncio.run(engine.close())


def time_syncs(engine, repeats: int) -> dict:
    """`repeats` timed `sync_weights()` of a running `VllmEngine` after a warm-up one (bench/scale.py
    reuses the engine it measured generation on, so vLLM starts once)."""
    prompt = engine.tokenizer.encode("What is 2+3?", add_special_tokens=False)
    rows: list[dict[str, float]] = []
    for i in range(repeats + 1):  # the first is a warm-up
        engine.trainer.policy_version += 1  # as a train step would
        t = time.perf_counter()
        metrics = engine.sync_weights()
        metrics["total_s"] = time.perf_counter() - t
        metrics["rest_s"] = metrics["total_s"] - sum(metrics.get(k, 0.0) for k in PARTS)
        out = asyncio.run(engine.generate(GenerateRequest(prompt, SamplingParams(max_tokens=4))))
        assert out.policy_version == engine.served_version == engine.policy_version
        if i:
            rows.append(metrics)
    lora = engine.lora if engine.lora.enabled else None
    sent = _size_mb(engine.publisher.good if lora is not None else engine.serving.good)
    med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in ("total_s", "rest_s", *PARTS)}
    return {
        "mode": f"adapter r{lora.rank}" if lora else "full",
        "mb": sent,
        "totals_s": [r["total_s"] for r in rows],
        **med,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vllm-python", type=Path, help="interpreter with vLLM (default: as the engine finds it)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, params = build_model(Path(tmp) / "model", args.hidden, args.layers)
        print(f"model: Qwen2, hidden {args.hidden}, {args.layers} layers, {params / 1e6:.1f}M parameters (float32)")
        rows = [
            run(model, Path(tmp) / "full", None, args.repeats, args.vllm_python),
            run(model, Path(tmp) / "lora", LoraSettings(rank=args.rank), args.repeats, args.vllm_python),
        ]
    table = Table(title=f"one weight sync, median of {args.repeats} (seconds)")
    for col in ("sync", "MB written", "total", "write, rest", "validate", "(re)load", "drain", "unload"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["mode"], f"{r['mb']:.1f}", *(f"{r[k]:.3f}" for k in ("total_s", "rest_s", *PARTS)))
    Console(width=100).print(table)
    ratio = rows[0]["total_s"] / rows[1]["total_s"]
    each = [" ".join(f"{x:.3f}" for x in r["totals_s"]) for r in rows]
    print(f"each sync (s): full {each[0]}; adapter {each[1]}")
    print(f"full / adapter: the adapter sync is {ratio:.1f}x faster")
    if args.json:
        args.json.write_text(json.dumps({"params": params, "rows": rows, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
