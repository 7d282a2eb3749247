"""Advantages and the PPO-clip loss against hand-computed values."""

import math

import pytest
import torch

from swarm.algorithms import compute_advantages, kl_k3, ppo_clip_loss, token_logprobs


def test_grpo_hand_computed():
    # group a: rewards 1, 0, 0, 1 -> mean .5, unbiased std = sqrt(1/3)
    adv = compute_advantages([1, 0, 0, 1, 0.5], ["a", "a", "a", "a", "b"], "grpo")
    s = math.sqrt(1 / 3)
    assert adv[:4] == pytest.approx([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6)])
    # a group of one: verl convention mean 0, std 1 -> advantage equals the reward
    assert adv[4] == pytest.approx(0.5 / (1 + 1e-6))


def test_grpo_without_std_and_constant_group():
    assert compute_advantages([2, 4], ["g", "g"], "grpo", normalize_std=False) == pytest.approx([-1, 1])
    assert compute_advantages([1, 1, 1], ["g"] * 3, "grpo") == pytest.approx([0, 0, 0])


def test_rloo_hand_computed():
    # r_i - mean(others): [1 - 1/2, 0 - 2/2... ] for rewards 1, 0, 1
    adv = compute_advantages([1, 0, 1], ["g"] * 3, "rloo")
    assert adv == pytest.approx([1 - 0.5, 0 - 1.0, 1 - 0.5])


def test_reinforce_pp_is_whitened():
    adv = torch.tensor(compute_advantages([1, 0, 3, 1], ["a", "a", "b", "b"], "reinforce_pp"))
    assert float(adv.mean()) == pytest.approx(0, abs=1e-6)
    assert float(adv.std()) == pytest.approx(1, abs=1e-4)


def test_unknown_estimator():
    with pytest.raises(ValueError, match="unknown advantage"):
        compute_advantages([1.0], ["g"], "ppo")


def test_ppo_clip_hand_computed():
    # two tokens; ratios e^0.5 (above 1.2 -> clipped for A>0) and e^-0.1 (inside the range)
    logp = torch.tensor([[0.5, -0.1]])
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, 1.0]])
    w = torch.ones(1, 2)
    t = ppo_clip_loss(logp, old, adv, w, denom=2.0, clip_low=0.2)
    expected = (-1.2 + -math.exp(-0.1)) / 2
    assert float(t.loss) == pytest.approx(expected, rel=1e-5)
    assert float(t.clipfrac) == pytest.approx(0.5)
    # negative advantage: ratio below 1-eps is clipped, max(-A r, -A clip(r)) picks the clipped one
    t = ppo_clip_loss(torch.tensor([[-0.5]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), 1.0)
    assert float(t.loss) == pytest.approx(0.8, rel=1e-5)


def test_ppo_weights_mask_tokens():
    logp = torch.tensor([[0.0, 3.0]])
    t = ppo_clip_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), denom=1.0)
    assert float(t.loss) == pytest.approx(-1.0)


def test_on_policy_gradient_is_reinforce():
    # ratio 1: d loss / d logp = -A * w / denom
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    t = ppo_clip_loss(logp, logp.detach(), torch.tensor([[2.0, -1.0]]), torch.ones(1, 2), denom=2.0)
    t.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, 0.5])


def test_kl_k3_zero_when_equal_and_positive():
    a = torch.tensor([-1.0, -2.0])
    assert kl_k3(a, a).tolist() == [0.0, 0.0]
    assert bool((kl_k3(a, a + 0.3) > 0).all())


def test_token_logprobs():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert float(token_logprobs(logits, torch.tensor([[1]]))) == pytest.approx(math.log(0.75))


def test_loss_scales_token_mean_and_seq_mean_hand_computed():
    from swarm.algorithms import loss_scales

    masks, weights = [[1, 1, 1, 0], [0, 1], [0, 0]], [1.0, 0.5, 1.0]
    scales, denom = loss_scales(masks, weights, "token-mean")
    assert scales == [1.0, 1.0, 1.0] and denom == 3 * 1.0 + 1 * 0.5
    scales, denom = loss_scales(masks, weights, "seq-mean-token-mean")
    assert scales == pytest.approx([1 / 3, 1.0, 1.0]) and denom == 1.5  # an empty sample adds no weight
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        loss_scales(masks, weights, "seq-sum")


def test_seq_mean_weighs_each_sample_once_whatever_its_length():
    """Per-token losses l: token-mean favours the long sample; seq-mean averages the two samples' means."""
    from swarm.algorithms import loss_scales

    losses = [[2.0, 2.0, 2.0, 2.0], [10.0]]
    masks = [[1, 1, 1, 1], [1]]

    def agg(mode):
        scales, denom = loss_scales(masks, [1.0, 1.0], mode)
        return sum(sc * sum(loss) for sc, loss in zip(scales, losses)) / denom

    assert agg("token-mean") == pytest.approx((8 + 10) / 5)
    assert agg("seq-mean-token-mean") == pytest.approx((2 + 10) / 2)
