"""Shared-prefix training forwards (swarm/engine/shared_prefix.py): the same update as the plain
forward, and micro-batch plans that cover every sample once within the token budget."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swarm.engine.policy_step as ps
from swarm.engine import TrainConfig, TrainSample
from swarm.engine.shared_prefix import plan, split_point
from swarm.model.build import build_untrained


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def _sample(prompt: list[int], rest: list[int], mask: list[int], i: int, group: str, reward: float) -> TrainSample:
    return TrainSample(
        input_ids=prompt + rest,
        loss_mask=[0] * len(prompt) + mask,
        rollout_logprobs=[0.0] * len(prompt) + [-1.0 - 0.1 * j for j in range(len(rest))],
        episode_id=f"e{i}",
        group_id=group,
        reward=reward,
        weight=0.5 + (i % 3) / 2,
    )


def _batch() -> list[TrainSample]:
    """Three groups with prompts of different lengths (left padding), single- and multi-turn
    suffixes (a tool turn the loss skips), answers of different lengths (right padding)."""
    prompts = [[1, 5, 6, 7], [1, 5, 9, 9, 9, 8, 3], [1, 2]]
    out = []
    for i in range(12):
        g = i % 3
        answer = [20 + i, 21, 22][: 1 + i % 3]
        if g == 1:  # multi-turn: answer, a tool result (not trained), a second answer
            rest, mask = answer + [40, 41, 42] + [30 + i], [1] * len(answer) + [0, 0, 0, 1]
        else:
            rest, mask = answer, [1] * len(answer)
        out.append(_sample(prompts[g], rest, mask, i, f"g{g}", float(i % 4 == 0)))
    return out


def _step(base, samples, config, share: bool, reference=None):
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # parameters move by exactly -grad
    metrics = ps.policy_step(model, opt, samples, config, reference=reference, share_prefix=share)
    return metrics, model


@pytest.mark.parametrize(
    "config",
    [
        TrainConfig(lr=1.0),
        TrainConfig(lr=1.0, kl_coef=0.1, entropy_coef=0.01, micro_batch_tokens=24, loss_agg="seq-mean-token-mean"),
    ],
)
def test_shared_prefix_update_equals_the_plain_forward(model_dir, config) -> None:
    """The same gradient up to rounding: the model runs in float64 and the loss in float32 (the
    log-softmax is taken in fp32), so they agree to ~1e-7; a wrong position, mask or prefix would be
    off by the size of the update itself. (In fp32 throughout they differ by ~5e-5, as much as the
    plain forward does from itself under another micro-batching.)"""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir).double()
    reference = copy.deepcopy(base).requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    samples = _batch()
    (m_shared, shared), (m_plain, plain) = (_step(base, samples, config, s, reference) for s in (True, False))
    assert m_shared["shared_prefix"] == 1.0 and m_plain["shared_prefix"] == 0.0
    for key in ("loss", "pg_loss", "entropy", "kl_ref", "grad_norm", "trained_tokens", "tokens"):
        assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-6, abs=1e-9), key  # summed in fp32
    start = dict(base.named_parameters())
    num = den = 0.0
    for (name, p), q in zip(shared.named_parameters(), plain.parameters()):
        num += float(((p - q) ** 2).sum())
        den += float(((q - start[name]) ** 2).sum())
    assert den > 0 and (num / den) ** 0.5 < 1e-6


def test_a_sample_with_nothing_trained_rides_along(model_dir) -> None:
    """A sample without trained tokens (its prefix is all of it) changes nothing and breaks nothing."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir).double()
    samples = _batch()
    idle = TrainSample(
        input_ids=[1, 2, 7, 7],
        loss_mask=[0, 0, 0, 0],
        rollout_logprobs=[0.0] * 4,
        episode_id="idle",
        group_id="g0",
        reward=0.0,
    )
    (m_shared, shared), (m_plain, plain) = (
        _step(base, samples + [idle], TrainConfig(lr=1.0), s) for s in (True, False)
    )
    assert m_shared["shared_prefix"] == 1.0 and m_shared["trained_tokens"] == m_plain["trained_tokens"]
    for p, q in zip(shared.parameters(), plain.parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-9)


def test_distinct_prompts_take_the_plain_forward(model_dir) -> None:
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    samples = [_sample([1, 3 + i, 4], [20, 21], [1, 1], i, f"g{i}", float(i % 2)) for i in range(4)]
    assert plan(samples, 8192) is None
    metrics, _ = _step(base, samples, TrainConfig(lr=1e-3), True)
    assert metrics["shared_prefix"] == 0.0


def test_split_point_is_the_first_trained_token() -> None:
    s = _sample([1, 2, 3], [7, 8], [0, 1], 0, "g", 0.0)
    assert split_point(s) == 4
    assert (
        split_point(
            TrainSample(
                input_ids=[5, 6],
                loss_mask=[1, 1],
                rollout_logprobs=[0.0, 0.0],
                episode_id="e",
                group_id="g",
                reward=0.0,
            )
        )
        == 1
    )  # token 0 is never a target


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(1, 12)), min_size=1, max_size=40),
    st.integers(4, 64),
)
def test_plan_covers_every_sample_once_within_budget(rows, budget) -> None:
    prompts = [[1] * 3, [1, 2] * 4, [3] * 10, [4]]  # shared prompts of 3, 8, 10 and 1 tokens
    samples = [_sample(prompts[p], [9] * n, [1] * n, i, f"g{p}", 0.0) for i, (p, _, n) in enumerate(rows)]
    batches = plan(samples, budget)
    if batches is None:
        return  # too little to share: the plain micro-batches take it
    seen = [i for mb in batches for group in mb for i in group]
    assert sorted(seen) == list(range(len(samples)))
    for mb in batches:
        for group in mb:
            assert len({tuple(samples[i].input_ids[: split_point(samples[i])]) for i in group}) == 1
        cuts = [split_point(samples[g[0]]) for g in mb]
        suffix = max(len(samples[i].input_ids) - split_point(samples[i]) for g in mb for i in g)
        rows_n = sum(len(g) for g in mb)
        assert len(mb) * max(cuts) + rows_n * suffix <= budget or (len(mb) == 1 and len(mb[0]) == 1)
