"""Roost's TrainSamples become verl's records and padded batches exactly.

The shapes are those of docs/verl.md, "Records" and "Padded layout".
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl is not installed in this venv: run .ci/verl.sh (its own venv)")
import torch

from swarm.engine.verl.records import group_records, pad_samples, split_sample, to_dataproto
from swarm.samples import TrainSample
from tests.verl.helpers import batch


def test_split_puts_the_prompt_before_the_first_trained_token() -> None:
    s = TrainSample(
        input_ids=[5, 6, 7, 8, 9, 10, 11],
        loss_mask=[1, 0, 0, 1, 1, 0, 1],
        rollout_logprobs=[-9.0, 0, 0, -0.5, -0.25, 0, -1.0],
        episode_id="e",
        group_id="g",
        reward=1.0,
    )
    sp = split_sample(s)
    # position 0 is never trained by Roost (nothing predicts it), so it stays in the prompt
    assert sp.prompt == [5, 6, 7]
    assert sp.response == [8, 9, 10, 11]
    assert sp.response_mask == [1, 1, 0, 1]
    assert sp.rollout_logprobs == [-0.5, -0.25, 0.0, -1.0]


@pytest.mark.parametrize(
    "bad",
    [
        dict(loss_mask=[0, 0, 0]),  # nothing trained
        dict(weight=0.5),  # verl has no per-sample weight
        dict(rollout_logprobs=[0.0, -1.0]),  # lengths differ
    ],
)
def test_bad_samples_are_refused(bad: dict) -> None:
    kw = dict(
        input_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        rollout_logprobs=[0.0, -1.0, -1.0],
        episode_id="e",
        group_id="g",
        reward=1.0,
    )
    with pytest.raises(ValueError):
        split_sample(TrainSample(**{**kw, **bad}))


def test_padded_layout_is_verls() -> None:
    samples = batch(groups=2, n=3, seed=1)
    dp = to_dataproto(samples, pad_token_id=0)
    b = dp.batch
    B, Pm = b["prompts"].shape
    Rm = b["responses"].shape[1]
    assert b["input_ids"].shape == (B, Pm + Rm)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    from verl.utils.model import compute_position_id_with_mask

    assert torch.equal(b["position_ids"], compute_position_id_with_mask(b["attention_mask"]))
    for i, s in enumerate(samples):
        sp = split_sample(s)
        P, R = len(sp.prompt), len(sp.response)
        # prompts left-padded, responses right-padded; attention exactly on real tokens
        assert b["prompts"][i, Pm - P :].tolist() == sp.prompt and b["attention_mask"][i, : Pm - P].sum() == 0
        assert b["responses"][i, :R].tolist() == sp.response and b["attention_mask"][i, Pm + R :].sum() == 0
        assert b["attention_mask"][i].sum() == P + R
        # valid tokens, in order, are exactly the sample's tokens
        assert b["input_ids"][i][b["attention_mask"][i].bool()].tolist() == s.input_ids
        # response_mask is the loss mask on the response; logprobs line up token for token
        assert b["response_mask"][i, :R].tolist() == s.loss_mask[P:] and b["response_mask"][i, R:].sum() == 0
        assert b["rollout_log_probs"][i, :R].tolist() == pytest.approx(s.rollout_logprobs[P:])
        # the outcome reward sits on the last response token only
        scores = b["token_level_scores"][i]
        assert scores[R - 1] == s.reward and scores.sum() == s.reward
    assert list(dp.non_tensor_batch["uid"]) == [s.group_id for s in samples]


def test_verl_unpads_our_padded_batch_back_to_the_samples() -> None:
    """verl's own left/right -> nested conversion (what its engine consumes) recovers every sample."""
    from verl.workers.utils.padding import left_right_2_no_padding

    samples = batch(groups=2, n=3, seed=2)
    td = left_right_2_no_padding(to_dataproto(samples).batch.clone())
    ids = td["input_ids"]
    for i, s in enumerate(samples):
        assert ids[i].tolist() == s.input_ids
        assert td["position_ids"][i].tolist() == list(range(len(s.input_ids)))


def test_v1_records_match_the_padded_batch_and_verls_tensordict() -> None:
    from verl.utils import tensordict_utils as tu

    samples = batch(groups=3, n=2, seed=3, multi_sample=True)
    uids = ["a1", "b2", "c3"]
    records, used = group_records(samples, uids, global_steps=7)
    assert used == uids
    padded = pad_samples(samples)
    assert len(records) == len(samples)
    keys = [r.key for r in records]
    # one uid per group, one session per episode, one index per sample of the episode
    assert keys[:4] == ["a1_0_0", "a1_0_1", "a1_1_0", "a1_1_1"]
    td = tu.list_of_dict_to_tensordict([r.fields for r in records])
    Pm = padded.prompts.shape[1]
    for i, r in enumerate(records):  # records are in sample order here (groups contiguous)
        P, R = r.tag["prompt_len"], r.tag["response_len"]
        assert r.tag["seq_len"] == P + R and r.tag["status"] == "success" and r.tag["global_steps"] == 7
        assert td["input_ids"][i].tolist() == samples[i].input_ids
        assert td["prompts"][i].tolist() == padded.prompts[i, Pm - P :].tolist()
        assert td["responses"][i].tolist() == padded.responses[i, :R].tolist()
        assert td["response_mask"][i].tolist() == padded.response_mask[i, :R].tolist()
        assert td["rollout_log_probs"][i].tolist() == padded.rollout_log_probs[i, :R].tolist()
        assert td["rm_scores"][i].tolist() == padded.token_level_scores[i, :R].tolist()
        assert r.fields["uid"] == uids[i // 4]


def test_records_refuse_too_few_or_bad_uids() -> None:
    samples = batch(groups=2, n=2)
    with pytest.raises(ValueError, match="slot uids"):
        group_records(samples, ["only-one"], 1)
    with pytest.raises(ValueError, match="free of '_'"):
        group_records(samples, ["a_b", "c"], 1)
