"""On-policy distillation: the per-token reverse KL against hand-computed values, the teacher's terms
as the trainer builds them, and the per-token advantages in both training layouts."""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

import swarm.engine.policy_step as ps
from swarm.algorithms.distill import distill_advantages, full_reverse_kl, mean_reverse_kl, reverse_kl
from swarm.engine import TrainConfig, TrainSample
from swarm.model.build import build_untrained
from swarm.model.teacher import TeacherError, distill_terms, parse_prompt_logprobs


def test_reverse_kl_and_advantage_by_hand() -> None:
    student = torch.tensor([-1.0, -2.0, -0.5])
    teacher = torch.tensor([-1.5, -1.0, -0.5])
    mask = torch.tensor([1, 1, 0])
    # kl_t = log ps - log pt = [0.5, -1.0, 0.0]; A_t = -0.5 * kl_t where trained, 0 elsewhere
    assert reverse_kl(student, teacher).tolist() == [0.5, -1.0, 0.0]
    assert distill_advantages(student, teacher, mask, 0.5).tolist() == [-0.25, 0.5, 0.0]
    assert mean_reverse_kl(student, teacher, mask).item() == pytest.approx(-0.25)
    assert mean_reverse_kl(student, teacher, torch.zeros(3)).item() == 0.0


def test_reverse_kl_estimates_kl_of_the_student_from_the_teacher() -> None:
    """Over the student's samples the estimate averages to KL(p || q): by hand for p=[.5,.3,.2],
    q=[.2,.5,.3]: .5 ln 2.5 + .3 ln .6 + .2 ln(2/3) = 0.458145 - 0.153248 - 0.081093 = 0.223804."""
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    expected = (p * reverse_kl(p.log(), q.log())).sum().item()
    assert expected == pytest.approx(0.223804, abs=1e-6)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    sampled = mean_reverse_kl(p.log()[tokens], q.log()[tokens], torch.ones(len(tokens))).item()
    assert sampled == pytest.approx(0.223804, abs=0.01)


