"""Parity: Tinker's `ppo` forward_backward + optim_step is Roost's own train step on the same samples.

Two LoRA policies of one host start from the same adapter. One takes the swarm trainer's step
(`PolicyEngine.train_step`: GRPO advantages, PPO-clip, token-mean, clip 0.2, AdamW, grad clip);
the other takes the primitives the Tinker routes run (`swarm.tinker.compute`), fed what a Tinker
loop would send for the same samples: per-token advantages = the sample's GRPO advantage over the
batch's trained-token count (Tinker's losses are sums; Roost's token-mean divides by that count),
the rollout logprobs, clip thresholds 0.8 / 1.2, and Roost's AdamW settings. Loss and updated
adapter weights agree within 1e-5.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(300)


def _samples(vocab: int) -> list[Any]:
    from swarm.samples import TrainSample  # lazy: beside the torch imports of the test

    rng = random.Random(3)
    out = []
    for g in range(2):
        prompt = [rng.randrange(3, vocab) for _ in range(5)]
        for e in range(3):
            answer = [rng.randrange(3, vocab) for _ in range(4 + e)]
            ids = prompt + answer
            mask = [0] * len(prompt) + [1] * len(answer)
            # rollout logprobs off the policy's own (stale samples): some ratios leave [0.8, 1.2]
            old = [0.0] * len(prompt) + [-6.0 + rng.uniform(-0.4, 0.4) for _ in answer]
            out.append(TrainSample(ids, mask, old, f"ep{g}{e}", f"g{g}", reward=float(e == g), weight=1.0))
    return out


def test_ppo_primitives_equal_the_swarm_train_step(model_dir: Path, tmp_path: Path) -> None:
    from swarm.config.lora import LoraSettings  # lazy: torch and the engines, in this test only
    from swarm.config.train import TrainConfig
    from swarm.engine.base import TrainBatch
    from swarm.engine.policies import PolicyHost
    from swarm.engine.policy_step import sample_advantages
    from swarm.tinker.compute import AdamStep, Datum, GradStash, forward_backward, optim_step

    host = PolicyHost(model_dir, seed=0, device="cpu")
    lora = LoraSettings(rank=4, lr_scale=1.0)
    roost, prim = host.add("roost", lora), host.add("prim", lora)
    roost.save(tmp_path / "start")
    prim.load(tmp_path / "start")  # the same adapter (B = 0, the same A) and a fresh optimizer each
    roost.share_prefix = False
    samples = _samples(host.base.batcher.vocab_size)
    config = TrainConfig(lr=5e-3, clip_eps=0.2, max_grad_norm=1.0, kl_coef=0.0, entropy_coef=0.0)

    adv = sample_advantages(samples, config)
    trained = sum(sum(s.loss_mask[1:]) for s in samples)
    datums = [
        Datum(
            s.input_ids[:-1],
            s.input_ids[1:],
            {
                "logprobs": s.rollout_logprobs[1:],
                "advantages": [a / trained * m for m in s.loss_mask[1:]],
            },
        )
        for s, a in zip(samples, adv)
    ]
    stash = GradStash()
    _, fb = forward_backward(prim, datums, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, stash)
    step = optim_step(prim, AdamStep(lr=5e-3, beta1=0.9, beta2=0.99, eps=1e-8, grad_clip_norm=1.0), stash)
    metrics = roost.train_step(TrainBatch(samples, config))

    assert fb["loss:sum"] == pytest.approx(metrics["loss"], abs=1e-5)
    assert step["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-4)
    assert metrics["clipfrac"] > 0  # the clip was exercised
    a, b = roost.adapter_state(), prim.adapter_state()
    assert a.keys() == b.keys()
    moved = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"loss {fb['loss:sum']:.9f} vs {metrics['loss']:.9f}; largest adapter weight difference {moved:.2e}")
    assert moved < 1e-5
    start = prim.adapter_state()  # (after the step) and the step did move the weights
    assert any(float(v.abs().max()) > 0 for k, v in start.items() if "lora_B" in k)
