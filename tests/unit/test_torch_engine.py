"""The torch engine on an untrained tiny model: generation, logprobs, training, persistence."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch
from torch_helpers import chat_prompt as _prompt
from torch_helpers import generate_all as _gen

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


def test_concurrent_generation_logprobs_match_recompute(engine):
    reqs = [
        GenerateRequest(
            _prompt(engine, f"What is {i}+{i}?") + [7] * (i % 4), SamplingParams(max_tokens=24, temperature=1.0, seed=i)
        )
        for i in range(12)
    ]
    saved = engine.batcher.prefix_tokens_saved
    outs = _gen(engine, reqs)
    assert engine.batcher.prefix_tokens_saved > saved  # the chat template was prefilled once, not per row
    for o in outs:
        assert 1 <= len(o.token_ids) <= 24 and len(o.logprobs) == len(o.token_ids)
        recomputed = engine.logprobs(o.prompt_ids + o.token_ids)[len(o.prompt_ids) - 1 :]
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
    first = _gen(
        engine, [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))]
    )[0]
    tok = first.token_ids[2]
    out = _gen(
        engine,
        [
            GenerateRequest(
                _prompt(engine), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=(tok,))
            )
        ],
    )[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == tok and len(out.token_ids) <= 3
    text = engine.tokenizer.decode(first.token_ids[:3])
    if text.strip():
        out = _gen(
            engine,
            [
                GenerateRequest(
                    _prompt(engine), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop=(text[-1],))
                )
            ],
        )[0]
        assert out.finish_reason == "stop" and len(out.token_ids) <= 3


def test_bad_prompts_rejected(engine):
    with pytest.raises(ValueError):
        _gen(engine, [GenerateRequest([], SamplingParams())])
    with pytest.raises(ValueError):
        _gen(engine, [GenerateRequest([10**9], SamplingParams())])


def _samples(outs, rewards):
    return [
        TrainSample(
            o.prompt_ids + o.token_ids,
            [0] * len(o.prompt_ids) + [1] * len(o.token_ids),
            [0.0] * len(o.prompt_ids) + o.logprobs,
            f"e{i}",
            f"g{i // 4}",
            r,
        )
        for i, (o, r) in enumerate(zip(outs, rewards))
    ]


def test_train_step_moves_toward_rewarded_tokens(model_dir):
    engine = TorchEngine(model_dir, seed=1)
    try:
        reqs = [
            GenerateRequest(_prompt(engine), SamplingParams(max_tokens=6, temperature=1.0, seed=i, ignore_eos=True))
            for i in range(8)
        ]
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


def test_kl_reference_is_loaded_when_first_asked_and_is_the_starting_weights(model_dir):
    """No second copy of the model at kl_coef 0 (the 0.5B's 1.9 GB); set later, KL is to the start, not to now."""
    from transformers import AutoModelForCausalLM

    engine = TorchEngine(model_dir, seed=0, device="cpu")
    try:
        reqs = [
            GenerateRequest(_prompt(engine), SamplingParams(max_tokens=6, temperature=1.0, seed=i, ignore_eos=True))
            for i in range(8)
        ]
        samples = _samples(_gen(engine, reqs), [float(i % 2) for i in range(8)])
        engine.train_step(TrainBatch(samples, TrainConfig(lr=1e-2)))
        assert engine._reference is None  # kl_coef 0: never loaded
        m = engine.train_step(TrainBatch(samples, TrainConfig(lr=1e-2, kl_coef=0.1)))
        start = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        ref = engine.reference.state_dict()
        assert all(torch.equal(ref[k], v) for k, v in start.items())  # the weights before any step
        assert not any(p.requires_grad for p in engine.reference.parameters())
        assert m["kl_ref"] > 0  # the trained policy has moved away from it
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

    from transformers import AutoModelForCausalLM

    from swarm.engine.policy_step import policy_step

    base = AutoModelForCausalLM.from_pretrained(model_dir)

    def sample(ids, gen, reward, group="g"):
        mask = [0] * (len(ids) - gen) + [1] * gen
        return TrainSample(
            input_ids=ids,
            loss_mask=mask,
            rollout_logprobs=[0.0] * len(ids),
            episode_id=str(ids),
            group_id=group,
            reward=reward,
        )

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


# -- placement: the device/dtype/attention choice is pure, so the CUDA rules are checked on CPU ------------------


def test_placement_cpu_is_unchanged_fp32_default_attention():
    from swarm.engine.precision import choose_placement

    p = choose_placement("cpu", cuda_available=True, bf16_supported=True, cpu_count=2, env={})
    assert (p.device, p.dtype, p.attn_implementation, p.master_weights) == ("cpu", "float32", None, False)
    assert p.threads == 1 and p.fuse_pad_tokens == 32 and p.share_prefix
    assert choose_placement(None, False, False, cpu_count=8, env={}).device == "cpu"
    assert choose_placement(None, False, False, cpu_count=8, env={}).threads == 4
    assert choose_placement("cpu", False, False, cpu_count=8, env={"OMP_NUM_THREADS": "3"}).threads is None


def test_placement_cuda_bf16_sdpa_master_weights():
    from swarm.engine.precision import choose_placement

    p = choose_placement(None, cuda_available=True, bf16_supported=True)
    assert (p.device, p.dtype, p.attn_implementation, p.master_weights) == ("cuda", "bfloat16", "sdpa", True)
    assert p.torch_dtype is torch.bfloat16 and p.threads is None and p.fuse_pad_tokens > 1000
    assert not p.share_prefix  # launch-bound: the shared-prefix passes cost more than they save (docs/gpu.md)
    old_gpu = choose_placement("cuda:1", cuda_available=True, bf16_supported=False)
    assert (old_gpu.device, old_gpu.dtype, old_gpu.attn_implementation, old_gpu.master_weights) == (
        "cuda:1",
        "float32",
        "sdpa",
        False,
    )
    assert choose_placement("cuda", True, True, dtype="float32").master_weights is False
    with pytest.raises(ValueError, match="no CUDA"):
        choose_placement("cuda", cuda_available=False, bf16_supported=False)
    with pytest.raises(ValueError, match="does not support"):
        choose_placement("cuda", True, False, dtype="bfloat16")
    with pytest.raises(ValueError, match="unknown dtype"):
        choose_placement("cpu", False, False, dtype="fp8")


def test_device_problem_names_the_flag_and_the_fix():
    from swarm.engine.precision import PlacementError, device_problem

    assert issubclass(PlacementError, ValueError) and device_problem("cpu") is None
    if not torch.cuda.is_available():
        problem = device_problem("cuda:1")
        assert problem is not None and problem.startswith("--device cuda:1:") and "pass --device cpu" in problem


def test_engine_on_cpu_keeps_fp32_plain_adamw(engine):
    assert engine.placement.device == "cpu" and next(engine.model.parameters()).dtype is torch.float32
    assert type(engine.optimizer) is torch.optim.AdamW


def test_bf16_master_weights_train_save_and_resume(model_dir, tmp_path):
    """The CUDA recipe (bf16 weights, fp32 masters) run on CPU: small updates survive, resume is exact."""
    from swarm.engine.precision import MasterWeightAdamW

    a = TorchEngine(model_dir, seed=4, device="cpu", dtype="bfloat16")
    try:
        assert next(a.model.parameters()).dtype is torch.bfloat16 and isinstance(a.optimizer, MasterWeightAdamW)
        before = [m.clone() for m in a.optimizer.master]
        outs = _gen(a, [GenerateRequest(_prompt(a), SamplingParams(max_tokens=5, seed=i)) for i in range(4)])
        m = a.train_step(TrainBatch(_samples(outs, [1, 0, 1, 0]), TrainConfig(lr=1e-6)))
        assert m["skipped"] == 0.0 and m["grad_norm"] > 0
        moved = sum(int((x != y).sum()) for x, y in zip(a.optimizer.master, before))
        assert moved > 0  # an lr of 1e-6 moves fp32 masters; bf16 AdamW would round most of it away
        for p, master in zip(a.optimizer.params, a.optimizer.master):
            assert torch.equal(p, master.to(torch.bfloat16))
        a.save(tmp_path / "ckpt")
        b = TorchEngine(model_dir, seed=5, device="cpu", dtype="bfloat16")
        b.load(tmp_path / "ckpt")
        for x, y in zip(a.optimizer.master, b.optimizer.master):
            assert torch.equal(x, y)  # unrounded masters came back, not the bf16 weights
        c = TorchEngine(model_dir, seed=6, device="cpu")  # resumed in fp32: the masters become the weights
        c.load(tmp_path / "ckpt")
        for p, master in zip([p for p in c.model.parameters() if p.requires_grad], a.optimizer.master):
            assert torch.equal(p, master)
        b.batcher.close()
        c.batcher.close()
    finally:
        a.batcher.close()


# -- continuous batching: requests arriving while others decode --------------------------------------------------


def _staggered(engine, n: int, gap_s: float, max_tokens: int = 20):
    async def go():
        async def one(i):
            await asyncio.sleep(gap_s * i)
            return await engine.generate(
                GenerateRequest(
                    _prompt(engine, f"What is {i}+{2 * i}?") + [7] * (i % 3),
                    SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=100 + i),
                )
            )

        return await asyncio.gather(*(one(i) for i in range(n)))

    return asyncio.run(go())