class StubTeacher:
    def __init__(self, table: list[list[float]]) -> None:
        self.table = table
        self.seen: list[list[int]] = []
        self.temperature: float | None = None

    async def logprobs(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[list[float]]:
        self.seen = [list(s) for s in sequences]
        self.temperature = temperature
        return self.table

    async def close(self) -> None:
        return None


def test_distill_terms_by_hand() -> None:
    sample = TrainSample(
        input_ids=[1, 2, 3, 4],
        loss_mask=[0, 0, 1, 1],
        rollout_logprobs=[0.0, 0.0, -1.0, -2.0],
        episode_id="e",
        group_id="g",
        reward=0.0,
    )
    teacher = StubTeacher([[0.0, -9.0, -1.5, -1.0]])
    adv, metrics = asyncio.run(distill_terms(teacher, [sample], coef=2.0))
    assert teacher.seen == [[1, 2, 3, 4]]
    # trained tokens: kl = -1 - (-1.5) = 0.5 and -2 - (-1) = -1; A = -2 * kl; the prompt gets 0
    assert adv == [[0.0, 0.0, -1.0, 2.0]]
    assert metrics == {"distill_kl": pytest.approx(-0.25), "distill_tokens": 2.0}
    assert teacher.temperature == 1.0
    asyncio.run(distill_terms(teacher, [sample], coef=2.0, temperature=0.7))  # --teacher-temperature reaches it
    assert teacher.temperature == 0.7


def test_a_teacher_without_prompt_logprobs_is_refused() -> None:
    good = {"choices": [{"logprobs": {"token_logprobs": [None, -1.0, -2.0, -0.1]}}]}
    assert parse_prompt_logprobs(good, 3) == [0.0, -1.0, -2.0]
    for body in ({"choices": [{"text": "x", "logprobs": None}]}, {"choices": []}, {"error": "x"}):
        with pytest.raises(TeacherError, match="no prompt logprobs"):
            parse_prompt_logprobs(body, 3)
    with pytest.raises(TeacherError, match="finite"):
        parse_prompt_logprobs({"choices": [{"logprobs": {"token_logprobs": [None, None, -1.0]}}]}, 3)


# -- the per-token advantages in the training step ------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    d: Path = build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)
    return AutoModelForCausalLM.from_pretrained(d).double()


def _samples(model) -> list[TrainSample]:
    """Two groups sharing prompts (the shared-prefix layout applies), a tool turn the loss skips;
    rollout logprobs are the model's own (on-policy: the PPO ratio is 1)."""
    prompts = [[1, 5, 6, 7], [1, 5, 9, 9, 9, 8]]
    out = []
    for i in range(6):
        g = i % 2
        rest = [20 + i, 21, 22][: 1 + i % 3] + ([40, 41, 30 + i] if g else [])
        mask = [1] * (len(rest) - 3 * g) + ([0, 0, 1] if g else [])
        ids = prompts[g] + rest
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
        full_mask = [0] * len(prompts[g]) + mask
        old = [0.0] + [v if m else 0.0 for v, m in zip(lp.tolist(), full_mask[1:])]
        out.append(TrainSample(ids, full_mask, old, f"e{i}", f"g{g}", float(i % 3 == 0)))
    return out


def _token_adv(samples: list[TrainSample]) -> list[list[float]]:
    """A distinct value on every trained token; 100 on the others (must never count)."""
    return [
        [(0.1 * (k + 1) * (j + 1)) if m else 100.0 for j, m in enumerate(s.loss_mask)] for k, s in enumerate(samples)
    ]


def _step(base, samples, config, share: bool, token_adv):
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    metrics = ps.policy_step(model, opt, samples, config, share_prefix=share, token_advantages=token_adv)
    return metrics, model


def test_token_advantages_train_the_trained_tokens_only_in_both_layouts(base) -> None:
    samples = _samples(base)
    adv = _token_adv(samples)
    config = TrainConfig(lr=1.0, reward_coef=0.0)
    (m_shared, shared), (m_plain, plain) = (_step(base, samples, config, s, adv) for s in (True, False))
    assert m_shared["shared_prefix"] == 1.0 and m_plain["shared_prefix"] == 0.0
    # on-policy, token-mean, weights 1: pg_loss = -(mean advantage over trained tokens, the first position dropped)
    trained = [a for s, row in zip(samples, adv) for a, m in zip(row[1:], s.loss_mask[1:]) if m]
    assert m_plain["pg_loss"] == pytest.approx(-sum(trained) / len(trained), rel=1e-5)
    assert m_shared["pg_loss"] == pytest.approx(m_plain["pg_loss"], rel=1e-5)
    for a, b in zip(shared.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_reward_coef_scales_the_group_advantage_and_token_terms_add_to_it(base) -> None:
    """A = reward_coef * A_group + token term: a constant token term equal to each sample's group
    advantage, with reward_coef 0, is the same update as GRPO alone."""
    samples = _samples(base)
    grpo = ps.sample_advantages(samples, TrainConfig())
    as_tokens = [[a] * len(s.input_ids) for s, a in zip(samples, grpo)]
    m_grpo, by_reward = _step(base, samples, TrainConfig(lr=1.0), False, None)
    m_tok, by_tokens = _step(base, samples, TrainConfig(lr=1.0, reward_coef=0.0), False, as_tokens)
    assert m_tok["pg_loss"] == pytest.approx(m_grpo["pg_loss"], rel=1e-6)
    for a, b in zip(by_reward.parameters(), by_tokens.parameters()):
        torch.testing.assert_close(a, b)
    m_off, _ = _step(base, samples, TrainConfig(lr=1.0, reward_coef=0.0), False, None)
    assert m_off["pg_loss"] == 0.0 and m_off["grad_norm"] == 0.0
    assert not math.isnan(m_tok["grad_norm"])
    with pytest.raises(ValueError, match="align"):
        _step(base, samples, TrainConfig(), False, as_tokens[:-1])


# -- --distill-mode full: the exact reverse KL as a loss term ----------------------------------------


def test_full_reverse_kl_by_hand() -> None:
    """KL([.5,.3,.2] || [.2,.5,.3]) = 0.223804 (by hand above); KL(p || p) = 0; one row per position."""
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    kl = full_reverse_kl(torch.stack([p.log(), q.log()]), torch.stack([q.log(), q.log()]))
    assert kl.tolist() == pytest.approx([0.223804, 0.0], abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_full_mode_loss_and_gradient_are_the_exact_reverse_kl_in_both_layouts(base, temperature: float) -> None:
    """With reward_coef 0 the step's loss is distill_coef * the token mean of KL(student || teacher)
    over the trained positions (computed here by a plain forward of each model; the teacher's logits
    divided by `teacher_temperature`), its gradient that KL's gradient, the same in the plain and
    shared-prefix layouts; a teacher equal to the student gives KL 0 and no gradient."""
    samples = _samples(base)
    teacher = copy.deepcopy(base)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))
    config = TrainConfig(lr=1.0, reward_coef=0.0, distill_coef=0.5, teacher_temperature=temperature)

    kls = []
    for s in samples:
        ids = torch.tensor([s.input_ids])
        with torch.no_grad():
            ls = torch.log_softmax(base(input_ids=ids).logits[0, :-1].double(), -1)
            lt = torch.log_softmax(teacher(input_ids=ids).logits[0, :-1].double() / temperature, -1)
        per = (ls.exp() * (ls - lt)).sum(-1)
        kls += [float(k) for k, m in zip(per, s.loss_mask[1:]) if m]
    expected = sum(kls) / len(kls)

    runs = {}
    for share in (True, False):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        runs[share] = (ps.policy_step(model, opt, samples, config, share_prefix=share, teacher=teacher), model)
    (m_shared, shared), (m_plain, plain) = runs[True], runs[False]
    assert m_shared["shared_prefix"] == 1.0 and m_plain["shared_prefix"] == 0.0
    for m in (m_plain, m_shared):
        assert m["distill_kl"] == pytest.approx(expected, rel=1e-6)
        assert m["loss"] == pytest.approx(0.5 * expected, rel=1e-6)  # the pg term is 0 with no advantage
        assert m["grad_norm"] > 0
    for a, b in zip(shared.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)

    if temperature != 1.0:
        return  # the student against itself sharpened is not KL 0
    same = ps.policy_step(
        copy.deepcopy(base), torch.optim.SGD(base.parameters(), lr=0.0), samples, config, teacher=copy.deepcopy(base)
    )
    # the step's logits are float32: 0 up to its rounding, against ~1e-2 above
    assert same["distill_kl"] == pytest.approx(0.0, abs=1e-6) and same["grad_norm"] == pytest.approx(0.0, abs=1e-5)
    assert expected > 1e-3


def test_full_mode_needs_a_local_teacher() -> None:
    from swarm.config.server import ServerConfig

    with pytest.raises(ValueError, match="local teacher"):
        ServerConfig(
            teacher="http://127.0.0.1:9/v1",
            train=TrainConfig(distill_coef=1.0, distill_mode="full"),
        )
    ok = ServerConfig(teacher="/some/model", train=TrainConfig(distill_coef=1.0, distill_mode="full"))
    assert ok.train.distill_mode == "full"


# -- --teacher-temperature: the teacher's distribution at another temperature ------------------------


def test_a_local_teacher_scores_at_its_temperature(base) -> None:
    """LocalTeacher.score(seqs, T) is log_softmax(logits / T) of each next token: a distribution
    (T = 0.5 sharpens it: the argmax token gains), and T = 1 is the plain teacher."""
    from swarm.model.teacher import LocalTeacher

    teacher = LocalTeacher.__new__(LocalTeacher)  # the model from the fixture, not loaded from a folder
    teacher.model, teacher.device, teacher.budget = base.eval(), torch.device("cpu"), 8192
    seqs = [[1, 5, 9, 2, 7], [3, 4]]
    with torch.no_grad():
        logits = base(input_ids=torch.tensor([seqs[0]])).logits[0, :-1].double()
    for t in (1.0, 0.5, 2.0):
        got = teacher.score(seqs, t)
        want = torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(seqs[0][1:]).unsqueeze(-1)).squeeze(-1)
        assert got[0][0] == 0.0 and len(got[1]) == 2
        assert got[0][1:] == pytest.approx(want.tolist(), abs=1e-5)
    top = int(logits[0].argmax())
    sharp = teacher.score([[1, top]], 0.5)[0][1]
    plain = teacher.score([[1, top]], 1.0)[0][1]
    assert sharp > plain


