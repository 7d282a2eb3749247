"""Roost's `TrainSample`s as verl's records: V1 TransferQueue records and padded DataProto.

A merged `TrainSample` is one token sequence with a loss mask. verl wants it split
into a prompt and a response (docs/verl.md, "Splitting a merged sample"): the prompt
is every token before the first trained one, the response everything after, with
`response_mask` 1 exactly on generated tokens (tool output and template tokens
between turns stay in the response with mask 0). The outcome reward sits on the
last response token and nowhere else.

Two shapes come out of one split:

* `group_records`: the V1 trainer's per-sample, unpadded records (fields + tag, key
  `{uid}_{session}_{index}`) that the rollout adapter writes to TransferQueue. One
  verl slot uid is one Roost group; one session is one episode.
* `to_dataproto`: the padded batch of verl's legacy layout (prompts left-padded,
  responses right-padded, `position_ids` counted over valid tokens), which
  `verl.trainer.ppo.core_algos` and `verl.workers.utils.padding` consume.

Roost's loss ignores `loss_mask[0]` (nothing predicts the first token), so the split
starts looking for the first trained token at position 1; the two sides then train
the same token set. verl has no per-sample loss weight: a sample with `weight != 1`
is refused rather than silently trained at weight 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from swarm.samples import TrainSample


@dataclass(frozen=True)
class Split:
    """One sample cut where verl cuts it: prompt tokens, then response tokens with their mask."""

    prompt: list[int]
    response: list[int]
    response_mask: list[int]
    rollout_logprobs: list[float]
    reward: float


def split_sample(sample: TrainSample) -> Split:
    """Prompt = tokens before the first trained token (from position 1); response = the rest."""
    n = len(sample.input_ids)
    if not (n == len(sample.loss_mask) == len(sample.rollout_logprobs)):
        raise ValueError(f"sample of episode {sample.episode_id}: ids, mask and logprobs differ in length")
    if sample.weight != 1.0:
        raise ValueError(
            f"sample of episode {sample.episode_id} has loss weight {sample.weight}; verl has no "
            "per-sample weights (turn per_episode_norm off for the verl engine)"
        )
    start = next((i for i in range(1, n) if sample.loss_mask[i]), None)
    if start is None:
        raise ValueError(f"sample of episode {sample.episode_id} has no trained token after position 0")
    return Split(
        prompt=list(sample.input_ids[:start]),
        response=list(sample.input_ids[start:]),
        response_mask=[int(bool(m)) for m in sample.loss_mask[start:]],
        rollout_logprobs=[
            float(lp) if m else 0.0 for lp, m in zip(sample.rollout_logprobs[start:], sample.loss_mask[start:])
        ],
        reward=float(sample.reward),
    )


@dataclass
class Record:
    """One V1 TransferQueue record: key, per-sample fields (1-D tensors), tag (docs/verl.md, "Records")."""

    key: str
    fields: dict[str, Any]
    tag: dict[str, Any]


def _episodes(samples: Sequence[TrainSample]) -> dict[str, dict[tuple[str, float], list[int]]]:
    """group_id -> (episode_id, reward) -> sample indices, in order of first appearance.

    An episode whose agents were scored apart (a team) is one session per reward, as
    `swarm.engine.policy_step.sample_advantages` counts it.
    """
    groups: dict[str, dict[tuple[str, float], list[int]]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group_id, {}).setdefault((s.episode_id, float(s.reward)), []).append(i)
    return groups


def group_records(
    samples: Sequence[TrainSample], uids: Sequence[str], global_steps: int
) -> tuple[list[Record], list[str]]:
    """Records of a batch of whole groups, group k under verl slot uid `uids[k]`.

    Returns the records and the uid of each group in order; `global_steps` is the
    trainer step the slot was issued at. Keys are `{uid}_{session}_{index}`: verl
    splits them on `_`, so a uid containing `_` is refused.
    """
    groups = _episodes(samples)
    if len(uids) < len(groups):
        raise ValueError(f"{len(groups)} groups but only {len(uids)} verl slot uids")
    records: list[Record] = []
    used: list[str] = []
    for uid, episodes in zip(uids, groups.values()):
        if "_" in uid or not uid:
            raise ValueError(f"verl slot uid {uid!r} must be non-empty and free of '_'")
        used.append(uid)
        for session, (_, idx) in enumerate(episodes.items()):
            for index, i in enumerate(idx):
                s = samples[i]
                sp = split_sample(s)
                P, R = len(sp.prompt), len(sp.response)
                scores = torch.zeros(R, dtype=torch.float32)
                scores[-1] = sp.reward
                version = int(s.policy_version)
                fields = {
                    "prompts": torch.tensor(sp.prompt, dtype=torch.int64),
                    "responses": torch.tensor(sp.response, dtype=torch.int64),
                    "input_ids": torch.tensor(sp.prompt + sp.response, dtype=torch.int64),
                    "attention_mask": torch.ones(P + R, dtype=torch.int64),
                    "position_ids": torch.arange(P + R, dtype=torch.int64),
                    "response_mask": torch.tensor(sp.response_mask, dtype=torch.int64),
                    "loss_mask": torch.tensor(sp.response_mask, dtype=torch.int64),
                    "rollout_log_probs": torch.tensor(sp.rollout_logprobs, dtype=torch.float32),
                    "rm_scores": scores,
                    "uid": uid,
                    "session_id": session,
                    "global_steps": int(global_steps),
                    "num_turns": torch.tensor(1, dtype=torch.int64),
                    "multi_modal_inputs": {},
                    "extra_fields": {
                        "min_global_steps": version,
                        "max_global_steps": version,
                        "episode_id": s.episode_id,
                    },
                }
                tag = {
                    "status": "success",
                    "prompt_len": P,
                    "response_len": R,
                    "seq_len": P + R,
                    "global_steps": int(global_steps),
                    "min_global_steps": version,
                    "max_global_steps": version,
                }
                records.append(Record(key=f"{uid}_{session}_{index}", fields=fields, tag=tag))
    return records, used


@dataclass
class Padded:
    """verl's padded layout (docs/verl.md, "Padded layout") as plain tensors; `to_dataproto` wraps it."""

    prompts: torch.Tensor  # (B, Pmax) left-padded
    responses: torch.Tensor  # (B, Rmax) right-padded
    input_ids: torch.Tensor  # (B, Pmax + Rmax)
    attention_mask: torch.Tensor  # (B, Pmax + Rmax)
    position_ids: torch.Tensor  # (B, Pmax + Rmax), 0-based over valid tokens, 0 on padding
    response_mask: torch.Tensor  # (B, Rmax) trained tokens
    rollout_log_probs: torch.Tensor  # (B, Rmax)
    token_level_scores: torch.Tensor  # (B, Rmax) reward at the last valid response token
    uid: np.ndarray  # (B,) object: the group id (GRPO's grouping key)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)}