@pytest.mark.parametrize("fuse", [0, 10**6])
def test_staggered_arrivals_logprobs_exact_and_cache_narrow(model_dir, fuse):
    """Newcomers join running rows (spliced, or fused into the decode step): logprobs stay exact."""
    engine = TorchEngine(model_dir, seed=0, device="cpu", reference=False)
    engine.batcher.fuse_pad_tokens = fuse
    try:
        outs = _staggered(engine, 10, 0.01)
        assert (engine.batcher.fused_steps > 0) is (fuse > 0)
        for o in outs:
            recomputed = engine.logprobs(o.prompt_ids + o.token_ids)[len(o.prompt_ids) - 1 :]
            assert max(abs(a - b) for a, b in zip(recomputed, o.logprobs)) < LOGPROB_TOL
        # a seeded request samples the same tokens whatever joined the batch around it
        again = _staggered(engine, 10, 0.0)
        assert [o.token_ids for o in again] == [o.token_ids for o in outs]
        assert engine.batcher.wait_idle() and engine.batcher._cache is None  # every row left, cache freed
    finally:
        engine.batcher.close()


def test_dead_columns_are_dropped(model_dir):
    """A fused step pads running rows; once the rows that needed those columns leave, the columns go."""
    engine = TorchEngine(model_dir, seed=0, device="cpu", reference=False)
    b = engine.batcher
    b.fuse_pad_tokens = 10**6
    widths: list[int] = []
    real = b._sample

    def spy(logits, offset):
        real(logits, offset)
        if b._attn is not None:
            widths.append(int(b._attn.shape[1]))

    b._sample = spy
    try:

        async def go():
            long = asyncio.create_task(
                engine.generate(
                    GenerateRequest(
                        _prompt(engine), SamplingParams(max_tokens=200, temperature=1.0, seed=1, ignore_eos=True)
                    )
                )
            )
            # the short one must arrive while the long one decodes: a fixed 50 ms sleep missed it on a loaded host
            deadline = time.monotonic() + 60
            while not any(r.generated for r in list(b._rows)):
                assert time.monotonic() < deadline, "the long request never started decoding"
                await asyncio.sleep(0.002)
            short = await engine.generate(
                GenerateRequest(
                    _prompt(engine, "What is 12+30? " * 6), SamplingParams(max_tokens=2, seed=2, ignore_eos=True)
                )
            )
            return await long, short

        long, short = asyncio.run(go())
        assert b.fused_steps >= 1 and len(long.token_ids) == 200
        # once alone again, the long row's cache is exactly its own tokens: the prompt and all generated
        # tokens but the two last (the 200th ends the row; the 199th was pending when it was sampled)
        assert widths[-1] == len(long.prompt_ids) + 198
        # while the short one ran, the batch was wider than the long row alone (one column a step from its
        # first), and the columns went when it left: the width shrank
        assert max(w - (widths[0] + i) for i, w in enumerate(widths)) > 20
        assert any(later < earlier for earlier, later in zip(widths, widths[1:], strict=False))
        recomputed = engine.logprobs(long.prompt_ids + long.token_ids)[len(long.prompt_ids) - 1 :]
        assert max(abs(x - y) for x, y in zip(recomputed, long.logprobs)) < LOGPROB_TOL
    finally:
        b.close()


