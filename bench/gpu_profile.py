"""Where one decode step's time goes on a GPU: the host, the launches or the kernels.

    python bench/gpu_profile.py --out runs/gpu_profile          # the qwen2.5-0.5b preset, 24 layers
    python bench/gpu_profile.py --device cpu --layers 1         # the same wiring on a CPU

Why: `bench/gpu_acceptance.py` shows how fast the engine decodes. This script shows why. It
writes these to `--out`:

* `profile.json`:
  * the host's speed: a Python loop, and one empty kernel launched from Python;
  * the eager floor: a bare Hugging Face forward of one token with a KV cache, in ms per token,
    at batch 1 and 32;
  * the engine at concurrency 1.
* `hf_profile.txt`: a torch.profiler table of ten eager decode steps.
* `engine_profile.txt`: a torch.profiler table of the engine's 32 decode steps.

Compare the tables' CUDA time with the wall time. docs/gpu.md has a run's figures and what
they mean.
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
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_engine import build_model, generation  # noqa: E402  (bench/ is not a package)
from train_step import _sync  # noqa: E402


def host_speed(device: str) -> dict:
    """A pure-Python loop and one tiny launched op: what every layer's Python and kernels pay."""
    t0 = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i
    loop = time.perf_counter() - t0
    x = torch.zeros(1, device=device)
    _sync(torch.device(device))
    t0 = time.perf_counter()
    for _ in range(2000):
        x.add_(1)
    _sync(torch.device(device))
    return {"py_loop_3M_s": round(loop, 3), "launch_us": round((time.perf_counter() - t0) / 2000 * 1e6, 1)}


def eager_floor(model: torch.nn.Module, device: str, out: Path) -> dict:
    """ms per token of a bare cached forward, then a profiler table of ten such steps."""
    from transformers import DynamicCache

    ids = torch.arange(3, 67, device=device)[None]
    res = {}
    for batch in (1, 32):
        o = model(input_ids=ids.expand(batch, -1), past_key_values=DynamicCache(), use_cache=True)
        tok = o.logits[:, -1:].argmax(-1)
        for i in range(55):
            if i == 5:  # five warm-up steps
                _sync(torch.device(device))
                t0 = time.perf_counter()
            o = model(input_ids=tok, past_key_values=o.past_key_values, use_cache=True)
            tok = o.logits[:, -1:].argmax(-1)
        _sync(torch.device(device))
        res[f"hf_forward_ms_bs{batch}"] = round((time.perf_counter() - t0) / 50 * 1e3, 2)
    o = model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
    tok = o.logits[:, -1:].argmax(-1)
    with profile(activities=_activities(device)) as prof:
        for _ in range(10):
            o = model(input_ids=tok, past_key_values=o.past_key_values, use_cache=True)
            tok = o.logits[:, -1:].argmax(-1)
        _sync(torch.device(device))
    (out / "hf_profile.txt").write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_profile"))
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(2)
    from transformers import AutoModelForCausalLM

    from swarm.engine.torch_engine import TorchEngine

    args.out.mkdir(parents=True, exist_ok=True)
    res = host_speed(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, args.layers, args.device)
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
        with torch.no_grad():
            res |= eager_floor(model.to(args.device).eval(), args.device, args.out)
        del model
        engine = TorchEngine(model_dir, device=args.device, max_batch=64)
        asyncio.run(generation(engine, 1, 1, 8, 64))  # warm-up
        with profile(activities=_activities(args.device)) as prof:
            res["engine_c1"] = asyncio.run(generation(engine, 1, 1, 32, 64))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        (args.out / "engine_profile.txt").write_text(table)
        engine.batcher.close()
    (args.out / "profile.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res))


def _activities(device: str) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])


if __name__ == "__main__":
    main()
