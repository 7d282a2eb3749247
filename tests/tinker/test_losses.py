"""Each built-in Tinker loss against a value computed by hand on a 3-token batch (to 1e-6).

logp (policy)     -1.0   -2.0   -0.5
sampler logprobs  -1.1   -1.8   -0.5        ratio = exp(logp - old) = e^0.1, e^-0.2, 1
advantages         1.0   -2.0    0.5
weights            1.0    0.5    0.0

cross_entropy        -(1*-1 + 0.5*-2 + 0)                                      =  2.0
importance_sampling  -(1.1051709180756477 - 2*0.8187307530779818 + 0.5)     =  0.0322905880803159
ppo (clip 0.9, 1.05) -(min(1.10517, 1.05) + min(-1.63746, -1.8) + 0.5)       = -(1.05 - 1.8 + 0.5) = 0.25
cispo (0.9, 1.05)    -(1.05*-1*1 + 0.9*-2*-2 + 1*-0.5*0.5)                   = -2.3
dro (beta 0.1)       -((-1 - 0.05*0.01) + (4 - 0.05*0.04) + (-0.25 - 0))     = -2.7475
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from swarm.algorithms.tinker_losses import LossInputError, check_inputs, loss_config, tinker_loss  # noqa: E402

LOGP = [-1.0, -2.0, -0.5]
OLD = [-1.1, -1.8, -0.5]
ADV = [1.0, -2.0, 0.5]
W = [1.0, 0.5, 0.0]


def _run(name: str, config: dict[str, float] | None = None) -> tuple[float, list[float], list[float]]:
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    inputs = {
        k: torch.tensor(v, dtype=torch.float64) for k, v in (("logprobs", OLD), ("advantages", ADV), ("weights", W))
    }
    terms = tinker_loss(name, logp, inputs, config)
    terms.loss.backward()
    assert float(terms.elementwise.sum()) == pytest.approx(float(terms.loss.detach()), abs=1e-12)
    return float(terms.loss.detach()), terms.elementwise.tolist(), logp.grad.tolist()


def test_cross_entropy() -> None:
    loss, per, grad = _run("cross_entropy")
    assert loss == pytest.approx(2.0, abs=1e-6)
    assert per == pytest.approx([1.0, 1.0, 0.0], abs=1e-6)
    assert grad == pytest.approx([-1.0, -0.5, 0.0], abs=1e-6)  # d/dlogp of -(w * logp)


def test_importance_sampling() -> None:
    loss, _, grad = _run("importance_sampling")
    assert loss == pytest.approx(0.0322905880803159, abs=1e-6)
    r = [math.exp(0.1), math.exp(-0.2), 1.0]
    assert grad == pytest.approx([-r[i] * ADV[i] for i in range(3)], abs=1e-6)  # d ratio / d logp = ratio


def test_ppo_clips_both_ways() -> None:
    loss, per, grad = _run("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05})
    assert loss == pytest.approx(0.25, abs=1e-6)
    assert per == pytest.approx([-1.05, 1.8, -0.5], abs=1e-6)
    assert grad == pytest.approx([0.0, 0.0, -0.5], abs=1e-6)  # clipped tokens pass no gradient
    # with Tinker's default thresholds (0.8, 1.2) nothing clips: it is importance sampling
    assert _run("ppo")[0] == pytest.approx(0.0322905880803159, abs=1e-6)


def test_cispo_keeps_the_gradient_of_clipped_tokens() -> None:
    loss, _, grad = _run("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05})
    assert loss == pytest.approx(-2.3, abs=1e-6)
    assert grad == pytest.approx([-1.05, 1.8, -0.5], abs=1e-6)  # -stopgrad(clip(ratio)) * A


def test_dro() -> None:
    loss, _, grad = _run("dro", {"beta": 0.1})
    assert loss == pytest.approx(-2.7475, abs=1e-6)
    # d/dlogp of -(logp*A - beta/2 (logp-old)^2) = -A + beta (logp - old)
    assert grad == pytest.approx([-1.0 + 0.1 * 0.1, 2.0 + 0.1 * -0.2, -0.5], abs=1e-6)


def test_what_the_losses_refuse() -> None:
    with pytest.raises(LossInputError) as e:
        loss_config("kl_magic", None)
    assert e.value.code == "unknown_loss"
    with pytest.raises(LossInputError) as e:
        loss_config("ppo", {"clip_low_threshold": 1.5})
    assert e.value.code == "invalid_loss_config"
    with pytest.raises(LossInputError) as e:
        loss_config("cross_entropy", {"beta": 1.0})
    assert e.value.code == "invalid_loss_config"
    with pytest.raises(LossInputError) as e:
        check_inputs("ppo", 3, {"logprobs": OLD, "advantages": [1.0, math.nan, 0.0]})
    assert e.value.code == "non_finite_input"
    with pytest.raises(LossInputError) as e:
        check_inputs("ppo", 3, {"logprobs": OLD, "advantages": ADV[:2]})
    assert e.value.code == "length_mismatch"
    with pytest.raises(LossInputError) as e:
        check_inputs("dro", 3, {"logprobs": OLD})
    assert e.value.code == "missing_loss_input"
    check_inputs("cross_entropy", 3, {})  # no weights: every token weighs 1
