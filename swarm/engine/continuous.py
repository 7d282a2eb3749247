"""Continuous batching for a Hugging Face causal LM: many requests, one decode loop.

One worker thread owns the model during generation. Requests from any number of
episodes queue up; at every step the loop either prefills newly arrived requests
(as one left-padded batch) and splices their KV cache into the running batch, or
advances every running row by one token. Finished rows leave the batch at once,
and columns that became padding for every row are trimmed, so a long request does
not slow down the short ones that follow it.

Positions are explicit per row (count of real tokens so far), which is what makes
left padding and splicing exact for rotary models such as Qwen2.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from swarm.engine.base import SamplingParams, TokenChunk
from swarm.engine.sampling import sample_rows

Emit = Callable[[TokenChunk], None]


@dataclass
class _Row:
    prompt_ids: list[int]
    params: SamplingParams
    emit: Emit
    generator: torch.Generator | None
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    pending: int = -1  # last sampled token, not yet in the KV cache
    text_checked: int = 0


class Handle:
    """Returned by `submit`; lets the caller cancel (a disconnected stream)."""

    def __init__(self, row: _Row) -> None:
        self._row = row

    def cancel(self) -> None:
        self._row.cancelled = True


class ContinuousBatcher:
    def __init__(
        self,
        model: torch.nn.Module,
        lock: threading.Lock,
        eos_ids: set[int],
        max_positions: int,
        decode: Callable[[list[int]], str],
        vocab_size: int,
        max_batch: int = 64,
        seed: int = 0,
    ) -> None:
        self.vocab_size = vocab_size
        self.model = model
        self.lock = lock  # held per step; train_step holds it for a whole update
        self.eos_ids = eos_ids
        self.max_positions = max_positions
        self.decode = decode
        self.max_batch = max_batch
        self.shared_gen = torch.Generator().manual_seed(seed)
        self._inbox: queue.Queue[_Row] = queue.Queue()
        self._rows: list[_Row] = []
        self._cache: DynamicCache | None = None
        self._attn: torch.Tensor | None = None  # [B, L] 1 = real token in cache
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.tokens_out = 0

    # -- public -------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, emit: Emit) -> Handle:
        if not prompt_ids:
            raise ValueError("empty prompt")
        if any(not isinstance(t, int) or t < 0 or t >= self.vocab_size for t in prompt_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        if len(prompt_ids) >= self.max_positions:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds the context of {self.max_positions}")
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        row = _Row(list(prompt_ids), params, emit, gen)
        self._ensure_thread()
        self._inbox.put(row)
        return Handle(row)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def running(self) -> int:
        return len(self._rows) + self._inbox.qsize()

    # -- loop ---------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="roost-generate", daemon=True)
            self._thread.start()

    def _take_new(self) -> list[_Row]:
        new: list[_Row] = []
        if not self._rows:
            try:
                new.append(self._inbox.get(timeout=0.05))
            except queue.Empty:
                return new
        while len(self._rows) + len(new) < self.max_batch:
            try:
                new.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        return new

    def _loop(self) -> None:
        while not self._stop.is_set():
            new = self._take_new()
            if not new and not self._rows:
                continue
            try:
                with self.lock, torch.inference_mode():
                    if new:
                        self._prefill(new)
                    else:
                        self._decode()
                    self.steps += 1
            except Exception as exc:  # never let one bad batch kill the loop
                for row in new + self._rows:
                    row.emit(TokenChunk([], [], finish_reason=f"error: {exc}"))
                self._rows, self._cache, self._attn = [], None, None

    def _prefill(self, new: list[_Row]) -> None:
        new = [r for r in new if not r.cancelled]
        if not new:
            return
        width = max(len(r.prompt_ids) for r in new)
        ids = torch.zeros(len(new), width, dtype=torch.long)
        attn = torch.zeros(len(new), width, dtype=torch.long)
        for i, r in enumerate(new):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            attn[i, width - len(r.prompt_ids):] = 1
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        dev = self._device()
        cache = DynamicCache()
        out = self.model(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev),
                         past_key_values=cache, use_cache=True)
        self._splice(new, out.past_key_values, attn)
        self._sample(new, out.logits[:, -1, :], offset=len(self._rows) - len(new))

    def _decode(self) -> None:
        assert self._cache is not None and self._attn is not None
        dev = self._device()
        tokens = torch.tensor([[r.pending] for r in self._rows], dtype=torch.long, device=dev)
        pos = self._attn.sum(-1, keepdim=True).to(dev)
        attn = torch.cat([self._attn, torch.ones(len(self._rows), 1, dtype=torch.long)], dim=1)
        out = self.model(input_ids=tokens, attention_mask=attn.to(dev), position_ids=pos,
                         past_key_values=self._cache, use_cache=True)
        self._cache, self._attn = out.past_key_values, attn
        self._sample(list(self._rows), out.logits[:, -1, :], offset=0)

    def _splice(self, new: list[_Row], cache: DynamicCache, attn: torch.Tensor) -> None:
        """Append newly prefilled rows to the running batch, left-padding the shorter side."""
        if self._cache is None or not self._rows:
            self._rows, self._cache, self._attn = list(new), cache, attn
            return
        assert self._attn is not None
        old_len, new_len = self._attn.shape[1], attn.shape[1]
        width = max(old_len, new_len)
        for old_layer, new_layer in zip(self._cache.layers, cache.layers):
            old_layer.keys = _cat_left_padded(old_layer.keys, new_layer.keys, width)
            old_layer.values = _cat_left_padded(old_layer.values, new_layer.values, width)
        self._attn = torch.cat([_pad_left(self._attn, width), _pad_left(attn, width)], dim=0)
        self._rows.extend(new)

    def _sample(self, rows: list[_Row], logits: torch.Tensor, offset: int) -> None:
        temp = torch.tensor([r.params.temperature for r in rows], device=logits.device)
        top_p = torch.tensor([r.params.top_p for r in rows], device=logits.device)
        tokens, logps = sample_rows(logits, temp, top_p, [r.generator for r in rows], self.shared_gen)
        done: list[int] = []
        for i, (r, tok, lp) in enumerate(zip(rows, tokens.tolist(), logps.tolist())):
            if r.cancelled:
                done.append(offset + i)
                continue
            r.generated.append(tok)
            r.pending = tok
            self.tokens_out += 1
            reason = self._finish_reason(r, tok)
            r.emit(TokenChunk([tok], [lp], finish_reason=reason))
            if reason is not None:
                done.append(offset + i)
        if done:
            self._drop(set(done))

    def _finish_reason(self, r: _Row, tok: int) -> str | None:
        if (tok in self.eos_ids and not r.params.ignore_eos) or tok in r.params.stop_token_ids:
            return "stop"
        if r.params.stop:
            text = self.decode(r.generated)
            if any(s and s in text for s in r.params.stop):
                return "stop"
        if len(r.generated) >= r.params.max_tokens:
            return "length"
        if len(r.prompt_ids) + len(r.generated) >= self.max_positions:
            return "length"
        return None

    def _drop(self, done: set[int]) -> None:
        keep = [i for i in range(len(self._rows)) if i not in done]
        if not keep:
            self._rows, self._cache, self._attn = [], None, None
            return
        assert self._cache is not None and self._attn is not None
        index = torch.tensor(keep, dtype=torch.long)
        self._cache.batch_select_indices(index.to(self._device()))
        self._attn = self._attn[index]
        self._rows = [self._rows[i] for i in keep]
        # trim columns that are padding for every remaining row
        first = int((self._attn.sum(0) > 0).nonzero()[0])
        if first > 0:
            for layer in self._cache.layers:
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]
            self._attn = self._attn[:, first:]

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def wait_idle(self, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while self.running and time.monotonic() < end:
            time.sleep(0.01)
        return not self.running


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - t.shape[-1]
    if extra <= 0:
        return t
    return torch.cat([torch.zeros(*t.shape[:-1], extra, dtype=t.dtype, device=t.device), t], dim=-1)


def _cat_left_padded(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """Concatenate two [B, H, L, D] caches along batch after left-padding L to `width`."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        extra = width - t.shape[2]
        if extra <= 0:
            return t
        z = torch.zeros(t.shape[0], t.shape[1], extra, t.shape[3], dtype=t.dtype, device=t.device)
        return torch.cat([z, t], dim=2)

    return torch.cat([pad(a), pad(b)], dim=0)
