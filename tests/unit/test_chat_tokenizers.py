"""swarm/chat/tokenizers.py: a model directory's tokenizer as AutoTokenizer loads it, without torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from swarm.chat.tokenizers import load_tokenizer
from swarm.model.build import build_untrained

MESSAGES = [{"role": "user", "content": "What is 47*85?"}, {"role": "assistant", "content": "3995"}]
TOOLS = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_untrained(tmp_path_factory.mktemp("tok") / "model", seed=0)


def test_the_tokenizer_is_autotokenizers_class_tokens_and_template(model_dir: Path, tmp_path: Path) -> None:
    ours, auto = load_tokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)
    assert type(ours) is type(auto)
    for text in ("What is 47+85?", "héllo wörld 😀\n\n  tabs\tand  spaces ", "<|im_start|>user\nhi<|im_end|>\n", ""):
        assert ours.encode(text) == auto.encode(text)
        assert ours.decode(auto.encode(text)) == auto.decode(auto.encode(text))
    for kwargs in ({}, {"add_generation_prompt": True}, {"tools": TOOLS, "add_generation_prompt": True}):
        assert ours.apply_chat_template(MESSAGES, tokenize=False, **kwargs) == auto.apply_chat_template(
            MESSAGES, tokenize=False, **kwargs
        )
    assert (ours.eos_token_id, ours.pad_token_id, ours.all_special_ids) == (
        auto.eos_token_id,
        auto.pad_token_id,
        auto.all_special_ids,
    )
    ours.save_pretrained(tmp_path / "saved")  # a checkpoint's tokenizer names the class it was loaded as
    assert (
        json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())["tokenizer_class"]
        == json.loads((model_dir / "tokenizer_config.json").read_text())["tokenizer_class"]
    )


def test_it_loads_without_importing_torch(model_dir: Path) -> None:
    code = (
        "import sys; from swarm.chat.tokenizers import load_tokenizer; "
        f"tok = load_tokenizer({str(model_dir)!r}); print(type(tok).__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False", out.stdout


@pytest.mark.parametrize("named", ["NoSuchTokenizerClass", "not an identifier", None])
def test_a_class_transformers_lacks_goes_through_autotokenizer(model_dir: Path, tmp_path: Path, named) -> None:
    copy = Path(shutil.copytree(model_dir, tmp_path / "model"))
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = named
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    expected = AutoTokenizer.from_pretrained(copy)
    assert type(load_tokenizer(copy)) is type(expected)
    assert load_tokenizer(copy).encode("What is 2+2?") == expected.encode("What is 2+2?")
