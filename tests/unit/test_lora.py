"""LoRA in the torch engine (peft): parity with the merged model, a frozen base, the KL reference as the
base with adapters off, checkpoints of the adapter alone, the merged export, bad ranks refused, rank 0 as before."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch_helpers import chat_prompt as _prompt
from torch_helpers import generate_all as _gen
from transformers import AutoModelForCausalLM

from swarm.config.lora import LoraSettings
from swarm.config.server import ServerConfig
from swarm.engine import GenerateRequest, SamplingParams, TrainBatch, TrainConfig, TrainSample
from swarm.engine.lora import LoraError, adapters_off, is_peft
from swarm.engine.torch_engine import EngineError, TorchEngine
from swarm.model.build import build_untrained

PARITY_TOL = 1e-5  # fp32: base + adapter vs the same weights merged


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def _engine(model_dir: Path, rank: int = 4, **kw) -> TorchEngine:
    return TorchEngine(model_dir, seed=0, device="cpu", lora=LoraSettings(rank=rank, **kw))


def _randomize_adapter(engine: TorchEngine, seed: int = 0) -> None:
    """Non-zero adapter weights (peft starts B at zero, which would make every parity check trivial)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    engine.batcher.weights_changed()


def _base_params(engine: TorchEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.model.named_parameters() if "lora_" not in n}


def _adapter_params(engine: TorchEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.model.named_parameters() if "lora_" in n}


def _batch(engine: TorchEngine, n: int = 8) -> list[TrainSample]:
    reqs = [
        GenerateRequest(_prompt(engine, f"What is {i // 4}+1?"), SamplingParams(max_tokens=6, seed=i, ignore_eos=True))
        for i in range(n)
    ]
    outs = _gen(engine, reqs)
    return [
        TrainSample(
            o.prompt_ids + o.token_ids,
            [0] * len(o.prompt_ids) + [1] * len(o.token_ids),
            [0.0] * len(o.prompt_ids) + o.logprobs,
            f"e{i}",
            f"g{i // 4}",
            float(i % 2),
        )
        for i, o in enumerate(outs)
    ]


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


IDS = [1, 5, 9, 17, 33, 65, 129, 200, 7, 3, 12]


def test_adapter_forward_equals_merged_model(model_dir):
    engine = _engine(model_dir, rank=8)
    try:
        _randomize_adapter(engine)
        adapted = _logits(engine.network, IDS)
        merged = copy.deepcopy(engine.model).merge_and_unload()
        assert not is_peft(merged)
        assert (adapted - _logits(merged, IDS)).abs().max().item() < PARITY_TOL
        plain = AutoModelForCausalLM.from_pretrained(model_dir)
        assert (adapted - _logits(plain, IDS)).abs().max().item() > 1e-3  # the adapter does change the model
    finally:
        engine.batcher.close()


