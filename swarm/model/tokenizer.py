r"""The embedded model's tokenizer: a small ByteLevel BPE with a ChatML template.

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
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
#: The tool-calling tags are one token each, as in Qwen2.5's vocabulary: a call is a few tokens
#: shorter and its markers are single decisions. Added, not special: decoding (with or without
#: `skip_special_tokens`) keeps them, so the server's parser still finds them in the text.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
#: Prompt plus completion tokens the embedded model takes (its `max_position_embeddings` and the
#: tokenizer's `model_max_length`): 4,096 since build 6, so agent frameworks whose system prompts
#: run to 2-3k tokens (smolagents, DSPy ReAct) fit. Qwen2's default rope has no learned position
#: table (its angles come from the position ids and `rope_theta`), so this number shapes no
#: weight: the random init, the warm start and its calibration are those of a 1,024 context.
CONTEXT_LENGTH = 4096

#: Qwen2's pre-tokenizer regex (transformers' `tokenization_qwen2.PRETOKENIZE_REGEX`).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: ChatML, Qwen style: `<|im_start|>role\ncontent<|im_end|>\n` per message and
#: `<|im_start|>assistant\n` as the generation prompt. No default system message.
#:
#: Tools follow Qwen2.5's Hermes format, shortened for a small context: with `tools=`
#: a system block lists each tool's JSON on its own line inside `<tools>…</tools>`
#: (after the caller's own system message, if it is first); an assistant message's
#: `tool_calls` render as `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`
#: (A verbatim when it is a string, as OpenAI clients send it, else as JSON), one per
#: call, after the content and a newline; consecutive `tool` messages share one `user`
#: turn as `<tool_response>\n…\n</tool_response>` blocks. The same text is what the
#: model is warm-started to produce and what `swarm.server` parses tool calls from.
TOOLS_HEADER = "# Tools\n<tools>"
TOOLS_FOOTER = '\n</tools>\nTo call a tool, answer <tool_call>\n{"name": <name>, "arguments": <json>}\n</tool_call>'
TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"

CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0) %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n' }}{%- set ns.start = 1 %}"
    "{%- endif %}"
    "{{- " + repr(TOOLS_HEADER) + " }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- " + repr(TOOLS_FOOTER) + " + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages[ns.start:] %}"
    "{%- set i = loop.index0 + ns.start %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if i == 0 or messages[i - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message['content'] or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[i + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- if message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set f = call['function'] if call.get('function') else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def tool_call_text(name: str, arguments: str | dict) -> str:
    """One call as the template renders it (and as the model is taught to write it)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args}}}{TOOL_CALL_CLOSE}'


def render_chat(messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None) -> str:
    """The template's output in plain Python: for building corpora before any tokenizer exists.

    Byte-identical to `CHAT_TEMPLATE` (a test renders both), tools and tool turns included.
    """
    parts: list[str] = []
    start = 0
    if tools:
        parts.append(f"{IM_START}system\n")
        if messages and messages[0]["role"] == "system":
            parts.append(messages[0]["content"] + "\n")
            start = 1
        parts.append(TOOLS_HEADER)
        parts += ["\n" + json.dumps(t, ensure_ascii=False) for t in tools]
        parts.append(TOOLS_FOOTER + IM_END + "\n")
    body = messages[start:]
    for i, m in enumerate(body):
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            prev = body[i - 1]["role"] if i > 0 else (messages[0]["role"] if start else None)
            if prev != "tool":
                parts.append(f"{IM_START}user")
            parts.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(body) - 1 or body[i + 1]["role"] != "tool":
                parts.append(IM_END + "\n")
            continue
        parts.append(f"{IM_START}{role}\n{content}")
        if role == "assistant":
            for k, call in enumerate(m.get("tool_calls") or []):
                f = call.get("function") or call
                if content or k:
                    parts.append("\n")
                parts.append(tool_call_text(f["name"], f["arguments"]))
        parts.append(IM_END + "\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


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
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    from transformers import PreTrainedTokenizerFast  # lazy: ~1.5 s; the template and constants need none

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=CONTEXT_LENGTH,
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
