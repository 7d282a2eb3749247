"""`ppo_epochs`: several optimizer updates per step over the same batch.

A step of E epochs must be exactly E steps of one epoch on the same batch with the same optimizer:
the advantages and the rollout ("old") logprobs are the batch's, not recomputed between passes, so
the later passes are off-policy by as much as the earlier ones moved the model, and the PPO clip
bounds them. The exact-KL distillation term and the KL to a reference ride along in every pass.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import swarm.engine.policy_step as ps
from swarm.engine import TrainConfig, TrainSample
from swarm.model.build import build_untrained


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    d: Path = build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)
    return AutoModelForCausalLM.from_pretrained(d).double()


def _samples(model: torch.nn.Module) -> list[TrainSample]:
    """Two groups of three sharing a prompt each (the shared-prefix layout applies), on-policy logprobs."""
    prompts = [[1, 5, 6, 7], [1, 5, 9, 9, 9, 8]]
    out = []
    for i in range(6):
        g = i % 2
        ids = prompts[g] + [20 + i, 21, 22][: 1 + i % 3]
        mask = [0] * len(prompts[g]) + [1] * (len(ids) - len(prompts[g]))
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
        old = [0.0] + [v if m else 0.0 for v, m in zip(lp.tolist(), mask[1:])]
        out.append(TrainSample(ids, mask, old, f"e{i}", f"g{g}", float(i % 3 == 0)))
    return out


def _perturbed(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    other = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn_like(p))
    return other


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("extra", ["kl_ref", "distill_full"])
def test_e_epochs_are_e_one_epoch_steps_on_the_same_batch(base, share: bool, extra: str) -> None:
    torch.manual_seed(0)
    samples = _samples(base)
    other = _perturbed(base, 0.02)
    kwargs = {"reference": other} if extra == "kl_ref" else {"teacher": other}
    knobs = {"kl_coef": 0.1} if extra == "kl_ref" else {"distill_coef": 0.5}
    one = TrainConfig(lr=3e-3, clip_eps=0.1, **knobs)
    three = one.model_copy(update={"ppo_epochs": 3})

    a = copy.deepcopy(base)
    opt_a = torch.optim.AdamW(a.parameters(), lr=one.lr)
    firsts = [ps.policy_step(a, opt_a, samples, one, share_prefix=share, **kwargs) for _ in range(3)]

    b = copy.deepcopy(base)
    opt_b = torch.optim.AdamW(b.parameters(), lr=one.lr)
    metrics = ps.policy_step(b, opt_b, samples, three, share_prefix=share, **kwargs)

    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-9)
    for key in ("loss", "pg_loss", "clipfrac", "kl", "grad_norm"):  # the passes' mean
        assert metrics[key] == pytest.approx(sum(m[key] for m in firsts) / 3, rel=1e-6, abs=1e-9), key
    assert metrics["shared_prefix"] == float(share)
    assert metrics["trained_tokens"] == firsts[0]["trained_tokens"]  # a batch's tokens, not 3x
    assert firsts[0]["clipfrac"] == 0.0 and firsts[0]["kl"] == pytest.approx(0.0, abs=1e-12)  # on-policy
    assert firsts[2]["kl"] > 0  # the later passes are off-policy: what the clip is for
    if extra == "distill_full":  # the KL of the policy that sampled, as with one epoch
        assert metrics["distill_kl"] == pytest.approx(firsts[0]["distill_kl"], rel=1e-9)


def test_ppo_epochs_is_a_positive_bounded_integer() -> None:
    assert TrainConfig().ppo_epochs == 1
    for bad in (0, -1, 65):
        with pytest.raises(ValidationError, match="ppo_epochs"):
            TrainConfig(ppo_epochs=bad)
