"""The vllm engine's parts that need no vLLM: the weights file, validation, finding vLLM, the config."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from swarm.config.server import ServerConfig
from swarm.config.vllm import VllmSettings
from swarm.engine.vllm.server import VllmUnavailable, find_python
from swarm.engine.vllm.stream import parse_chunk
from swarm.engine.vllm.weights import CheckpointRefused, ServingDir, layout_of, unique_state, validate, write_atomic
from swarm.server.app import make_engine


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.norm = torch.nn.LayerNorm(4)


def test_unique_state_writes_a_tied_tensor_once_and_validates(tmp_path):
    state = unique_state(Tied())
    assert set(state) == {"embed.weight", "norm.weight", "norm.bias"}
    path = write_atomic(state, tmp_path / "model.safetensors")
    assert not list(tmp_path.glob(".*tmp*"))  # the temp file was renamed, not left behind
    validate(path, layout_of(state))


def test_validate_refuses_bad_files(tmp_path):
    state = unique_state(Tied())
    layout = layout_of(state)
    good = write_atomic(state, tmp_path / "good.safetensors")
    cases = {
        "truncated": good.read_bytes()[:-7],
        "garbage": b"\x00" * 64,
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointRefused, match="not a readable"):
            validate(tmp_path / name, layout)
    with pytest.raises(CheckpointRefused, match="not a readable"):
        validate(tmp_path / "missing.safetensors", layout)
    variants = {
        "NaN": {**state, "norm.bias": torch.full((4,), math.nan)},
        "names differ": {k: v for k, v in state.items() if k != "norm.bias"},
        r"\(4,\) float16": {**state, "norm.weight": state["norm.weight"].half()},
        r"\(3,\)": {**state, "norm.weight": torch.ones(3)},
    }
    for words, bad in variants.items():
        save_file(bad, str(tmp_path / "bad.safetensors"))
        with pytest.raises(CheckpointRefused, match=words):
            validate(tmp_path / "bad.safetensors", layout)


def test_serving_dir_keeps_one_last_good_file(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    (model / "engine_state.json").write_text("{}")
    state = unique_state(Tied())
    serving = ServingDir(tmp_path / "serve", layout_of(state))
    serving.prepare(model, state)
    assert sorted(p.name for p in serving.root.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    cand = serving.write_candidate({k: v + 1 for k, v in state.items()})
    assert cand.parent != serving.root  # vLLM loads every safetensors file of the directory it is given
    serving.promote(cand)
    assert not cand.exists() and torch.equal(load_file(str(serving.good))["norm.bias"], state["norm.bias"] + 1)


def test_stream_chunks_parse_and_mismatches_are_errors():
    line = (
        'data: {"choices":[{"index":0,"text":"x","logprobs":{"token_logprobs":[-1.5,-0.25]},'
        '"finish_reason":"length","token_ids":[5,6]}]}'
    )
    chunk = parse_chunk(line)
    assert chunk.token_ids == [5, 6] and chunk.logprobs == [-1.5, -0.25] and chunk.finish_reason == "length"
    assert parse_chunk("data: [DONE]") is None and parse_chunk("") is None
    with pytest.raises(RuntimeError, match="2 tokens with 1 logprobs"):
        parse_chunk(line.replace("-1.5,-0.25", "-1.5"))


def test_a_python_without_vllm_gives_one_line_naming_the_install(tmp_path):
    no_vllm = tmp_path / "python-without-vllm"
    no_vllm.write_text("#!/bin/sh\nexit 1\n")
    no_vllm.chmod(0o755)
    with pytest.raises(VllmUnavailable) as err:
        find_python(no_vllm)
    msg = str(err.value)
    assert "\n" not in msg and "roost[vllm]" in msg and ".ci/vllm.sh" in msg and "--vllm-python" in msg
    config = ServerConfig(engine="vllm", vllm={"python": no_vllm}, out_dir=tmp_path, model_dir=tmp_path)
    with pytest.raises(SystemExit) as exit_:  # `swarm serve --engine vllm` prints this line and exits 1
        make_engine(config)
    assert str(exit_.value) == msg


def test_config_fields_reach_the_vllm_settings():
    config = ServerConfig(
        engine="vllm",
        vllm={"port": 9, "kv_cache_gb": 3, "max_model_len": 256, "args": "--dtype bfloat16 --max-num-seqs 8"},
    )
    assert config.engine == "vllm" and config.vllm.kv_cache_gb == 3
    assert VllmSettings(args="--x 'a b'").extra_args == ("--x", "a b")
    with pytest.raises(ValueError):
        ServerConfig(engine="vllm", vllm={"kv_cache_gb": 0})


def test_make_engine_gives_the_vllm_engine_the_servers_lora_and_settings(monkeypatch, tmp_path):
    """`swarm serve --engine vllm --lora-rank 8` (one policy): the wiring alone, the engine recorded
    instead of started; the engine with adapters runs against a real vLLM in test_vllm_lora.py."""
    import swarm.engine.vllm.engine as vllm_engine

    seen: dict = {}

    class Recorder:
        def __init__(self, model_dir, work_dir, **kwargs) -> None:
            seen.update(model_dir=model_dir, work_dir=work_dir, **kwargs)

    monkeypatch.setattr(vllm_engine, "VllmEngine", Recorder)
    config = ServerConfig(
        engine="vllm", lora={"rank": 8, "alpha": 16}, out_dir=tmp_path, model_dir=tmp_path, model_name="m"
    )
    assert isinstance(make_engine(config), Recorder)
    assert seen["lora"].rank == 8 and seen["lora"].alpha == 16 and seen["settings"] is config.vllm
    assert seen["work_dir"] == tmp_path / "vllm" and seen["served_name"] == config.served_model_name == "m"
