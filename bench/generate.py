"""Generation throughput of the torch engine: concurrent requests vs one at a time.

    python bench/generate.py                    # untrained tiny model built on the fly
    python bench/generate.py --model DIR --json out.json
    python bench/generate.py --top-logprobs 5 --json-object   # the cost of top-k and of a constraint

Every row is measured in the same process, minutes apart at most, so the ratios
hold on a noisy machine even where absolute tokens/s do not. Requests generate
a fixed number of tokens (ignore_eos) so every configuration does the same work.

The second table is one collection step of `swarm train --task arith` as the
engine sees it: 128 arith requests, 16 prompts x a group of 8 (8 max tokens, temperature 1,
natural stop), with prompt reuse off and on (a group's prompt prefilled once),
either all at once (the engine's own time to generate a step's tokens: the
yardstick for the server's `wall_window_s`) or trickling in evenly over
`--trickle-ms`, as episodes from a client fleet do. For the trickle the row shows
the time from the last arrival to the last completion, the forward passes taken
and how many of them prefilled newcomers while decoding the running rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from swarm.engine.base import GenerateRequest, SamplingParams
from swarm.engine.torch_engine import TorchEngine


def _prompt(engine: TorchEngine, i: int) -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"What is {i % 50}+{(7 * i) % 50}?"}], add_generation_prompt=True, tokenize=False
    )
    return engine.tokenizer.encode(text, add_special_tokens=False)


#: extra SamplingParams of every request of the first table (--top-logprobs, --json-object)
EXTRA: dict = {}


async def _run(engine: TorchEngine, concurrency: int, requests: int, max_tokens: int) -> float:
    """tokens/s for `requests` requests issued `concurrency` at a time."""
    sem = asyncio.Semaphore(concurrency)
    produced = 0

    async def one(i: int) -> None:
        nonlocal produced
        async with sem:
            c = await engine.generate(
                GenerateRequest(
                    _prompt(engine, i),
                    SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, ignore_eos=True, **EXTRA),
                )
            )
            produced += len(c.token_ids)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    return produced / (time.perf_counter() - t0)


async def bench(engine: TorchEngine, max_tokens: int, repeats: int) -> list[dict]:
    await _run(engine, 4, 8, 8)  # warm up kernels and the worker thread
    sequential = await _run(engine, 1, 8, max_tokens)
    rows = []
    for c in (1, 8, 32):
        tps = max([await _run(engine, c, max(c, 8) * repeats, max_tokens) for _ in range(repeats)])
        rows.append(
            {"concurrency": c, "tokens_per_s": round(tps, 1), "ratio_vs_sequential": round(tps / sequential, 2)}
        )
    return [{"concurrency": 0, "tokens_per_s": round(sequential, 1), "ratio_vs_sequential": 1.0}] + rows


async def arith_step(engine: TorchEngine, episodes: int, trickle_s: float, group: int, reuse: bool) -> dict:
    """One step's worth of arith requests (`group` episodes per prompt, as GRPO sends them), all at
    once (trickle 0) or spread evenly over `trickle_s`; `reuse`: prompts prefilled once per group."""
    batcher = engine.batcher
    batcher.weights_changed()  # as after a train step: nothing prefilled before counts
    batcher.reuse_prompts = reuse
    steps0, fused0, busy0, reused0 = batcher.steps, batcher.fused_steps, batcher.busy_s, batcher.prompts_reused
    tokens = 0

    async def one(i: int) -> float:
        nonlocal tokens
        await asyncio.sleep(trickle_s * i / episodes)
        c = await engine.generate(GenerateRequest(_prompt(engine, 3 * (i // group) + 1), SamplingParams(max_tokens=8)))
        tokens += len(c.token_ids)
        return time.perf_counter()

    t0 = time.perf_counter()
    ends = await asyncio.gather(*(one(i) for i in range(episodes)))
    wall = max(ends) - t0
    return {
        "episodes": episodes,
        "trickle_s": trickle_s,
        "tokens": tokens,
        "wall_s": round(wall, 4),
        "after_last_arrival_s": round(wall - trickle_s * (episodes - 1) / episodes, 4),
        "busy_s": round(batcher.busy_s - busy0, 4),
        "forwards": batcher.steps - steps0,
        "fused": batcher.fused_steps - fused0,
        "reuse": reuse,
        "reused": batcher.prompts_reused - reused0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="HF model dir (default: a freshly built untrained tiny model)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=128, help="arith requests of one step")
    ap.add_argument("--group-size", type=int, default=8, help="requests per prompt (a GRPO group)")
    ap.add_argument("--trickle-ms", type=float, default=500.0, help="arrival spread of the trickle row")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the engine's choice)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--top-logprobs", type=int, default=0, help="first table: k most likely tokens per position")
    ap.add_argument(
        "--json-object",
        action="store_true",
        help="first table: response_format json_object (a constrained row ends where its object does)",
    )
    args = ap.parse_args()
    if args.top_logprobs:
        EXTRA["top_logprobs"] = args.top_logprobs
    if args.json_object:
        EXTRA["response_format"] = json.dumps({"type": "json_object"})

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from swarm.model.build import build_untrained

            model = build_untrained(Path(tmp) / "model")
        engine = TorchEngine(model, reference=False)
        if args.threads:  # after the engine, which sets its own (swarm.engine.precision.cpu_threads)
            import torch

            torch.set_num_threads(args.threads)
        rows = asyncio.run(bench(engine, args.max_tokens, args.repeats))

        async def steps() -> list[dict]:
            out = []
            for trickle in (0.0, args.trickle_ms / 1000):
                for reuse in (False, True):
                    runs = [
                        await arith_step(engine, args.episodes, trickle, args.group_size, reuse)
                        for _ in range(args.repeats + 1)
                    ][1:]
                    out.append(min(runs, key=lambda r: r["wall_s"]))
            return out

        step_rows = asyncio.run(steps())
        engine.batcher.close()
    table = Table(title=f"torch engine generation, {args.max_tokens} new tokens per request")
    for col in ("concurrency", "tokens/s", "× sequential"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            "sequential" if r["concurrency"] == 0 else str(r["concurrency"]),
            f"{r['tokens_per_s']:.0f}",
            f"{r['ratio_vs_sequential']:.2f}",
        )
    Console().print(table)
    table = Table(title=f"one arith collection step: {args.episodes} requests, 8 max tokens, natural stop")
    for col in (
        "arrivals",
        "prompt reuse",
        "tokens",
        "wall s",
        "after last arrival s",
        "engine busy s",
        "forwards",
        "fused",
        "reused",
    ):
        table.add_column(col, justify="right")
    for r in step_rows:
        table.add_row(
            "all at once" if not r["trickle_s"] else f"over {r['trickle_s'] * 1000:.0f} ms",
            "on" if r["reuse"] else "off",
            str(r["tokens"]),
            f"{r['wall_s']:.3f}",
            f"{r['after_last_arrival_s']:.3f}",
            f"{r['busy_s']:.3f}",
            str(r["forwards"]),
            str(r["fused"]),
            str(r["reused"]),
        )
    Console().print(table)
    rows = [r for r in rows if r["concurrency"] > 0]
    if args.json:
        args.json.write_text(json.dumps({"concurrency": rows, "arith_step": step_rows}, indent=2))


if __name__ == "__main__":
    main()