def test_teacher_temperature_needs_a_local_teacher() -> None:
    import asyncio

    from swarm.config.server import ServerConfig
    from swarm.model.teacher import HttpTeacher, TeacherError

    with pytest.raises(ValueError, match="local teacher"):
        ServerConfig(teacher="http://127.0.0.1:9/v1", train=TrainConfig(distill_coef=1.0, teacher_temperature=0.7))
    with pytest.raises(ValueError, match="--teacher MODEL_DIR"):
        ServerConfig(train=TrainConfig(teacher_temperature=0.7))
    with pytest.raises(ValueError, match="--distill-mode full: give --teacher MODEL_DIR"):  # accepted in silence
        ServerConfig(train=TrainConfig(distill_mode="full"))
    for bad in (0.0, -1.0, 11.0):
        with pytest.raises(ValueError, match="teacher_temperature"):
            TrainConfig(teacher_temperature=bad)
    ok = ServerConfig(teacher="/some/model", train=TrainConfig(distill_coef=1.0, teacher_temperature=0.7))
    assert ok.train.teacher_temperature == 0.7
    http = HttpTeacher("http://127.0.0.1:9", "m")
    with pytest.raises(TeacherError, match="one logprob per token"):
        asyncio.run(http.logprobs([[1, 2]], 0.7))
    asyncio.run(http.close())