def pad_samples(samples: Sequence[TrainSample], pad_token_id: int = 0) -> Padded:
    """Padded tensors of `samples`, one row per sample, grouped by `group_id`."""
    if not samples:
        raise ValueError("empty batch")
    splits = [split_sample(s) for s in samples]
    B = len(splits)
    Pm = max(len(sp.prompt) for sp in splits)
    Rm = max(len(sp.response) for sp in splits)
    prompts = torch.full((B, Pm), pad_token_id, dtype=torch.int64)
    p_attn = torch.zeros(B, Pm, dtype=torch.int64)
    responses = torch.full((B, Rm), pad_token_id, dtype=torch.int64)
    r_attn = torch.zeros(B, Rm, dtype=torch.int64)
    mask = torch.zeros(B, Rm, dtype=torch.int64)
    lp = torch.zeros(B, Rm, dtype=torch.float32)
    scores = torch.zeros(B, Rm, dtype=torch.float32)
    for b, sp in enumerate(splits):
        P, R = len(sp.prompt), len(sp.response)
        prompts[b, Pm - P :] = torch.tensor(sp.prompt)
        p_attn[b, Pm - P :] = 1
        responses[b, :R] = torch.tensor(sp.response)
        r_attn[b, :R] = 1
        mask[b, :R] = torch.tensor(sp.response_mask)
        lp[b, :R] = torch.tensor(sp.rollout_logprobs)
        scores[b, R - 1] = sp.reward
    attn = torch.cat([p_attn, r_attn], dim=1)
    # verl.utils.model.compute_position_id_with_mask: cumsum - 1, clipped at 0 on padding
    position_ids = torch.clip(torch.cumsum(attn, dim=-1) - 1, min=0, max=None)
    return Padded(
        prompts=prompts,
        responses=responses,
        input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=attn,
        position_ids=position_ids,
        response_mask=mask,
        rollout_log_probs=lp,
        token_level_scores=scores,
        uid=np.array([s.group_id for s in samples], dtype=object),
    )


def to_dataproto(samples: Sequence[TrainSample], pad_token_id: int = 0) -> Any:
    """A `verl.DataProto` of `samples` (verl must be installed: `pip install 'roost[verl]'`)."""
    from verl import DataProto  # lazy: verl is an optional extra

    padded = pad_samples(samples, pad_token_id)
    tensors = padded.tensors()
    tensors["token_level_rewards"] = padded.token_level_scores.clone()
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": padded.uid})


__all__ = ["Padded", "Record", "Split", "group_records", "pad_samples", "split_sample", "to_dataproto"]
