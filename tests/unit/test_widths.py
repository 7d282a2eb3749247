"""swarm/model/widths.py: a decoder's projection widths from config.json agree with the layers peft targets
in the real model, and a rank past the narrowest is refused with the same reason the engine gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm.config.lora import LoraSettings
from swarm.model.widths import projection_widths, rank_problem

QWEN = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
}


def _dir(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_qwen_shapes_follow_heads_and_kv_heads():
    widths = projection_widths(QWEN)
    assert widths is not None
    assert widths["q_proj"] == (896, 896) and widths["k_proj"] == (896, 128) and widths["down_proj"] == (4864, 896)


def test_the_narrowest_target_decides(tmp_path):
    model = _dir(tmp_path, QWEN)
    assert rank_problem(model, LoraSettings(rank=128)) is None  # k_proj's 128: exactly the width is allowed
    problem = rank_problem(model, LoraSettings(rank=129))
    assert problem is not None and "LoRA rank 129" in problem and "k_proj (896 in, 128 out)" in problem
    assert "rank <= 128" in problem
    assert rank_problem(model, LoraSettings(rank=200, targets="q_proj,gate_proj")) is None  # 896 wide


@pytest.mark.parametrize(
    "config, settings",
    [
        ({**QWEN, "model_type": "gpt2"}, LoraSettings(rank=4096)),  # another architecture
        (QWEN, LoraSettings(rank=4096, targets="q_proj,lm_head")),  # a target the table does not know
        (QWEN, LoraSettings(rank=4096, targets="self_attn.k_proj")),  # a path peft matches, not a bare name
        ({"model_type": "qwen2"}, LoraSettings(rank=4096)),  # fields missing
        (QWEN, LoraSettings(rank=0)),  # full fine-tuning
    ],
)
def test_what_it_does_not_know_is_left_to_the_engine(tmp_path, config, settings):
    assert rank_problem(_dir(tmp_path, config), settings) is None


def test_no_config_is_left_to_the_engine(tmp_path):
    assert rank_problem(tmp_path, LoraSettings(rank=4096)) is None
    (tmp_path / "config.json").write_text("{not json")
    assert rank_problem(tmp_path, LoraSettings(rank=4096)) is None


def test_the_table_agrees_with_the_layers_peft_targets(tmp_path):
    """Every projection of the embedded model's shape, as peft matches them, has the table's (in, out)."""
    from transformers import AutoModelForCausalLM

    from swarm.engine.lora import targeted_layers
    from swarm.model.build import build_untrained

    model_dir = build_untrained(tmp_path / "tiny", seed=0)

    widths = projection_widths(json.loads((Path(model_dir) / "config.json").read_text()))
    assert widths is not None
    layers = targeted_layers(AutoModelForCausalLM.from_pretrained(model_dir), LoraSettings(rank=8))
    assert layers and {name: widths[name.rsplit(".", 1)[-1]] for name in layers} == layers
