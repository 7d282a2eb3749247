"""Continuous batching for a Hugging Face causal LM: many requests, one decode loop.

One worker thread owns the model during generation. Requests from any number of
episodes queue up; every loop turn is ONE forward pass over every running row:

* nothing new arrived: a decode step, one token per running row;
* new requests arrived: a fused step. The new rows join the batch with an empty
  (masked) KV cache, their left-padded prompts are the step's input, and each
  running row feeds its one pending token in the step's last column (its other
  columns are masked padding). Prefill and decode share the forward, so requests
  trickling in from many episodes do not stall the running ones for a pass of
  their own. The price is rows x (prompt width - 1) dead positions; past
  `fuse_pad_tokens` of them the newcomers are prefilled on their own and spliced
  in instead (on a CPU, where every position costs compute, that is almost
  always; on a GPU, where a forward costs its launch overhead, almost never).

A prefill whose prompts share a prefix (the chat template, a system prompt) of at
least `min_shared_prefix` tokens computes that prefix once and copies its KV cache
to every row. A whole prompt seen before with the same weights (a GRPO group's
shared first turn, `swarm.engine.prompt_cache`) is not prefilled again at all.

Finished rows leave the batch at once, and columns that are padding for every
remaining row are dropped (wherever they are: masked columns carry nothing, and
positions are explicit per row), so the cache stays as narrow as the live rows.
Positions are the count of real tokens so far, which is what makes left padding,
splicing and column drops exact for rotary models such as Qwen2.

Per-token host work is kept off the hot path: pending tokens stay on the device,
sampling knobs are tensors rebuilt only when rows join or leave, and the chunks
of one step reach each event loop in a single `call_soon_threadsafe`.

Two per-row extras cost nothing unless a running row asks (flags of the knobs, on the host):
`top_logprobs = k` is one `topk` of the raw log-softmax per step; a `response_format` row
carries an llguidance matcher (`swarm.engine.constrained`): its token mask is filled before
sampling, it consumes the sampled token, EOS only where the grammar accepts. Recorded logprobs
(and top-k) stay raw and unmasked: what the trainer recomputes, so the PPO ratio is exactly 1
on-policy; the grammar is part of the environment the policy acts in, not of the policy.

Several LoRA policies on one shared base share the batch too: a row may name its adapter, and
every forward runs inside `adapter_scope(names)` (peft's per-row `adapter_names`: each LoRA layer
adds each row's own adapter), so rows of different policies prefill and decode together. Whatever
is shared between rows is shared only within one adapter: a cached or twin prompt's prefill is
keyed by (adapter, prompt), a shared prefix is computed once only when all the rows of a prefill
use the same adapter, and one adapter's training step drops only its own cached prefills. Without
adapter names no scope is entered at all: one model, as before.

What a row is and when it ends live in `swarm.engine.batch_rows`; how a batch's KV cache is laid out
(padding, splicing, joining, dropping rows and columns) in `swarm.engine.kv_layout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from transformers import DynamicCache

from swarm.engine.base import SamplingParams, TokenChunk, UnsupportedRequest
from swarm.engine.batch_rows import Emit, Ends, Handle, Outbox, Row, append_tokens
from swarm.engine.constrained import Grammars
from swarm.engine.kv_layout import (
    cache_kwargs,
    common_prefix,
    fused_inputs,
    left_padded,
    repeat_row,
    returned_cache,
    select_rows,
    splice_rows,
)
from swarm.engine.prompt_cache import PromptCache, split_rows, stack
from swarm.engine.sampling import RowKnobs, sample_rows

#: enters per-row adapters for the forwards inside it: one adapter name per row of the batch
AdapterScope = Callable[[list[str]], AbstractContextManager[Any]]
#: peft's name for a row without an adapter (the base model) in a batch that names adapters
BASE_ADAPTER = "__base__"


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
        fuse_pad_tokens: int = 32,
        min_shared_prefix: int = 4,
        grammars: Grammars | None = None,
        prompt_cache_tokens: int = 16384,
        gather_s: float = 0.003,
        gather_max_s: float = 0.02,
        adapter_scope: AdapterScope | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.grammars = grammars  # compiles response_formats; None: constrained requests are refused
        self.model = model
        #: rows that name adapters run every forward inside `adapter_scope(names)` (None: rows may not)
        self.adapter_scope = adapter_scope
        self.lock = lock  # held per step; train_step holds it for a whole update
        self.eos_ids = eos_ids
        self.max_positions = max_positions
        self.decode = decode
        self.max_batch = max_batch
        self.fuse_pad_tokens = fuse_pad_tokens
        self.min_shared_prefix = min_shared_prefix
        self.shared_gen = torch.Generator().manual_seed(seed)
        self.gather_s, self.gather_max_s = gather_s, gather_max_s  # an idle engine's wait for a burst's rest
        self._inbox: queue.Queue[Row] = queue.Queue()
        self._rows: list[Row] = []
        self._cache: DynamicCache | None = None
        self._attn: torch.Tensor | None = None  # [B, L] on the device; 1 = real token in cache
        self._pending: torch.Tensor | None = None  # [B] last sampled tokens, not yet in the cache
        self._knobs: RowKnobs | None = None
        self._out = Outbox()  # this step's chunks, handed over once per event loop after the step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.fused_steps = 0  # steps that prefilled new rows while decoding running ones
        self.tokens_out = 0
        self.prefix_tokens_saved = 0  # prompt positions not recomputed thanks to a shared prefix
        self.prompts = PromptCache(prompt_cache_tokens)  # whole prompts prefilled with these weights
        self.reuse_prompts = True  # False: every row prefilled on its own (benchmarks compare)
        self.prompts_reused = 0  # rows that took a prompt's prefill from the cache or a twin in the batch
        self.busy_s = 0.0  # time spent in forward passes and sampling (the engine's own generation time)

    # -- public -------------------------------------------------------------
    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        emit: Emit,
        loop: asyncio.AbstractEventLoop | None = None,
        matcher: Any = None,
        adapter: str | None = None,
    ) -> Handle:
        """Queue a request. `emit` gets its chunks: on `loop` when given (batched per step), else in the worker.

        A `params.response_format` is compiled here unless the caller passes its `matcher`
        (the torch engine compiles off its event loop); `UnsupportedRequest` when it cannot be.
        `adapter` names the LoRA adapter the row generates with (needs an `adapter_scope`); a row
        without one beside rows with one runs the base model (peft's "__base__").
        """
        if not prompt_ids:
            raise ValueError("empty prompt")
        if any(not isinstance(t, int) or t < 0 or t >= self.vocab_size for t in prompt_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        if len(prompt_ids) >= self.max_positions:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds the context of {self.max_positions}")
        if adapter is not None and self.adapter_scope is None:
            raise ValueError(f"adapter {adapter!r} requested, but this batcher has no adapter_scope")
        if matcher is None and params.response_format is not None:
            matcher = self.compile(params.response_format)
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        row = Row(list(prompt_ids), params, emit, gen, loop, matcher=matcher, adapter=adapter)
        self._ensure_thread()
        self._inbox.put(row)
        return Handle(row)

    def compile(self, response_format: str) -> Any:
        """A matcher for `response_format` (None: unconstrained); `UnsupportedRequest` when impossible."""
        if self.grammars is None:
            raise UnsupportedRequest(
                "unsupported_response_format", "this engine was built without constrained decoding"
            )
        return self.grammars.matcher(response_format)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def running(self) -> int:
        return len(self._rows) + self._inbox.qsize()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while self.running and time.monotonic() < end:
            time.sleep(0.01)
        return not self.running

    # -- loop ---------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="roost-generate", daemon=True)
            self._thread.start()

    def _take_new(self) -> list[Row]:
        new: list[Row] = []
        if not self._rows:
            try:
                new.append(self._inbox.get(timeout=0.05))
            except queue.Empty:
                return new
            self._gather(new)
        while len(self._rows) + len(new) < self.max_batch:
            try:
                new.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        return [r for r in new if not r.cancelled]

    def _gather(self, new: list[Row]) -> None:
        """An idle engine waits for the rest of a burst before its first prefill.

        A training step's requests arrive together but not at once: the swarm admits a window's
        claims in a wave or two, and each chat call is parsed on the event loop in turn. Prefilling
        the first arrival alone puts the rest into a second prefill and out of step with it in
        every decode after (measured: 13 forwards a step instead of 8, the engine busy 0.11 s
        instead of 0.07). So while arrivals keep coming less than `gather_s` apart (and for at
        most `gather_max_s`), they join. A lone request pays `gather_s` once; a running batch never
        waits (newcomers join it at the next forward, as before).
        """
        if self.gather_s <= 0:
            return
        end = time.monotonic() + self.gather_max_s
        while len(new) < self.max_batch:
            wait = min(self.gather_s, end - time.monotonic())
            if wait <= 0:
                return
            try:
                new.append(self._inbox.get(timeout=wait))
            except queue.Empty:
                return

    def _loop(self) -> None:
        while not self._stop.is_set():
            new = self._take_new()
            if not new and not self._rows:
                continue
            try:
                with self.lock, torch.inference_mode():
                    t0 = time.perf_counter()
                    if new and self._rows and self._fusable(new):
                        self._fused(new)
                        self.fused_steps += 1
                    elif new:
                        self._prefill(new)
                    else:
                        self._decode()
                    self.busy_s += time.perf_counter() - t0
                    self.steps += 1
            except Exception as exc:  # never let one bad batch kill the loop
                for row in new + self._rows:
                    self._out.add(row, TokenChunk([], [], finish_reason=f"error: {exc}"))
                self._rows, self._cache, self._attn, self._pending, self._knobs = [], None, None, None, None
            self._out.flush()

    def _fusable(self, new: list[Row]) -> bool:
        if len(self._rows) * (max(len(r.prompt_ids) for r in new) - 1) > self.fuse_pad_tokens:
            return False
        if not self.reuse_prompts:
            return True
        keys = {r.key for r in new}  # a prompt to reuse is better than any fusing
        return len(keys) == len(new) and not any(k in self.prompts for k in keys)

    def _prefill(self, new: list[Row]) -> None:
        """New rows alone: their prompts prefilled, then spliced into the running batch.

        A prompt prefilled before with these weights (`self.prompts`), or twice in this batch
        (a GRPO group's first turn), is computed once: its rows share its KV and logits. Only
        rows of one adapter share (the key holds the adapter): the KV depends on it.
        """
        keys = [r.key for r in new]
        if self.reuse_prompts:
            firsts = dict(zip(keys, new))  # one row per distinct key, in order of first appearance
            entries = {k: self.prompts.get(k) for k in firsts}
            missing = [firsts[k] for k, e in entries.items() if e is None]
        else:
            entries, missing = {}, new
        every_row_fresh = len(missing) == len(new)  # then the forward's own batch is the rows' batch
        if missing:
            cache, attn, logits = self._forward_prompts(missing)
            if self.reuse_prompts and (self.prompts.max_tokens or not every_row_fresh):
                for r, e in zip(
                    missing,
                    split_rows([lay.keys for lay in cache.layers], [lay.values for lay in cache.layers], attn, logits),
                ):
                    entries[r.key] = e
                    self.prompts.put(r.key, e)
        if not every_row_fresh:
            ks, vs, attn, logits = stack([entries[k] for k in keys])  # type: ignore[misc]
            cache = DynamicCache()
            for j, (k, v) in enumerate(zip(ks, vs)):
                cache.update(k, v, j)
            self.prompts_reused += len(new) - len(missing)
            self.prefix_tokens_saved += sum(len(r.prompt_ids) for r in new) - sum(len(r.prompt_ids) for r in missing)
        offset = len(self._rows)
        self._splice(new, cache, attn)
        self._sample(logits, offset)

    def _forward_prompts(self, rows: list[Row]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """One forward over the rows' prompts: (KV cache, attention [n, W], last-position logits [n, V]).

        When the prompts share a prefix of at least `min_shared_prefix` tokens (a chat
        template, a system prompt), the prefix is computed once and its KV cache copied
        to every row; the forward then covers only the rest of each prompt. Only when every
        row uses the same adapter: the prefix's KV is that adapter's.
        """
        dev = self._device()
        prompts = [r.prompt_ids for r in rows]
        one_adapter = all(r.adapter == rows[0].adapter for r in rows)
        shared = common_prefix(prompts) if len(prompts) > 1 and one_adapter else 0
        if shared < self.min_shared_prefix:
            ids, attn = left_padded(prompts)
            ids, attn = ids.to(dev), attn.to(dev)
            pos = (attn.cumsum(-1) - 1).clamp_min(0)
            cache = DynamicCache()
        else:
            head = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=dev)
            cache = DynamicCache()
            with self._scope(rows[:1]):
                self.model(
                    input_ids=head,
                    position_ids=torch.arange(shared, device=dev).unsqueeze(0),
                    **cache_kwargs(self.model, cache),
                    use_cache=True,
                )
            repeat_row(cache, len(prompts))
            ids, tail_attn = left_padded([p[shared:] for p in prompts])
            ids, tail_attn = ids.to(dev), tail_attn.to(dev)
            pos = shared + (tail_attn.cumsum(-1) - 1).clamp_min(0)
            attn = torch.cat([tail_attn.new_ones(len(prompts), shared), tail_attn], dim=1)
            self.prefix_tokens_saved += shared * (len(prompts) - 1)
        with self._scope(rows):
            out = self.model(
                input_ids=ids, attention_mask=attn, position_ids=pos, **cache_kwargs(self.model, cache), use_cache=True
            )
        return returned_cache(out), attn, out.logits[:, -1, :]

    def _scope(self, rows: list[Row]) -> AbstractContextManager[Any]:
        """The context of a forward over `rows` (its batch, in order).

        No row names an adapter: nothing is entered (the model as is, no per-forward cost).
        Otherwise `adapter_scope` gets every row's adapter, a row without one being the base
        (`BASE_ADAPTER`). Derived from the rows each time, so it follows joins and drops.
        A row without an adapter is thus exact only if the unscoped model is the base too (a peft
        model runs its active adapter there): else it would change model with its batch-mates,
        and its cached prefill with it. A host of several adapters names every row.
        """
        if self.adapter_scope is None or all(r.adapter is None for r in rows):
            return contextlib.nullcontext()
        return self.adapter_scope([BASE_ADAPTER if r.adapter is None else r.adapter for r in rows])

    def weights_changed(self, adapter: str | None = None) -> None:
        """Forget prefilled prompts: their KV was computed with the old weights (call under `lock`).

        None: the model's weights changed, every prefill is stale. An adapter's name: only its
        LoRA weights changed (one policy's training step); the other adapters' prefills stay.
        """
        self.prompts.clear(adapter)

    def drop_adapter(self, adapter: str) -> None:
        """End every row of `adapter` now ("abort"), queued or running (call under `lock`, before the
        adapter is deleted: a forward naming an adapter peft no longer has fails every row of it).

        The abort reaches each caller directly, not through the worker's per-step hand-over, which
        this thread must not touch (the worker flushes outside the lock)."""
        ended: list[Row] = []
        with self._inbox.mutex:
            for row in self._inbox.queue:
                if row.adapter == adapter and not row.cancelled:
                    row.cancelled = True
                    ended.append(row)
        doomed = [i for i, r in enumerate(self._rows) if r.adapter == adapter]
        ended += [self._rows[i] for i in doomed]
        if doomed:
            self._drop(doomed)
        self.prompts.clear(adapter)
        box = Outbox()
        for row in ended:
            box.add(row, TokenChunk([], [], finish_reason="abort"))
        box.flush()

    def _fused(self, new: list[Row]) -> None:
        """Running rows decode their pending token while new rows prefill, in one forward."""
        assert self._cache is not None and self._attn is not None and self._pending is not None
        ids, pos, attn = fused_inputs(self._cache, self._attn, self._pending, [r.prompt_ids for r in new])
        with self._scope(self._rows + new):
            out = self.model(
                input_ids=ids,
                attention_mask=attn,
                position_ids=pos,
                **cache_kwargs(self.model, self._cache),
                use_cache=True,
            )
        self._cache, self._attn = returned_cache(out), attn
        self._rows.extend(new)
        self._knobs = None
        self._sample(out.logits[:, -1, :], 0)

    def _decode(self) -> None:
        assert self._cache is not None and self._attn is not None and self._pending is not None
        pos = self._attn.sum(-1, keepdim=True)
        attn = torch.cat([self._attn, self._attn.new_ones(len(self._rows), 1)], dim=1)
        with self._scope(self._rows):
            out = self.model(
                input_ids=self._pending.unsqueeze(-1),
                attention_mask=attn,
                position_ids=pos,
                **cache_kwargs(self.model, self._cache),
                use_cache=True,
            )
        self._cache, self._attn = returned_cache(out), attn
        self._sample(out.logits[:, -1, :], 0)

    def _splice(self, new: list[Row], cache: DynamicCache, attn: torch.Tensor) -> None:
        """Append newly prefilled rows to the running batch, left-padding the shorter side."""
        self._knobs = None
        if self._cache is None or not self._rows:
            self._rows, self._cache, self._attn = list(new), cache, attn
            return
        assert self._attn is not None
        self._attn = splice_rows(self._cache, self._attn, cache, attn)
        self._rows.extend(new)

    def _sampling_knobs(self, device: torch.device) -> RowKnobs:
        """The running rows' knobs as tensors and host-side flags, rebuilt only when rows change."""
        if self._knobs is None:
            self._knobs = RowKnobs.of(
                [r.params for r in self._rows], [i for i, r in enumerate(self._rows) if r.matcher is not None], device
            )
        return self._knobs

    def _sample(self, logits: torch.Tensor, offset: int) -> None:
        """Sample the rows from `offset` on (all rows, or the newly spliced ones)."""
        knobs = self._sampling_knobs(logits.device)
        temp, top_p = knobs.temperature, knobs.top_p
        rows = self._rows[offset:]
        if offset:
            temp, top_p = temp[offset:], top_p[offset:]
        constrained = [i - offset for i in knobs.constrained if i >= offset]
        index = allowed = None
        if constrained:
            assert self.grammars is not None
            allowed = self.grammars.fill_masks([rows[i].matcher for i in constrained]).to(logits.device)
            index = torch.tensor(constrained, dtype=torch.long, device=logits.device)
        top_k = knobs.top_k if not offset else max((r.params.top_logprobs for r in rows), default=0)
        draw = sample_rows(
            logits,
            temp,
            top_p,
            [r.generator for r in rows],
            self.shared_gen,
            plain=knobs.plain,
            nucleus=knobs.nucleus,
            top_k=top_k,
            constrained=index,
            allowed=allowed,
        )
        tokens = draw.tokens
        if offset:
            assert self._pending is not None
            self._pending = torch.cat([self._pending, tokens])
        else:
            self._pending = tokens
        tops = None
        if draw.top_ids is not None and draw.top_logprobs is not None:
            tops = list(zip(draw.top_ids.tolist(), draw.top_logprobs.tolist()))
        ends = Ends(self.eos_ids, self.decode, self.max_positions)
        done = [offset + i for i in append_tokens(rows, tokens.tolist(), draw.logprobs.tolist(), tops, ends, self._out)]
        self.tokens_out += sum(1 for r in rows if not r.cancelled)
        if done:
            self._drop(done)

    def _drop(self, done: list[int]) -> None:
        gone = set(done)
        keep = [i for i in range(len(self._rows)) if i not in gone]
        self._knobs = None
        if not keep:
            self._rows, self._cache, self._attn, self._pending = [], None, None, None
            return
        assert self._cache is not None and self._attn is not None and self._pending is not None
        index = torch.tensor(keep, dtype=torch.long, device=self._attn.device)
        self._attn = select_rows(self._cache, self._attn, index)
        self._pending = self._pending[index]
        self._rows = [self._rows[i] for i in keep]

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device
