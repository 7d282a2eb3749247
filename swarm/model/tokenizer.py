"""The embedded model's tokenizer: a small ByteLevel BPE with a ChatML template.

Why build our own: no hub downloads are allowed, and a 151k-entry vocabulary
would make a 1M-parameter model slow. Digits are split one per token before BPE
runs (the `\p{N}` branch of the pre-tokenizer regex: the effect of
`Digits(individual_digits=True)`), so "47" and "74" share their pieces and
arithmetic is learnable by a tiny model.

The normalizer and pre-tokenizer are exactly Qwen2's, on purpose: transformers
5 loads any `qwen2` checkpoint with `Qwen2Tokenizer`, which rebuilds the
pre-tokenizer from its own regex and ignores the one in `tokenizer.json`. Using
the same one here makes the tokenizer we train, `AutoTokenizer`, vLLM and older
transformers (which read `tokenizer.json` as is) encode every string alike.

The chat template is a standard Hugging Face Jinja template (Qwen's ChatML
without a default system prompt, to keep prompts short), so
`tokenizer.apply_chat_template(messages, add_generation_prompt=True)` works
unchanged in the server, vLLM and user code.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

#: Qwen2's pre-tokenizer regex (transformers' `tokenization_qwen2.PRETOKENIZE_REGEX`).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: ChatML, Qwen style: `<|im_start|>role\ncontent<|im_end|>\n` per message and
#: `<|im_start|>assistant\n` as the generation prompt. No default system message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def render_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The template's output in plain Python: for building corpora before any tokenizer exists."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    if add_generation_prompt:
        text += f"{IM_START}assistant\n"
    return text


def build_tokenizer(corpus: list[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a ByteLevel BPE on `corpus` and wrap it for `transformers`.

    Deterministic: the same corpus (same order) and vocab size give the same
    vocabulary and merges. The vocabulary may come out smaller than `vocab_size`
    when the corpus has fewer frequent pairs; use `len(tokenizer)` for the model.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """`save_pretrained`, declaring `Qwen2Tokenizer` so every transformers version
    (4.x reads `tokenizer.json` through `Qwen2TokenizerFast`) loads the same tokenizer."""
    tokenizer.save_pretrained(out_dir)
    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
