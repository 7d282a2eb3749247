"""The torch engine on an untrained tiny model: generation, logprobs, training, persistence."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from swarm.engine import GenerateRequest, SamplingParams, TrainBatch, TrainConfig, TrainSample
from swarm.engine.torch_engine import TorchEngine
from swarm.model.build import build_untrained

LOGPROB_TOL = 1e-4  # fp32 CPU: batched KV-cache decoding vs a full teacher-forced forward


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)


@pytest.fixture(scope="module")
def engine(model_dir):
    e = TorchEngine(model_dir, seed=0)
    yield e
    e.batcher.close()


def _prompt(engine, text="What is 2+3?"):
    s = engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return engine.tokenizer.encode(s, add_special_tokens=False)


def _gen(engine, reqs):
    async def go():
        return await asyncio.gather(*(engine.generate(r) for r in reqs))

    return asyncio.run(go())


def test_concurrent_generation_logprobs_match_recompute(engine):
    reqs = [GenerateRequest(_prompt(engine, f"What is {i}+{i}?") + [7] * (i % 4),
                            SamplingParams(max_tokens=24, temperature=1.0, seed=i)) for i in range(12)]
    outs = _gen(engine, reqs)
    for o in outs:
        assert 1 <= len(o.token_ids) <= 24 and len(o.logprobs) == len(o.token_ids)
        recomputed = engine.logprobs(o.prompt_ids + o.token_ids)[len(o.prompt_ids) - 1:]
        assert max(abs(a - b) for a, b in zip(recomputed, o.logprobs)) < LOGPROB_TOL


def test_seed_reproducible_whatever_the_batch(engine):
    req = GenerateRequest(_prompt(engine), SamplingParams(max_tokens=16, temperature=1.0, seed=42, ignore_eos=True))
    alone = _gen(engine, [req])[0]
    crowd = _gen(engine, [req] + [GenerateRequest(_prompt(engine, "x"), SamplingParams(max_tokens=30))] * 5)[0]
    assert alone.token_ids == crowd.token_ids


def test_greedy_max_tokens_and_ignore_eos(engine):
    req = GenerateRequest(_prompt(engine), SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    a, b = _gen(engine, [req, req])
    assert a.token_ids == b.token_ids and len(a.token_ids) == 10 and a.finish_reason == "length"


def test_stop_token_and_stop_string(engine):
    first = _gen(engine, [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=8, temperature=0.0,
                                                                           ignore_eos=True))])[0]
    tok = first.token_ids[2]
    out = _gen(engine, [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=8, temperature=0.0,
                                                                         ignore_eos=True, stop_token_ids=(tok,)))])[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == tok and len(out.token_ids) <= 3
    text = engine.tokenizer.decode(first.token_ids[:3])
    if text.strip():
        out = _gen(engine, [GenerateRequest(_prompt(engine), SamplingParams(
            max_tokens=8, temperature=0.0, ignore_eos=True, stop=(text[-1],)))])[0]
        assert out.finish_reason == "stop" and len(out.token_ids) <= 3


def test_bad_prompts_rejected(engine):
    with pytest.raises(ValueError):
        _gen(engine, [GenerateRequest([], SamplingParams())])
    with pytest.raises(ValueError):
        _gen(engine, [GenerateRequest([10**9], SamplingParams())])


def _samples(outs, rewards):
    return [TrainSample(o.prompt_ids + o.token_ids, [0] * len(o.prompt_ids) + [1] * len(o.token_ids),
                        [0.0] * len(o.prompt_ids) + o.logprobs, f"e{i}", f"g{i // 4}", r)
            for i, (o, r) in enumerate(zip(outs, rewards))]


def test_train_step_moves_toward_rewarded_tokens(model_dir):
    engine = TorchEngine(model_dir, seed=1)
    try:
        reqs = [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=6, temperature=1.0, seed=i,
                                                                ignore_eos=True)) for i in range(8)]
        outs = _gen(engine, reqs)
        rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
        samples = _samples(outs, rewards)
        before = engine.logprobs(samples[0].input_ids)[-6:]
        m = engine.train_step(TrainBatch(samples, TrainConfig(lr=5e-3)))
        after = engine.logprobs(samples[0].input_ids)[-6:]
        assert engine.policy_version == 1 and m["policy_version"] == 1
        for key in ("loss", "kl", "entropy", "grad_norm", "tokens_per_s"):
            assert key in m and m[key] == m[key]  # present and not NaN
        assert m["kl"] == pytest.approx(0.0, abs=1e-4)  # on-policy: ratio 1
        assert sum(after) > sum(before)  # the rewarded completion became more likely
    finally:
        engine.batcher.close()


def test_save_load_roundtrip(model_dir, tmp_path):
    a = TorchEngine(model_dir, seed=2)
    outs = _gen(a, [GenerateRequest(_prompt(a), SamplingParams(max_tokens=5, seed=i)) for i in range(4)])
    a.train_step(TrainBatch(_samples(outs, [1, 0, 1, 0]), TrainConfig(lr=1e-3)))
    a.save(tmp_path / "ckpt")
    b = TorchEngine(model_dir, seed=3)
    b.load(tmp_path / "ckpt")
    assert b.policy_version == a.policy_version == 1
    for (n1, p1), (n2, p2) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert b.optimizer.state_dict()["state"].keys() == a.optimizer.state_dict()["state"].keys()
    a.batcher.close()
    b.batcher.close()


def test_loss_aggregation_modes_agree_on_equal_lengths_and_differ_otherwise(model_dir):
    import copy

    from swarm.engine.policy_step import policy_step
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)

    def sample(ids, gen, reward, group="g"):
        mask = [0] * (len(ids) - gen) + [1] * gen
        return TrainSample(input_ids=ids, loss_mask=mask, rollout_logprobs=[0.0] * len(ids), episode_id=str(ids),
                           group_id=group, reward=reward)

    equal = [sample([1, 5, 6, 7], 2, 1.0), sample([1, 5, 8, 9], 2, 0.0)]
    uneven = [sample([1, 5, 6, 7, 8, 9, 10, 11], 6, 1.0), sample([1, 5, 8, 9], 1, 0.0)]
    # lr 0: the step leaves the weights alone; its reported loss is the aggregate under test
    for samples, same in ((equal, True), (uneven, False)):
        out = {}
        for mode in ("token-mean", "seq-mean-token-mean"):
            model = copy.deepcopy(base)
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            out[mode] = policy_step(model, opt, samples, TrainConfig(lr=0.0, loss_agg=mode))["loss"]
        assert (out["token-mean"] == pytest.approx(out["seq-mean-token-mean"], rel=1e-5)) is same, out
    with pytest.raises(ValueError, match="loss_agg"):
        TrainConfig(loss_agg="sum")
