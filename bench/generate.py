"""Generation throughput of the torch engine: concurrent requests vs one at a time.

    python bench/generate.py                    # untrained tiny model built on the fly
    python bench/generate.py --model DIR --json out.json

Every row is measured in the same process, minutes apart at most, so the ratios
hold on a noisy machine even where absolute tokens/s do not. Requests generate
a fixed number of tokens (ignore_eos) so every configuration does the same work.
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


async def _run(engine: TorchEngine, concurrency: int, requests: int, max_tokens: int) -> float:
    """tokens/s for `requests` requests issued `concurrency` at a time."""
    sem = asyncio.Semaphore(concurrency)
    produced = 0

    async def one(i: int) -> None:
        nonlocal produced
        async with sem:
            c = await engine.generate(GenerateRequest(
                _prompt(engine, i), SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, ignore_eos=True)))
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
        rows.append({"concurrency": c, "tokens_per_s": round(tps, 1), "ratio_vs_sequential": round(tps / sequential, 2)})
    return [{"concurrency": 0, "tokens_per_s": round(sequential, 1), "ratio_vs_sequential": 1.0}] + rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="HF model dir (default: a freshly built untrained tiny model)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from swarm.model.build import build_untrained

            model = build_untrained(Path(tmp) / "model")
        engine = TorchEngine(model, reference=False)
        rows = asyncio.run(bench(engine, args.max_tokens, args.repeats))
        engine.batcher.close()
    table = Table(title=f"torch engine generation, {args.max_tokens} new tokens per request")
    for col in ("concurrency", "tokens/s", "× sequential"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row("sequential" if r["concurrency"] == 0 else str(r["concurrency"]),
                      f"{r['tokens_per_s']:.0f}", f"{r['ratio_vs_sequential']:.2f}")
    Console().print(table)
    rows = [r for r in rows if r["concurrency"] > 0]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