def test_common_prefix_leaves_every_prompt_a_token():
    from swarm.engine.kv_layout import common_prefix as _common_prefix

    assert _common_prefix([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 5]]) == 2
    assert _common_prefix([[1, 2, 3], [1, 2, 3]]) == 2  # identical: the last token is each row's own
    assert _common_prefix([[7], [7, 8]]) == 0 and _common_prefix([[1, 2], [3, 2]]) == 0


@pytest.mark.parametrize(
    "config",
    [
        TrainConfig(lr=1e-3),
        TrainConfig(lr=1e-3, entropy_coef=0.01, kl_coef=0.1, micro_batch_tokens=64, loss_agg="seq-mean-token-mean"),
    ],
)
def test_trained_positions_head_equals_full_logits(model_dir, config, monkeypatch):
    """The LM head on trained positions only is the same update as slicing full-vocabulary logits."""
    import copy

    from transformers import AutoModelForCausalLM

    import swarm.engine.policy_step as ps

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    reference = copy.deepcopy(base).requires_grad_(False)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term is live
        for p in reference.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    samples = [
        TrainSample(
            input_ids=[1, 5, 6, 7, 8, 9][: 3 + i % 4] + [10 + i, 11],
            loss_mask=[0] * (3 + i % 4) + [1, 1],
            rollout_logprobs=[0.0] * (3 + i % 4) + [-1.0, -2.0],
            episode_id=f"e{i}",
            group_id=f"g{i // 4}",
            reward=float(i % 3 == 0),
            weight=0.5 + (i % 2),
        )
        for i in range(8)
    ]
    out = {}
    for plain in (True, False):
        monkeypatch.setattr(ps, "PLAIN_HEAD_MODELS", ps.PLAIN_HEAD_MODELS if plain else frozenset())
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
        out[plain] = (ps.policy_step(model, opt, samples, config, reference=reference, share_prefix=False), model)
    (m1, a), (m2, b) = out[True], out[False]
    for key in ("loss", "pg_loss", "entropy", "kl_ref", "grad_norm", "trained_tokens"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-7), key
    assert (m1["kl_ref"] > 0) is bool(config.kl_coef)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
