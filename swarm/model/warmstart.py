"""The warm start: a short supervised pass over built-in task transcripts.

Why: RL from random weights never sees a reward. Why *calibrated*: a model that
already solves the tasks when sampled leaves RL nothing to show. The recipe:

* ~2,100 small steps (lr 1e-3, one thread, about two minutes): `arith` transcripts
  with 15% near-miss answers, and `guess` games where 70% of the guesses are any number still consistent with
  the feedback rather than the midpoint (the best guess stays the most likely,
  but sampling wanders and needs more turns);
* `calc` tool-calling episodes rendered with their tools, trained through logits scaled about
  as the calibration will scale them (`calc_train_scale`), so that its calls stay well formed
  when sampled;
* then every logit is scaled down (`calibrate_logit_scale`) until sampling at
  temperature 1 earns about 0.25 on held-out `arith` problems. Greedy decoding
  is unchanged, so the model "knows" far more than its sampling shows, and
  GRPO lifts the temperature-1 reward quickly by sharpening.

Loss is on assistant tokens only (content, tool-call text + `<|im_end|>`), and sequences are
built piece by piece exactly as the server builds prompts (rendered messages,
generated ids), so there is no tokenization drift between warm start and RL.
Deterministic: fixed seed, fixed data order, fixed thread count.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerFast

from swarm.model.recipe import WarmStartConfig
from swarm.model.tokenizer import IM_START, render_chat
from swarm.tasks import get_task

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


def encode_transcript(
    encode: Callable[[str], list[int]], messages: list[dict], tools: list[dict] | None = None
) -> Encoded:
    """Token ids and loss mask (1 on what the assistant generates: its content, its tool-call
    text as the template renders it, and `<|im_end|>`).

    Pieces are what the server tokenizes separately: the prompt (the `tools` system block,
    user turns, a run of `tool` messages as the one user turn the template makes of them,
    each assistant header), and each completion. Every boundary touches a special token,
    so the pieces concatenate to the ids of the whole rendering (a test checks it).
    """
    ids: list[int] = []
    mask: list[int] = []

    def add(text: str, learn: int) -> None:
        piece = encode(text)
        ids.extend(piece)
        mask.extend([learn] * len(piece))

    i = 0
    if tools:  # the system block; a leading system message is rendered inside it
        i = 1 if messages and messages[0]["role"] == "system" else 0
        add(render_chat(messages[:i], tools=tools), 0)
    head = f"{IM_START}assistant\n"
    while i < len(messages):
        m = messages[i]
        if m["role"] == "assistant":
            text = render_chat([m])  # head + content/tool calls + <|im_end|> + "\n"
            add(head, 0)
            add(text[len(head) : -1], 1)
            add("\n", 0)
            i += 1
        elif m["role"] == "tool":
            j = i
            while j < len(messages) and messages[j]["role"] == "tool":
                j += 1
            add(render_chat(messages[i:j]), 0)
            i = j
        else:
            add(render_chat([m]), 0)
            i += 1
    while mask and mask[-1] == 0:  # nothing to learn after the last answer
        ids.pop()
        mask.pop()
    return ids, mask


def training_data(tokenizer: PreTrainedTokenizerFast, seed: int, config: WarmStartConfig) -> list[list[Encoded]]:
    """Encoded transcripts bucketed by task (similar lengths pad little)."""
    encode = _PieceEncoder(tokenizer)
    buckets = []
    for name, size, noise, *_ in config.parts():
        task = get_task(name)
        convs = task.transcripts(seed + 1000, size, noise=noise)
        buckets.append([encode_transcript(encode, c, task.tools) for c in convs])
    return buckets


def make_batches(
    buckets: list[list[Encoded]], sizes: list[int], rng: random.Random, epochs: int = 1
) -> list[tuple[int, list[Encoded]]]:
    """Fixed-order batches: each bucket cut into batches of its size, all shuffled together;
    each batch comes with the index of its bucket."""
    batches: list[tuple[int, list[Encoded]]] = []
    for _ in range(epochs):
        for k, (bucket, per) in enumerate(zip(buckets, sizes)):
            items = list(bucket)
            rng.shuffle(items)
            batches += [(k, items[i : i + per]) for i in range(0, len(items), per)]
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


def warm_start(
    model,
    tokenizer: PreTrainedTokenizerFast,
    seed: int = 0,
    config: WarmStartConfig | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> dict:
    """Train `model` in place on noisy task transcripts; returns summary stats."""
    config = config or WarmStartConfig()
    report = progress or (lambda message, fraction: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(model, tokenizer, seed, config, report)
    finally:
        torch.set_num_threads(threads)


def _train(
    model, tokenizer: PreTrainedTokenizerFast, seed: int, config: WarmStartConfig, report: Callable[[str, float], None]
) -> dict:
    torch.manual_seed(seed)
    rng = random.Random(f"warm-start:{seed}")
    report("encoding transcripts", 0.0)
    parts = config.parts()
    batches = make_batches(training_data(tokenizer, seed, config), [p[3] for p in parts], rng, config.epochs)
    pad_id = tokenizer.convert_tokens_to_ids(tokenizer.pad_token)
    optim = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=config.weight_decay)
    total = len(batches)
    warmup = max(1, int(total * config.warmup_frac))

    # Not swarm.algorithms.schedule.lr_at: that warmup reaches the peak one step later and its decay
    # spans a fixed count. This one builds the embedded model, whose weights every figure in docs/
    # was measured on; the same floats must come out of a rebuild, so its schedule stays as it was.
    def lr_at(step: int) -> float:
        if step < warmup:
            return config.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, total - warmup)
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    started = time.monotonic()
    loss_ema = None
    for step, (part, batch) in enumerate(batches):
        for group in optim.param_groups:
            group["lr"] = lr_at(step)
        loss = _loss(model, collate(batch, pad_id), parts[part][4])
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        if step % 20 == 0 or step == total - 1:
            report(f"warm start step {step + 1}/{total} loss {loss_ema:.3f}", (step + 1) / total)
    model.eval()
    stats = {
        "steps": total,
        "final_loss": round(loss_ema or 0.0, 4),
        "train_seconds": round(time.monotonic() - started, 1),
    }
    if config.target_arith_reward is not None:
        report("calibrating sampling entropy", 1.0)
        stats.update(calibrate_logit_scale(model, tokenizer, config.target_arith_reward, seed, config.min_logit_scale))
    return stats


def _loss(model, batch: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """Next-token cross-entropy on the labelled tokens, through logits multiplied by `scale`,
    divided by `scale` so that its gradients are as large as unscaled training's."""
    if scale == 1.0:
        return model(**batch).loss
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = torch.nn.functional.cross_entropy(
        (logits[:, :-1] * scale).flatten(0, 1).float(), batch["labels"][:, 1:].flatten(), ignore_index=-100
    )
    return loss / scale


