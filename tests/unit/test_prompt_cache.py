"""Prompt reuse in the torch engine: a GRPO group's shared prompt is prefilled once, exactly.

The checks that matter: reused rows get the logprobs a full recompute gives (no stale or
misaligned KV), a seed samples the same tokens whether its prompt was reused or not, and a
train step (new weights) empties the cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch_helpers import chat_prompt as _prompt
from torch_helpers import generate_all as _gen

from swarm.engine import GenerateRequest, SamplingParams, TrainBatch, TrainConfig, TrainSample
from swarm.engine.prompt_cache import PrefilledPrompt, PromptCache, split_rows, stack
from swarm.engine.torch_engine import TorchEngine
from swarm.model.build import build_untrained

TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)


@pytest.fixture()
def engine(model_dir):
    e = TorchEngine(model_dir, seed=0, device="cpu", reference=False)
    yield e
    e.batcher.close()


def _exact(engine, outs) -> None:
    for o in outs:
        recomputed = engine.logprobs(o.prompt_ids + o.token_ids)[len(o.prompt_ids) - 1 :]
        assert max(abs(a - b) for a, b in zip(recomputed, o.logprobs)) < TOL


def _group(engine, text: str, size: int, seed0: int = 0, max_tokens: int = 12):
    return [
        GenerateRequest(_prompt(engine, text), SamplingParams(max_tokens=max_tokens, seed=seed0 + i, ignore_eos=True))
        for i in range(size)
    ]


def test_a_group_in_one_batch_prefills_its_prompt_once(engine):
    # two groups of 4 (a GRPO batch) beside one odd prompt of another length
    reqs = _group(engine, "What is 12+7?", 4) + _group(engine, "What is 40+2? Think.", 4, seed0=10)
    reqs.append(GenerateRequest(_prompt(engine, "hi"), SamplingParams(max_tokens=12, seed=99, ignore_eos=True)))
    outs = _gen(engine, reqs)
    assert engine.batcher.prompts_reused == 6  # 9 rows, 3 distinct prompts
    _exact(engine, outs)
    # each seed draws what it draws alone (no reuse, no batch around it)
    alone = TorchEngine(engine.model_dir, seed=0, device="cpu", reference=False)
    alone.batcher.prompts = PromptCache(max_tokens=0)  # nothing kept: every request prefilled afresh
    try:
        for r, o in zip(reqs[::3], outs[::3]):
            assert _gen(alone, [r])[0].token_ids == o.token_ids
        assert alone.batcher.prompts_reused == 0
    finally:
        alone.batcher.close()


def test_a_group_trickling_in_reuses_the_cached_prefill(engine):
    first = _gen(engine, _group(engine, "What is 3+4?", 1))
    later = _gen(engine, _group(engine, "What is 3+4?", 3, seed0=1))  # the rest of the group, a step later
    assert engine.batcher.prompts_reused == 3
    _exact(engine, first + later)


def test_new_weights_empty_the_cache(engine):
    reqs = _group(engine, "What is 5+5?", 4)
    outs = _gen(engine, reqs)
    assert len(engine.batcher.prompts) > 0
    samples = [
        TrainSample(
            o.prompt_ids + o.token_ids,
            [0] * len(o.prompt_ids) + [1] * len(o.token_ids),
            [0.0] * len(o.prompt_ids) + o.logprobs,
            f"e{i}",
            "g",
            float(i % 2),
        )
        for i, o in enumerate(outs)
    ]
    engine.train_step(TrainBatch(samples, TrainConfig(lr=5e-2)))
    assert len(engine.batcher.prompts) == 0
    reused = engine.batcher.prompts_reused
    again = _gen(engine, reqs[:1])
    assert engine.batcher.prompts_reused == reused  # prefilled afresh with the new weights
    _exact(engine, again)  # a stale KV would miss the recompute by far more than TOL
    assert again[0].logprobs != outs[0].logprobs


def test_lru_bounded_by_prompt_tokens():
    cache = PromptCache(max_tokens=10)
    entry = PrefilledPrompt((torch.zeros(1, 1, 4, 2),), (torch.zeros(1, 1, 4, 2),), torch.ones(1, 4), torch.zeros(5))
    cache.put((1, 2, 3, 4), entry)
    cache.put((5, 6, 7, 8), entry)
    assert cache.get((1, 2, 3, 4)) is entry  # now the most recent
    cache.put((9, 9, 9, 9), entry)  # 12 tokens > 10: the least recently used goes
    assert (5, 6, 7, 8) not in cache and (1, 2, 3, 4) in cache and (9, 9, 9, 9) in cache
    cache.put(tuple(range(11)), entry)  # larger than the whole budget: never stored
    assert tuple(range(11)) not in cache
    assert PromptCache(max_tokens=0).max_tokens == 0
    few = PromptCache(max_tokens=100, max_entries=2)  # the entry bound holds the logits down
    for p in ((1,), (2,), (3,)):
        few.put(p, entry)
    assert len(few) == 2 and (1,) not in few
    cache.clear()
    assert len(cache) == 0


def test_split_trims_left_padding_and_stack_restores_it():
    attn = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1]])  # left pad; full; a shared-prefix gap
    keys = [torch.arange(3 * 4, dtype=torch.float).view(3, 1, 4, 1)]
    logits = torch.arange(6, dtype=torch.float).view(3, 2)
    rows = split_rows(keys, [k + 100 for k in keys], attn, logits)
    assert [r.width for r in rows] == [2, 4, 4]  # only leading padding is trimmed
    k, v, a, lg = stack(rows)
    assert torch.equal(a, attn) and torch.equal(lg, logits)
    assert torch.equal(k[0] * a.view(3, 1, 4, 1), keys[0] * attn.view(3, 1, 4, 1))  # equal where real
    assert torch.equal(v[0][1], keys[0][1] + 100)
