"""The warm start: a short supervised pass over built-in task transcripts.

Why: RL from random weights never sees a reward. Why *short and noisy*: a model
that already solves the tasks leaves RL nothing to show. The recipe is tuned so
the result knows most answers (greedy decoding is mostly right) while sampling
at temperature 1 is often wrong: part of the transcripts carry plausible wrong
answers (near misses, non-midpoint guesses), which keeps the sampling entropy
high but leaves the right answer the most likely one. GRPO then lifts the
temperature-1 reward quickly by sharpening what the model already knows.

Loss is on assistant tokens only (content + `<|im_end|>`), and sequences are
built piece by piece exactly as the server builds prompts (rendered messages,
generated ids), so there is no tokenization drift between warm start and RL.
Deterministic: fixed seed, fixed data order, fixed thread count.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from transformers import PreTrainedTokenizerFast

from swarm.model.tokenizer import IM_END, IM_START, render_chat


@dataclass(frozen=True)
class WarmStartConfig:
    """The warm-start recipe; recorded in the model's marker file."""

    arith_examples: int = 24000
    guess_examples: int = 4000
    arith_noise: float = 0.5
    guess_noise: float = 0.4
    batch_tokens: int = 2048
    epochs: int = 1
    lr: float = 3e-3
    warmup_frac: float = 0.05
    weight_decay: float = 0.0
    threads: int = 2

    def as_dict(self) -> dict:
        return asdict(self)


Encoded = tuple[list[int], list[int]]


class _PieceEncoder:
    """Encode rendered chat pieces with a cache (the same pieces recur thousands of times)."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast):
        self.tokenizer = tokenizer
        self.cache: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        ids = self.cache.get(text)
        if ids is None:
            ids = self.cache[text] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids


def encode_transcript(encode: Callable[[str], list[int]], messages: list[dict]) -> Encoded:
    """Token ids and loss mask (1 on assistant content and its `<|im_end|>`)."""
    ids: list[int] = []
    mask: list[int] = []
    for m in messages:
        if m["role"] == "assistant":
            head = encode(f"{IM_START}assistant\n")
            body = encode(m["content"] + IM_END)
            ids += head + body
            mask += [0] * len(head) + [1] * len(body)
            tail = encode("\n")
        else:
            tail = encode(render_chat([m]))
        ids += tail
        mask += [0] * len(tail)
    while mask and mask[-1] == 0:  # nothing to learn after the last answer
        ids.pop()
        mask.pop()
    return ids, mask


def training_data(tokenizer: PreTrainedTokenizerFast, seed: int,
                  config: WarmStartConfig) -> list[list[Encoded]]:
    """Encoded transcripts bucketed by task (similar lengths pad little)."""
    from swarm.tasks import get_task

    encode = _PieceEncoder(tokenizer)
    buckets = []
    for name, size, noise in (("arith", config.arith_examples, config.arith_noise),
                              ("guess", config.guess_examples, config.guess_noise)):
        convs = get_task(name).transcripts(seed + 1000, size, noise=noise)
        buckets.append([encode_transcript(encode, c) for c in convs])
    return buckets


def make_batches(buckets: list[list[Encoded]], batch_tokens: int, rng: random.Random,
                 epochs: int = 1) -> list[list[Encoded]]:
    """Fixed-order batches of roughly `batch_tokens` padded tokens each."""
    batches: list[list[Encoded]] = []
    for _ in range(epochs):
        for bucket in buckets:
            items = list(bucket)
            rng.shuffle(items)
            longest = max(len(ids) for ids, _ in items)
            per = max(1, batch_tokens // longest)
            batches += [items[i:i + per] for i in range(0, len(items), per)]
    rng.shuffle(batches)
    return batches


def collate(batch: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, mask) in enumerate(batch):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def warm_start(model, tokenizer: PreTrainedTokenizerFast, seed: int = 0,
               config: WarmStartConfig | None = None,
               progress: Callable[[str, float], None] | None = None) -> dict:
    """Train `model` in place on noisy task transcripts; returns summary stats."""
    config = config or WarmStartConfig()
    report = progress or (lambda message, fraction: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(model, tokenizer, seed, config, report)
    finally:
        torch.set_num_threads(threads)


def _train(model, tokenizer: PreTrainedTokenizerFast, seed: int, config: WarmStartConfig,
           report: Callable[[str, float], None]) -> dict:
    torch.manual_seed(seed)
    rng = random.Random(f"warm-start:{seed}")
    report("encoding transcripts", 0.0)
    batches = make_batches(training_data(tokenizer, seed, config), config.batch_tokens, rng,
                           config.epochs)
    pad_id = tokenizer.convert_tokens_to_ids(tokenizer.pad_token)
    optim = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.98),
                              weight_decay=config.weight_decay)
    total = len(batches)
    warmup = max(1, int(total * config.warmup_frac))

    def lr_at(step: int) -> float:
        if step < warmup:
            return config.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, total - warmup)
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    started = time.monotonic()
    loss_ema = None
    for step, batch in enumerate(batches):
        for group in optim.param_groups:
            group["lr"] = lr_at(step)
        loss = model(**collate(batch, pad_id)).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        if step % 20 == 0 or step == total - 1:
            report(f"warm start step {step + 1}/{total} loss {loss_ema:.3f}", (step + 1) / total)
    model.eval()
    return {"steps": total, "final_loss": round(loss_ema or 0.0, 4),
            "train_seconds": round(time.monotonic() - started, 1)}