def test_train_step_leaves_base_bit_identical_and_trains_only_the_adapter(model_dir):
    engine = _engine(model_dir)
    try:
        trainable = [n for n, p in engine.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        assert sum(len(g["params"]) for g in engine.optimizer.param_groups) == len(trainable)
        base, adapter = _base_params(engine), _adapter_params(engine)
        m = engine.train_step(TrainBatch(_batch(engine), TrainConfig(lr=1e-3, kl_coef=0.1, weight_decay=0.1)))
        assert m["skipped"] == 0.0 and m["grad_norm"] > 0
        assert m["lr"] == pytest.approx(1e-3 * engine.lora.lr_scale)  # the lr used, logged
        for n, p in engine.model.named_parameters():
            if n in base:
                assert torch.equal(p, base[n]), n  # bit-identical, weight decay included
        moved = [n for n, p in engine.model.named_parameters() if n in adapter and not torch.equal(p, adapter[n])]
        assert any("lora_B" in n for n in moved)
    finally:
        engine.batcher.close()


def test_kl_reference_is_the_base_with_adapters_off(model_dir):
    import swarm.engine.policy_step as ps
    from swarm.engine.policy_step import MicroBatch

    engine = _engine(model_dir)
    try:
        assert engine.reference is engine.model  # no second copy of the weights
        _randomize_adapter(engine, seed=1)
        plain = AutoModelForCausalLM.from_pretrained(model_dir)
        with adapters_off(engine.model):
            assert (_logits(engine.network, IDS) - _logits(plain, IDS)).abs().max().item() < PARITY_TOL
        assert (_logits(engine.network, IDS) - _logits(plain, IDS)).abs().max().item() > 1e-3  # back on after
        samples = _batch(engine, 4)
        mb = MicroBatch(samples, list(range(4)), [0.0] * 4, [1.0] * 4, torch.device("cpu"))
        with torch.no_grad():
            with adapters_off(engine.reference):
                ref = ps.trained_logits(engine.reference, mb)  # the path policy_step takes (head via peft)
            assert (ref - ps.trained_logits(plain, mb)).abs().max().item() < PARITY_TOL
        m = engine.train_step(TrainBatch(samples, TrainConfig(lr=0.0, kl_coef=1.0)))
        assert m["kl_ref"] > 0  # policy (base + adapter) differs from the reference (the base)
    finally:
        engine.batcher.close()


def test_fresh_adapter_starts_at_the_base_and_its_kl_is_zero(model_dir):
    engine = _engine(model_dir)
    try:
        plain = AutoModelForCausalLM.from_pretrained(model_dir)
        assert torch.equal(_logits(engine.network, IDS), _logits(plain, IDS))  # B = 0
        m = engine.train_step(TrainBatch(_batch(engine, 4), TrainConfig(lr=1e-3, kl_coef=1.0)))
        assert m["kl_ref"] == pytest.approx(0.0, abs=1e-6) and m["kl"] == pytest.approx(0.0, abs=1e-4)
    finally:
        engine.batcher.close()


def test_generation_through_the_adapter_matches_recompute(model_dir):
    engine = _engine(model_dir)
    try:
        _randomize_adapter(engine, seed=2)
        outs = _gen(
            engine, [GenerateRequest(_prompt(engine, f"{i}?"), SamplingParams(max_tokens=8, seed=i)) for i in range(6)]
        )
        for o in outs:
            again = engine.logprobs(o.prompt_ids + o.token_ids)[len(o.prompt_ids) - 1 :]
            assert max(abs(a - b) for a, b in zip(again, o.logprobs)) < 1e-4
    finally:
        engine.batcher.close()


def test_shared_prefix_forward_through_peft_equals_plain(model_dir):
    """`_head_and_base` finds the head and transformer inside the peft wrapper: the shared-prefix step is taken
    and gives the plain forward's gradient (float64, SGD at lr 1: parameters move by exactly -grad), KL to the
    base with adapters off included."""
    import swarm.engine.policy_step as ps
    from swarm.engine.lora import attach

    base = attach(AutoModelForCausalLM.from_pretrained(model_dir).double(), LoraSettings(rank=4), model_dir)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.05)
    prompts = [[1, 5, 9, 17, 33, 65], [1, 5, 9, 40, 41]]
    samples = [
        TrainSample(
            prompts[i // 4] + [100 + i, 101, 102 + i % 2],
            [0] * len(prompts[i // 4]) + [1, 1, 1],
            [0.0] * len(prompts[i // 4]) + [-1.0, -2.0, -1.5],
            f"e{i}",
            f"g{i // 4}",
            float(i % 3 == 0),
        )
        for i in range(8)
    ]
    config = TrainConfig(lr=1.0, kl_coef=0.1)
    out = {}
    for share in (True, False):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
        out[share] = (ps.policy_step(model, opt, samples, config, reference=model, share_prefix=share), model)
    (m_shared, shared), (m_plain, plain) = out[True], out[False]
    assert m_shared["shared_prefix"] == 1.0 and m_plain["shared_prefix"] == 0.0 and m_plain["kl_ref"] > 0
    for key in ("loss", "kl_ref", "grad_norm"):
        assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-6, abs=1e-9), key
    start = dict(base.named_parameters())
    num = den = 0.0
    with torch.no_grad():
        for (name, p), q in zip(shared.named_parameters(), plain.parameters()):
            num += float(((p - q) ** 2).sum())
            den += float(((q - start[name]) ** 2).sum())
    assert den > 0 and (num / den) ** 0.5 < 1e-6


def test_bf16_base_keeps_fp32_adapter_without_master_copies(model_dir):
    """The GPU recipe run on CPU: a bf16 base, peft's fp32 adapter trained by plain AdamW (no fp32 masters
    of the frozen base), generation through both dtypes, the base untouched."""
    engine = TorchEngine(model_dir, seed=0, device="cpu", dtype="bfloat16", lora=LoraSettings(rank=4))
    try:
        dtypes = {n: p.dtype for n, p in engine.model.named_parameters()}
        assert all(d is torch.float32 for n, d in dtypes.items() if "lora_" in n)
        assert all(d is torch.bfloat16 for n, d in dtypes.items() if "lora_" not in n)
        assert type(engine.optimizer) is torch.optim.AdamW
        base = _base_params(engine)
        m = engine.train_step(TrainBatch(_batch(engine, 4), TrainConfig(lr=1e-3, kl_coef=0.1)))
        assert m["skipped"] == 0.0 and m["grad_norm"] > 0
        assert all(torch.equal(p, base[n]) for n, p in engine.model.named_parameters() if n in base)
    finally:
        engine.batcher.close()


def test_save_load_round_trip_restores_adapter_and_optimizer(model_dir, tmp_path):
    a = _engine(model_dir)
    b = c = None
    try:
        for _ in range(2):
            a.train_step(TrainBatch(_batch(a, 4), TrainConfig(lr=1e-3)))
        a.save(tmp_path / "ckpt")
        names = {p.name for p in (tmp_path / "ckpt").iterdir()}
        assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "engine_state.json"} <= names
        assert "model.safetensors" not in names and "config.json" not in names  # the base is not copied
        state = json.loads((tmp_path / "ckpt" / "engine_state.json").read_text())
        assert Path(state["base_model"]) == model_dir.resolve() and state["lora"]["rank"] == 4
        b = _engine(model_dir)
        b.load(tmp_path / "ckpt")
        assert b.policy_version == a.policy_version == 2
        for (n1, p1), (n2, p2) in zip(_adapter_params(a).items(), _adapter_params(b).items()):
            assert n1 == n2 and torch.equal(p1, p2)
        sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)
        samples = _batch(a, 4)  # the next step is the same on both: resume is exact
        a.train_step(TrainBatch(samples, TrainConfig(lr=1e-3)))
        b.train_step(TrainBatch(samples, TrainConfig(lr=1e-3)))
        for (n1, p1), (_, p2) in zip(_adapter_params(a).items(), _adapter_params(b).items()):
            assert torch.equal(p1, p2), n1
        c = _engine(model_dir, rank=8)
        with pytest.raises(EngineError, match="rank-4 adapter"):
            c.load(tmp_path / "ckpt")
        full = TorchEngine(model_dir, seed=0, device="cpu", reference=False)
        with pytest.raises(EngineError, match="LoRA adapter"):
            full.load(tmp_path / "ckpt")
        full.batcher.close()
        with pytest.raises(FileNotFoundError, match="LoRA adapter checkpoint"):
            TorchEngine(tmp_path / "ckpt", device="cpu")
    finally:
        for e in (a, b, c):
            if e is not None:
                e.batcher.close()


def test_export_merge_writes_a_model_transformers_loads_with_equal_logits(model_dir, tmp_path):
    from swarm.model.adapter import load_causal_lm
    from swarm.model.export import EXPORT_FILE, export_merged

    engine = _engine(model_dir)
    try:
        _randomize_adapter(engine, seed=4)
        engine.save(tmp_path / "ckpt")
        adapted = _logits(engine.network, IDS)
    finally:
        engine.batcher.close()
    out = export_merged(tmp_path / "ckpt", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert (_logits(merged, IDS) - adapted).abs().max().item() < PARITY_TOL
    assert (out / "tokenizer_config.json").is_file() and json.loads((out / EXPORT_FILE).read_text())["lora_rank"] == 4
    assert (_logits(load_causal_lm(tmp_path / "ckpt"), IDS) - adapted).abs().max().item() < PARITY_TOL  # eval's path
    with pytest.raises(FileExistsError):
        export_merged(tmp_path / "ckpt", out)


def test_eval_scores_an_adapter_checkpoint(model_dir, tmp_path):
    from swarm.model.evaluate import evaluate

    engine = _engine(model_dir)
    try:
        engine.save(tmp_path / "ckpt")
    finally:
        engine.batcher.close()
    result = evaluate(tmp_path / "ckpt", "arith", n=4, temperature=0.0)
    assert result["n"] == 4 and 0.0 <= result["mean_reward"] <= 1.0


def test_rank_larger_than_a_layer_is_refused_with_the_reason(model_dir):
    with pytest.raises(LoraError, match=r"LoRA rank 129 is larger than the width of target layer .*128 in"):
        _engine(model_dir, rank=129)
    with pytest.raises(LoraError, match="LoRA targets"):
        _engine(model_dir, targets="no_such_proj")
    _engine(model_dir, rank=128, targets="q_proj").batcher.close()  # exactly the width: allowed


def test_a_rank_past_the_width_is_refused_before_peft_wraps_anything(model_dir):
    """With the default targets ("all-linear", a shorthand peft expands itself) the widths are read
    before peft allocates: `--lora-rank 100000` was refused only after ~4 GB and seconds of adapter,
    with the base model's layers already wrapped in place. Now nothing is allocated or wrapped."""
    from swarm.engine.lora import attach, targeted_layers

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    layers = targeted_layers(model, LoraSettings(rank=8))
    names = {name.rsplit(".", 1)[-1] for name in layers}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(layers) == 7 * model.config.num_hidden_layers  # every layer's, the output head not among them
    before = {name: type(m) for name, m in model.named_modules()}
    with pytest.raises(LoraError, match="LoRA rank 100000 is larger than the width"):
        attach(model, LoraSettings(rank=100_000), model_dir)
    assert {name: type(m) for name, m in model.named_modules()} == before  # untouched
    wrapped = attach(model, LoraSettings(rank=8), model_dir)
    assert set(targeted_layers(wrapped, LoraSettings(rank=8))) == {f"base_model.model.{n}" for n in layers}


def test_rank_zero_is_full_fine_tuning_as_before(model_dir, tmp_path):
    engine = TorchEngine(model_dir, seed=0, device="cpu")
    try:
        assert engine.lora.rank == 0 and not is_peft(engine.model) and engine.network is engine.model
        assert engine._reference is None  # full fine-tuning: no frozen copy until a step sets kl_coef
        assert engine.reference is not engine.model and not is_peft(engine.reference)
        params = list(engine.model.parameters())
        assert all(p.requires_grad for p in params) and type(engine.optimizer) is torch.optim.AdamW
        assert len(engine.optimizer.param_groups[0]["params"]) == len(params)
        m = engine.train_step(TrainBatch(_batch(engine, 4), TrainConfig(lr=1e-3)))
        assert m["lr"] == 1e-3  # no scaling without an adapter
        engine.save(tmp_path / "full")
        assert (tmp_path / "full" / "model.safetensors").is_file()
        assert not (tmp_path / "full" / "adapter_config.json").exists()
    finally:
        engine.batcher.close()


def test_config_fields_flags_and_knobs():
    from swarm.config.options import leaves

    by_path = {leaf.path: leaf for leaf in leaves(ServerConfig)}
    for field in ("rank", "alpha", "targets", "dropout", "lr_scale"):
        leaf = by_path["lora", field]
        assert leaf.option == "--lora-" + field.replace("_", "-") and leaf.knob == "lora_" + field
    assert ServerConfig().lora == LoraSettings() and LoraSettings().rank == 0
    cfg = ServerConfig.model_validate({"lora": {"rank": 8, "targets": " q_proj , v_proj "}})
    assert cfg.lora.target_modules == ["q_proj", "v_proj"] and LoraSettings().target_modules == "all-linear"
    assert ServerConfig.model_validate({"engine": "vllm", "lora": {"rank": 8}}).lora.rank == 8  # adapter-only sync
    with pytest.raises(ValueError, match="rank at most 512"):
        ServerConfig.model_validate({"engine": "vllm", "lora": {"rank": 513}})
    with pytest.raises(ValueError, match="not --engine verl"):
        ServerConfig.model_validate({"engine": "verl", "lora": {"rank": 8}})
    for bad in ({"rank": -1}, {"alpha": 0}, {"dropout": 1.0}, {"targets": ""}, {"targets": "all-linear,q_proj"}):
        with pytest.raises(ValueError):
            LoraSettings.model_validate(bad)


def test_a_policys_lora_fields_add_to_the_servers():
    """`lora: {alpha: 32}` replaced the server's settings whole: a rank-0 (full-parameter) policy, refused as
    such (`swarm ctl policy add foo lora_alpha=32`), and `lora: {rank: 4}` dropped the server's alpha."""
    from swarm.config.policies import PolicySpec

    cfg = ServerConfig(
        engine="fake", lora=LoraSettings(rank=8, alpha=32.0), policies=[PolicySpec(name="p", lora={"rank": 4})]
    )
    assert cfg.for_policy(cfg.policies[0]).lora == LoraSettings(rank=4, alpha=32.0)
    alone = PolicySpec.model_validate({"name": "q", "lora": {"alpha": 64}})
    assert cfg.policy_lora(alone) == LoraSettings(rank=8, alpha=64.0)
    torch_cfg = dict(engine="torch", lora=LoraSettings(rank=8))
    ServerConfig(**torch_cfg, policies=[alone])  # was "a full-parameter policy would change the base"
    with pytest.raises(ValueError, match="full-parameter policy"):
        ServerConfig(**torch_cfg, policies=[PolicySpec.model_validate({"name": "f", "lora": {"rank": 0}})])
