"""One policy trains while another generates, on one base: the step beside generation against a step
that holds the whole model.

    python bench/policy_overlap.py [--hidden 512 --layers 8 --seconds 20 --rounds 2] [--json out.json]
    python bench/policy_overlap.py --device cuda --hidden 896 --layers 24     # on a GPU (bf16)

A `PolicyHost` (swarm/engine/policies.py) with two LoRA policies on one base: a thread trains
policy `a` step after step (16 samples of 96 tokens, 48 trained) while `--concurrency` requests of
policy `b` generate `--max-tokens` tokens each, one after the other, for `--seconds`. Modes,
alternated in one run (`--rounds` windows each, same host): **beside**, the default (the step's
forwards and backward run beside the batcher's, only the optimizer's update holds the lock);
**holding** (`steps_beside_generation = False`: the whole step holds the lock, as before steps
could run beside generation, and as a host with dropout still does); and each side alone (`a`
trains with no generation, `b` generates with no training). Then policies `a` and `c` both train
back to back, their steps one at a time against as many at once as the cores hold (`StepSlots`:
two on two cores with one torch thread each). Prints steps/s, tokens/s, what each keeps of its rate
alone, and what a second slot adds.

The model is a Qwen2 of random weights built here (the embedded tokenizer; hidden 512, 8 layers:
~30M parameters), large enough that the forwards' arithmetic, which torch runs without Python's
lock, outweighs the Python around it; on the 1M-parameter embedded model the Python dominates and
one process stays near one core either way (docs/policies-bench.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sync_lora import build_model  # bench/ is not a package: the script's folder is on the path

from swarm.config.lora import LoraSettings
from swarm.engine import GenerateRequest, SamplingParams, TrainBatch, TrainConfig, TrainSample
from swarm.engine.policies import PolicyEngine, PolicyHost
from swarm.engine.step_slots import StepSlots


def batch(policy: PolicyEngine, n: int = 16, length: int = 96, trained: int = 48) -> TrainBatch:
    samples = []
    for i in range(n):
        ids = [1 + (7 * i + 13 * j) % 250 for j in range(length)]
        lps = [0.0, *policy.logprobs(ids)]
        mask = [0] * (length - trained) + [1] * trained
        samples.append(TrainSample(ids, mask, lps, f"e{i}", f"g{i // 4}", float(i % 2)))
    return TrainBatch(samples, TrainConfig(lr=1e-4))


def window(
    host: PolicyHost, seconds: float, concurrency: int, max_tokens: int, work: TrainBatch | None
) -> dict[str, float]:
    """`a` trains in a thread (unless `work` is None) while `b` generates (unless `concurrency` is 0),
    for `seconds`: a's steps/s and b's tokens/s."""
    a, b = host.policy("a"), host.policy("b")
    stop = threading.Event()
    steps = [0]

    def train() -> None:
        while work is not None and not stop.is_set():
            a.train_step(work)
            steps[0] += 1

    async def generate() -> int:
        end = time.monotonic() + seconds
        tokens = 0
        if not concurrency:
            await asyncio.sleep(seconds)

        async def one_after_another(k: int) -> None:
            nonlocal tokens
            while time.monotonic() < end:
                prompt = [1 + (k * 31 + j) % 250 for j in range(32)]
                out = await b.generate(GenerateRequest(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
                tokens += len(out.token_ids)

        await asyncio.gather(*(one_after_another(k) for k in range(concurrency)))
        return tokens

    trainer = threading.Thread(target=train)
    t0 = time.monotonic()
    trainer.start()
    tokens = asyncio.run(generate())
    stop.set()
    trainer.join()
    dt = time.monotonic() - t0
    return {"steps_per_s": steps[0] / dt, "tokens_per_s": tokens / dt}


def two_steps(host: PolicyHost, seconds: float, works: dict[str, TrainBatch], slots: int) -> dict[str, float]:
    """Policies `a` and `c` train back to back, each in its thread, with `slots` steps at once: steps/s in all."""
    host.slots = StepSlots(slots)
    stop = threading.Event()
    steps = dict.fromkeys(works, 0)

    def train(name: str) -> None:
        while not stop.is_set():
            host.policy(name).train_step(works[name])
            steps[name] += 1

    threads = [threading.Thread(target=train, args=(name,)) for name in works]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    return {"steps_per_s": sum(steps.values()) / dt, **{f"steps_{n}": float(v) for n, v in steps.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2, help="windows per mode, alternated")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: bf16 weights, one step at a time")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, params = build_model(Path(tmp) / "model", args.hidden, args.layers)
        host = PolicyHost(model, seed=0, device=args.device)
        dtype = str(host.base.placement.dtype)
        print(f"model: Qwen2, hidden {args.hidden}, {args.layers} layers, {params / 1e6:.1f}M parameters ({dtype})")
        for name in ("a", "b", "c"):
            host.add(name, LoraSettings(rank=8))
        work = batch(host.policy("a"))
        works = {"a": work, "c": batch(host.policy("c"))}
        slots = host.slots.slots
        window(host, 3.0, args.concurrency, args.max_tokens, work)  # warm-up: allocator, first compiles
        modes = {  # (training's batch, requests in flight)
            "a alone": (work, 0),
            "b alone": (None, args.concurrency),
            "holding": (work, args.concurrency),
            "beside": (work, args.concurrency),
        }
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for r in range(args.rounds):
            for mode, (train, inflight) in modes.items():
                host.steps_beside_generation = mode != "holding"
                runs[mode].append(window(host, args.seconds, inflight, args.max_tokens, train))
                print(f"round {r + 1} {mode}: {runs[mode][-1]}")
            host.steps_beside_generation = True
            for n in sorted({1, slots}):
                runs.setdefault(f"a and c, {n} slot(s)", []).append(two_steps(host, args.seconds, works, n))
                print(f"round {r + 1} a and c, {n} slot(s): {runs[f'a and c, {n} slot(s)'][-1]}")
    keys = ("steps_per_s", "tokens_per_s")
    med = {m: {k: statistics.median(w.get(k, 0.0) for w in ws) for k in keys} for m, ws in runs.items()}
    table = Table(title=f"policy a trains, policy b generates ({args.concurrency} in flight), medians of {args.rounds}")
    for col in ("mode", "a: steps/s", "b: tokens/s"):
        table.add_column(col, justify="right")
    for mode, m in med.items():
        table.add_row(mode, f"{m['steps_per_s']:.3f}", f"{m['tokens_per_s']:.1f}")
    Console().print(table)
    ratio = {
        "steps beside / a alone": med["beside"]["steps_per_s"] / med["a alone"]["steps_per_s"],
        "tokens beside / b alone": med["beside"]["tokens_per_s"] / med["b alone"]["tokens_per_s"],
        "steps holding / a alone": med["holding"]["steps_per_s"] / med["a alone"]["steps_per_s"],
        "tokens holding / b alone": med["holding"]["tokens_per_s"] / med["b alone"]["tokens_per_s"],
    }
    if slots > 1:
        ratio[f"a and c: {slots} slots / 1"] = (
            med[f"a and c, {slots} slot(s)"]["steps_per_s"] / med["a and c, 1 slot(s)"]["steps_per_s"]
        )
    for k, v in ratio.items():
        print(f"{k}: {v:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs, "ratio": ratio}))


if __name__ == "__main__":
    main()
