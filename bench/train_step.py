"""`engine.train_step` against a raw torch step on the same tensors, side by side.

    python bench/train_step.py                       # untrained tiny model built on the fly
    python bench/train_step.py --model DIR --device cuda --steps 10 --json out.json

The raw step is the floor any trainer pays: the same micro-batches (the engine's
own `micro_batches` over the same lengths, padded tensors built once, outside the
timer), one forward, a token log-softmax, a REINFORCE loss, backward, grad-norm
clip, AdamW. The engine's step does everything a swarm server asks of it on top
(advantages from rewards, tensors from `TrainSample`s, PPO ratio and clip,
metrics). The two alternate step by step on two copies of the same weights in
one process, so a noisy machine slows both alike; the ratio is of medians.

Workloads (`--workload`): `arith` is a step of `swarm train --task arith` (16
groups of 8 samples, each group one ~20-token prompt, 2-4 token answers); `long`
is 8 groups of 4 samples of a 64-token prompt + 64-192 generated tokens, where the
forward/backward dominates. A third column runs the engine's step with its
shared-prefix forward off (`engine.share_prefix`), so the table shows what
computing each group's prompt once is worth next to the plain forward.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from swarm.engine.base import TrainBatch, TrainConfig
from swarm.engine.policy_step import micro_batches
from swarm.engine.torch_engine import TorchEngine
from swarm.samples import TrainSample


def make_samples(engine: TorchEngine, workload: str, seed: int = 0) -> list[TrainSample]:
    """Samples shaped like a real step's, with the tokenizer's own chat prompts."""
    rng = random.Random(seed)
    vocab = int(engine.model.get_input_embeddings().weight.shape[0])
    samples = []
    n, group = (128, 8) if workload == "arith" else (32, 4)
    for i in range(n):
        if i % group == 0:  # a GRPO group: one prompt, `group` completions
            text = engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": f"What is {rng.randint(10, 99)}+{rng.randint(1, 9)}?"}],
                add_generation_prompt=True,
                tokenize=False,
            )
            prompt = engine.tokenizer.encode(text, add_special_tokens=False)
            if workload == "long":
                prompt = (prompt * 8)[:64]
        gen = rng.randint(2, 4) if workload == "arith" else rng.randint(64, 192)
        completion = [rng.randrange(vocab) for _ in range(gen)]
        ids = prompt + completion
        samples.append(
            TrainSample(
                input_ids=ids,
                loss_mask=[0] * len(prompt) + [1] * gen,
                rollout_logprobs=[0.0] * len(prompt) + [-rng.uniform(0.1, 3.0) for _ in range(gen)],
                episode_id=f"e{i}",
                group_id=f"g{i // group}",
                reward=float(rng.random() < 0.4),
            )
        )
    return samples


class RawStep:
    """The floor: precomputed padded micro-batches, forward, log-softmax, REINFORCE, backward, AdamW."""

    def __init__(self, model: torch.nn.Module, samples: list[TrainSample], config: TrainConfig) -> None:
        self.model = model
        self.config = config
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.99), eps=1e-8)
        device = next(model.parameters()).device
        denom = float(sum(sum(s.loss_mask[1:]) for s in samples))
        self.batches = []
        for idx in micro_batches([len(s.input_ids) for s in samples], config.micro_batch_tokens):
            width = max(len(samples[i].input_ids) for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            attn = torch.zeros(len(idx), width, dtype=torch.long)
            w = torch.zeros(len(idx), width)
            for r, i in enumerate(idx):
                s = samples[i]
                ids[r, : len(s.input_ids)] = torch.tensor(s.input_ids)
                attn[r, : len(s.input_ids)] = 1
                w[r, : len(s.input_ids)] = torch.tensor(s.loss_mask, dtype=torch.float32) * (s.reward - 0.4) / denom
            self.batches.append((ids.to(device), attn.to(device), w[:, 1:].to(device)))
        self.tokens = sum(len(s.input_ids) for s in samples)

    def __call__(self) -> None:
        self.model.train()
        for ids, attn, w in self.batches:
            logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            logp = F.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            (-(logp * w).sum()).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench(
    engine: TorchEngine, workload: str, steps: int, config: TrainConfig, samples: list[TrainSample] | None = None
) -> dict:
    """`samples`: a subset of the workload's (bench/scale.py: a few for a 0.5B model on a CPU)."""
    samples = make_samples(engine, workload) if samples is None else samples
    default_share = engine.share_prefix
    raw = RawStep(copy.deepcopy(engine.model), samples, config)
    batch = TrainBatch(samples, config)
    engine.train_step(batch)  # warm-up: allocator, kernels, optimizer state
    raw()

    def engine_step(share: bool) -> None:
        engine.share_prefix = share
        engine.train_step(batch)

    t_engine, t_plain, t_raw = [], [], []
    for _ in range(steps):
        for fn, out in ((lambda: engine_step(True), t_engine), (lambda: engine_step(False), t_plain), (raw, t_raw)):
            _sync(engine.device)
            t0 = time.perf_counter()
            fn()
            _sync(engine.device)
            out.append(time.perf_counter() - t0)
    engine.share_prefix = default_share
    e, p, r = statistics.median(t_engine), statistics.median(t_plain), statistics.median(t_raw)
    return {
        "workload": workload,
        "samples": len(samples),
        "tokens": raw.tokens,
        "micro_batches": len(raw.batches),
        "engine_tokens_per_s": round(raw.tokens / e, 1),
        "plain_tokens_per_s": round(raw.tokens / p, 1),
        "raw_tokens_per_s": round(raw.tokens / r, 1),
        "engine_step_s": round(e, 5),
        "plain_step_s": round(p, 5),
        "raw_step_s": round(r, 5),
        "ratio": round(r / e, 3),
        "plain_ratio": round(r / p, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="HF model dir (default: a freshly built untrained tiny model)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--workload", choices=("arith", "long", "both"), default="both")
    ap.add_argument("--steps", type=int, default=15, help="timed steps of each, alternating")
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads for both steps (0: the engine's choice, half the cores)",
    )
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    config = TrainConfig(lr=1e-5, kl_coef=args.kl_coef)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from swarm.model.build import build_untrained

            model = build_untrained(Path(tmp) / "model")
        engine = TorchEngine(model, device=args.device)
        if args.threads:  # after the engine, which sets its own (swarm.engine.precision.cpu_threads)
            torch.set_num_threads(args.threads)
        try:
            rows = [
                bench(engine, w, args.steps, config)
                for w in (("arith", "long") if args.workload == "both" else (args.workload,))
            ]
        finally:
            engine.batcher.close()
    print(f"device {engine.device}, dtype {next(engine.model.parameters()).dtype}, kl_coef {args.kl_coef}")
    print(
        f"{'workload':>8} {'tokens':>7} {'mbs':>4} {'engine tok/s':>13} {'no-share tok/s':>15} {'raw tok/s':>10} "
        f"{'engine/raw':>10} {'no-share/raw':>12}"
    )
    for r in rows:
        print(
            f"{r['workload']:>8} {r['tokens']:>7} {r['micro_batches']:>4} {r['engine_tokens_per_s']:>13.0f} "
            f"{r['plain_tokens_per_s']:>15.0f} {r['raw_tokens_per_s']:>10.0f} {r['ratio']:>10.2f} "
            f"{r['plain_ratio']:>12.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
