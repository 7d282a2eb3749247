"""Repeatability of `swarm train`: the spread of repeats at one seed against the spread across seeds.

    python bench/repeatability.py [--steps 20] [--repeats 5] [--seeds 5] [--modes on,off] [--json out.json]
    python bench/repeatability.py --batch-shape [--prompts 64]

One trial config (arith on the embedded model, `--no-mlflow`) runs `--repeats` times at one seed
and once at each of `--seeds` seeds (the repeat seed is the first of them), with `--deterministic`
on and off. A trial's score is what the researcher scores it by: `final_reward`, the mean reward of
the last 20 % of its steps (at least 1, at most 5). Printed per mode: the std and range of the
repeats' scores, the same of the seeds', and the ratio repeat std / seed std. The acceptance
target is a ratio of at most 1/4 with it on (the exit code says whether it held); exactly 0
where the engine allows. Steps per minute (from the metrics rows' times, so start-up does not
count) are printed per mode too: what lockstep costs. Runs go one at a time, each in a fresh
folder, so their timings compare.

`--batch-shape` measures what is left: how often a row's tokens change with its batch-mates in
the torch engine (padding width, matmul blocking). Each of `--prompts` arith prompts is
generated alone and then inside batches of random other prompts, seeded as a deterministic
server seeds it, and the completions are compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 0.25


def final_reward(rewards: list[float]) -> float:
    """The researcher's trial metric: the mean of the last 20 % of the steps (at least 1, at most 5)."""
    k = min(5, max(1, round(0.2 * len(rewards))))
    tail = rewards[-k:]
    return sum(tail) / len(tail)


def train(out: Path, seed: int, deterministic: bool, args: argparse.Namespace) -> dict:
    """One `swarm train` run: its final reward and steps per minute (first to last metrics row)."""
    argv = [sys.executable, "-m", "swarm", "train", "--task", "arith", "--steps", str(args.steps), "--no-mlflow"]
    argv += ["--seed", str(seed), "--out", str(out), *args.extra.split()]
    if deterministic:
        argv.append("--deterministic")
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"swarm train failed ({out}):\n{r.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "server" / "metrics.jsonl").read_text().splitlines()]
    rewards = [float(row["reward_mean"]) for row in rows]
    span = rows[-1]["time"] - rows[0]["time"]
    return {
        "seed": seed,
        "deterministic": deterministic,
        "final_reward": final_reward(rewards),
        "rewards": rewards,
        "steps_per_min": 60 * (len(rows) - 1) / span if span > 0 else None,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"std": statistics.stdev(values) if len(values) > 1 else 0.0, "range": max(values) - min(values)}


def repeatability(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="roost-repeat-"))
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    report: dict[str, dict] = {}
    ok = True
    for mode in args.modes.split(","):
        on = mode == "on"
        runs = [train(root / f"{mode}-seed{s}", s, on, args) for s in seeds]
        runs += [train(root / f"{mode}-repeat{i}", seeds[0], on, args) for i in range(1, args.repeats)]
        repeats = [runs[0]] + runs[len(seeds) :]
        rep = spread([r["final_reward"] for r in repeats])
        sd = spread([r["final_reward"] for r in runs[: len(seeds)]])
        ratio = rep["std"] / sd["std"] if sd["std"] > 0 else float("inf")
        speed = [r["steps_per_min"] for r in runs if r["steps_per_min"]]
        report[mode] = {
            "repeats": [r["final_reward"] for r in repeats],
            "seeds": [r["final_reward"] for r in runs[: len(seeds)]],
            "repeat_spread": rep,
            "seed_spread": sd,
            "ratio": ratio,
            "steps_per_min_median": statistics.median(speed) if speed else None,
            "identical_repeats": all(r["rewards"] == repeats[0]["rewards"] for r in repeats),
            "runs": runs,
        }
        print(
            f"deterministic {mode:3}: repeats (seed {seeds[0]}) std {rep['std']:.4f} range {rep['range']:.4f} | "
            f"seeds std {sd['std']:.4f} range {sd['range']:.4f} | ratio {ratio:.3f} | "
            f"per-step rewards of the repeats identical: {report[mode]['identical_repeats']} | "
            f"{report[mode]['steps_per_min_median']:.1f} steps/min",
            flush=True,
        )
        if on:
            ok = ok and ratio <= TARGET_RATIO
    if "on" in report and "off" in report:
        on_s, off_s = report["on"]["steps_per_min_median"], report["off"]["steps_per_min_median"]
        print(f"speed: {on_s:.1f} steps/min deterministic vs {off_s:.1f} off ({100 * (1 - on_s / off_s):+.0f} % cost)")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": vars(args), "modes": report}, indent=2))
    print(f"runs in {root}")
    return 0 if ok else 1


