"""On-policy distillation: a per-token advantage from a teacher's logprobs (tensors in, tensors out).

The student samples a token t; the teacher scores the same token in the same context. The
per-token reverse KL, estimated on the student's own sample,

    kl_t = log pi_student(t) - log pi_teacher(t)

is positive where the student puts more mass than the teacher would, and its expectation over
the student's samples is KL(pi_student || pi_teacher) (mode seeking: the student learns to avoid
what the teacher would not say). tinker-cookbook's on-policy distillation trains with the
advantage -coef * kl_t on each sampled token (discount 0); Roost adds it to the episode's group
advantage, so GRPO rewards can be mixed in:

    A_t = reward_coef * A_group(episode) + distill_coef * (log pi_teacher(t) - log pi_student(t))

`log pi_student(t)` is the logprob the engine recorded when it sampled t (the rollout logprob,
the same "old" logprob the PPO ratio uses), so no extra student forward is needed and the
advantage is a constant of the step, as an advantage must be.
"""

from __future__ import annotations

import torch


def reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Per-token reverse KL estimate log pi_s(t) - log pi_t(t) of the sampled tokens (any shape)."""
    return student_logp.float() - teacher_logp.float()


def distill_advantages(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """-coef * reverse KL on the student's tokens (mask 1), 0 elsewhere (prompt, tool output, padding)."""
    return torch.where(mask.bool(), -coef * reverse_kl(student_logp, teacher_logp), torch.zeros(()))


def mean_reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The token mean of the reverse KL over the student's tokens (the `distill_kl` metric); 0 with none."""
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return torch.zeros(())
    return reverse_kl(student_logp, teacher_logp)[m].sum() / n


def full_reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi_s || pi_t) at each position, from full log-distributions [..., V]: `--distill-mode full`.

    Summing over the vocabulary removes the sampled token's noise from the estimate above, at the
    cost of the teacher's whole distribution (a local teacher). Its gradient through the student's
    logits is the reverse-KL gradient itself (GKD's on-policy objective with beta = 1), so it is a
    loss term, weighted like the policy loss, not an advantage."""
    s = student_logp.float()
    return (s.exp() * (s - teacher_logp.float())).sum(-1)


__all__ = ["distill_advantages", "full_reverse_kl", "mean_reverse_kl", "reverse_kl"]