def answer_probabilities(
    model, tokenizer: PreTrainedTokenizerFast, seed: int, n: int = 256
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced logits of held-out `arith` answers (content + `<|im_end|>`).

    Returns (logits [n, T, V] at the answer positions, target ids [n, T], mask [n, T]).
    Digits are single tokens, so an answer has one tokenization and the probability of
    its ids under temperature-1 sampling is the expected exact-match reward.
    """
    encode = _PieceEncoder(tokenizer)
    convs = get_task("arith").transcripts(seed + 2000, n, noise=0.0)
    batch = collate([encode_transcript(encode, c) for c in convs], tokenizer.convert_tokens_to_ids(tokenizer.pad_token))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    return logits, labels.clamp(min=0), mask


def expected_reward(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, scale: float) -> float:
    logp = torch.log_softmax(logits * scale, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return (logp * mask).sum(dim=1).exp().mean().item()


def calibrate_logit_scale(
    model, tokenizer: PreTrainedTokenizerFast, target: float, seed: int, min_scale: float = 0.3
) -> dict:
    """Scale the logits so that temperature-1 `arith` sampling earns about `target`.

    Scaling the final RMSNorm weight by s multiplies every logit by s (the tied
    `lm_head` has no bias): temperature-1 sampling from the result is the trained
    model at temperature 1/s, and the argmax (greedy) is untouched. Chosen on a
    grid, deterministically; an undertrained model below the target keeps s = 1.
    """
    logits, labels, mask = answer_probabilities(model, tokenizer, seed)
    before = expected_reward(logits, labels, mask, 1.0)
    grid = [round(1.0 - i * 0.01, 2) for i in range(int(round((1.0 - min_scale) / 0.01)) + 1)]
    scale = 1.0
    if before > target:
        scale = min(grid, key=lambda s: abs(expected_reward(logits, labels, mask, s) - target))
        with torch.no_grad():
            model.model.norm.weight.mul_(scale)
    return {
        "logit_scale": scale,
        "arith_expected_reward_unscaled": round(before, 4),
        "arith_expected_reward": round(expected_reward(logits, labels, mask, scale), 4),
    }