async def _complete(
    engine: object, prompts: list[list[int]], seeds: list[int], max_tokens: int
) -> list[tuple[list[int], list[float]]]:
    from swarm.engine.base import GenerateRequest, SamplingParams  # lazy: torch

    reqs = [
        GenerateRequest(p, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=s))
        for p, s in zip(prompts, seeds)
    ]
    done = await asyncio.gather(*(engine.generate(r) for r in reqs))  # type: ignore[attr-defined]
    return [(c.token_ids, c.logprobs) for c in done]


def batch_shape(args: argparse.Namespace) -> int:
    """Each prompt alone, then in random batches of others: how many completions change."""
    from store.paths import default_model_dir  # lazy: the engine imports torch
    from swarm.engine.torch_engine import TorchEngine
    from swarm.server.lockstep import derive_seed
    from swarm.tasks import arith

    engine = TorchEngine(default_model_dir(), seed=0)
    items = arith.dataset(seed=99, size=args.prompts)
    tok = engine.tokenizer
    prompts = [
        list(
            tok.apply_chat_template([{"role": "user", "content": it["question"]}], add_generation_prompt=True)[
                "input_ids"
            ]
        )
        for it in items
    ]
    seeds = [derive_seed(0, it["task_id"], 0, 0, 0) for it in items]
    engine.batcher.prompts.max_tokens = 0  # no cross-batch prefill reuse: compare the forward passes themselves
    alone = [asyncio.run(_complete(engine, [p], [s], args.max_tokens))[0] for p, s in zip(prompts, seeds)]
    changed = tokens = 0
    drift = 0.0  # the largest logprob difference of a token sampled alike alone and in a batch
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(range(len(prompts)))
        rng.shuffle(order)
        size = rng.choice([4, 8, 16, 32])
        for i in range(0, len(order), size):
            idx = order[i : i + size]
            got = asyncio.run(_complete(engine, [prompts[j] for j in idx], [seeds[j] for j in idx], args.max_tokens))
            for j, (ids, logps) in zip(idx, got):
                tokens += len(ids)
                changed += ids != alone[j][0]
                same = [a == b for a, b in zip(ids, alone[j][0])]
                same = same[: same.index(False)] if False in same else same
                drift = max([drift] + [abs(x - y) for x, y in zip(logps[: len(same)], alone[j][1])])
    rows = args.rounds * len(prompts)
    print(
        f"batch shape: {changed} of {rows} completions ({100 * changed / rows:.2f} %) differ from the same "
        f"seeded request alone; {tokens} tokens sampled in batches of 4-32; largest logprob difference of a "
        f"token sampled alike: {drift:.2e}"
    )
    asyncio.run(engine.close())
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--modes", default="on,off", help="on,off | on | off")
    p.add_argument("--extra", default="", help="more `swarm train` flags, e.g. '--group-size 4 --batch-groups 8'")
    p.add_argument("--json", default=None)
    p.add_argument("--batch-shape", action="store_true", help="measure batch-shape dependence instead")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=8)
    args = p.parse_args()
    return batch_shape(args) if args.batch_shape else repeatability(args)


if __name__ == "__main__":
    sys.exit(main())
