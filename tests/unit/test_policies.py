"""Several LoRA policies on one base (swarm/engine/policies.py): isolation of a step, a mixed batch whose
rows each get what they get alone, checkpoints per policy, and the refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from swarm.config.lora import LoraSettings
from swarm.engine import GenerateRequest, SamplingParams, TrainBatch, TrainConfig, TrainSample
from swarm.engine.adapter_routing import adapter_parameters
from swarm.engine.lora import LoraError
from swarm.engine.policies import PolicyEngine, PolicyHost, check_name
from swarm.model.build import build_untrained

TOL = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def _randomize(policy: PolicyEngine, seed: int) -> None:
    """Non-zero adapter weights: peft starts B at zero, so fresh adapters would all equal the base."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter_parameters(policy.host.peft, policy.adapter):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    policy.host.base.batcher.weights_changed()


def _host(model_dir: Path, names=("a", "b", "c"), rank: int = 4) -> PolicyHost:
    host = PolicyHost(model_dir, seed=0, device="cpu")
    for i, name in enumerate(names):
        _randomize(host.add(name, LoraSettings(rank=rank + i)), seed=i + 1)
    return host


def _base_state(host: PolicyHost) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in host.peft.named_parameters() if "lora_" not in n}


def _samples(policy: PolicyEngine, n: int = 4) -> list[TrainSample]:
    out = []
    for i in range(n):
        ids = [1, 5 + i, 9, 17, 33, 65 + i, 129, 200]
        lps = [0.0, *policy.logprobs(ids)]
        mask = [0, 0, 0, 1, 1, 1, 1, 1]
        out.append(TrainSample(ids, mask, lps, f"e{i}", f"g{i // 2}", float(i % 2)))
    return out


def _gen(policy: PolicyEngine, prompts: list[list[int]]) -> list:
    async def run():
        reqs = [GenerateRequest(p, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)) for p in prompts]
        return await asyncio.gather(*(policy.generate(r) for r in reqs))

    return asyncio.run(run())


def test_a_step_of_one_policy_leaves_the_others_and_the_base_bit_identical(model_dir):
    host = _host(model_dir)
    a, b, c = (host.policy(n) for n in "abc")
    before = {n: host.policy(n).adapter_state() for n in "abc"}
    base = _base_state(host)
    metrics = a.train_step(TrainBatch(_samples(a), TrainConfig(lr=1e-3)))
    assert a.policy_version == 1 and b.policy_version == 0 and c.policy_version == 0
    assert metrics["lr"] == pytest.approx(1e-3 * a.lora.lr_scale)
    after_a = a.adapter_state()
    assert any(not torch.equal(after_a[k], before["a"][k]) for k in after_a), "policy a did not train"
    for n, p in (("b", b), ("c", c)):
        now = p.adapter_state()
        assert all(torch.equal(now[k], before[n][k]) for k in now), f"policy {n} changed"
    assert all(torch.equal(v, base[k]) for k, v in _base_state(host).items()), "the base changed"


def test_rows_of_three_policies_in_one_forward_get_what_they_get_alone(model_dir):
    host = _host(model_dir)
    prompts = {"a": [1, 5, 9, 17], "b": [1, 5, 9, 17], "c": [2, 6, 10, 18, 30]}
    alone = {n: _gen(host.policy(n), [p])[0] for n, p in prompts.items()}
    assert len({tuple(alone[n].token_ids) for n in "ab"}) == 2 or not torch.allclose(
        torch.tensor(alone["a"].logprobs), torch.tensor(alone["b"].logprobs), atol=TOL
    ), "adapters a and b answer alike: the test could not tell a mixed-up row"

    async def together():
        reqs = {
            n: GenerateRequest(p, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
            for n, p in prompts.items()
        }
        outs = await asyncio.gather(*(host.policy(n).generate(r) for n, r in reqs.items()))
        return dict(zip(reqs, outs))

    steps_before = host.base.batcher.steps
    mixed = asyncio.run(together())
    assert host.base.batcher.steps - steps_before <= 8, "the rows did not share forward passes"
    for n in prompts:
        assert mixed[n].token_ids == alone[n].token_ids, n
        assert torch.allclose(torch.tensor(mixed[n].logprobs), torch.tensor(alone[n].logprobs), atol=TOL), n


def test_a_policys_checkpoint_resumes_into_another_host(model_dir, tmp_path):
    host = _host(model_dir, names=("a", "b"))
    b = host.policy("b")
    b.train_step(TrainBatch(_samples(b), TrainConfig(lr=1e-3)))
    b.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "adapter_model.safetensors").exists()
    assert (tmp_path / "ckpt" / "adapter_config.json").exists()
    other = PolicyHost(model_dir, seed=0, device="cpu")
    fresh = other.add("b", LoraSettings(rank=5))
    fresh.load(tmp_path / "ckpt")
    assert fresh.policy_version == 1
    saved, loaded = b.adapter_state(), fresh.adapter_state()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    ids = [1, 5, 9, 17, 33]
    assert torch.allclose(torch.tensor(b.logprobs(ids)), torch.tensor(fresh.logprobs(ids)), atol=TOL)
    wrong = other.add("w", LoraSettings(rank=3))
    with pytest.raises(Exception, match="rank"):
        wrong.load(tmp_path / "ckpt")


def test_refusals(model_dir):
    host = _host(model_dir, names=("a",))
    with pytest.raises(ValueError, match="already exists"):
        host.add("a", LoraSettings(rank=4))
    with pytest.raises(LoraError, match="full fine-tuning"):
        host.add("full", LoraSettings(rank=0))
    with pytest.raises(LoraError, match="larger than the width"):
        host.add("huge", LoraSettings(rank=100_000))
    assert "huge" not in host.policies
    for bad in ("", "default", "a/b", "-x", "x" * 65):
        with pytest.raises(ValueError, match="policy name"):
            check_name(bad)


def test_a_removed_policy_is_gone_and_the_others_keep_working(model_dir):
    host = _host(model_dir, names=("a", "b"))
    a, b = host.policy("a"), host.policy("b")
    before = b.logprobs([1, 5, 9, 17])
    host.remove("a")
    assert list(host.policies) == ["b"]
    with pytest.raises(Exception, match="removed"):
        a.train_step(TrainBatch(_samples(b), TrainConfig()))
    with pytest.raises(Exception, match="removed"):  # no row naming its deleted adapter reaches a batch
        _gen(a, [[1, 5, 9, 17]])
    assert torch.allclose(torch.tensor(b.logprobs([1, 5, 9, 17])), torch.tensor(before), atol=TOL)
    b.train_step(TrainBatch(_samples(b), TrainConfig(lr=1e-3)))
    assert b.policy_version == 1
