"""The `torch` engine: a Hugging Face causal LM generating and training in-process.

The embedded default: one process, CPU or one GPU (bf16 weights, SDPA attention
and fp32 master weights there; `swarm.engine.precision` chooses). Generation goes through a
continuous batcher (many episodes share each forward pass and a KV cache);
`train_step` takes the same lock, so weights never change under a running
forward pass. Good for small models and for tests. Behind the same `Engine`
interface, `swarm.engine.vllm` serves with a vLLM server (and trains with this
engine's `train_step`), and `swarm.engine.verl` hands training to verl on GPU clusters.

With `lora=LoraSettings(rank=r)` it trains a peft LoRA adapter instead of every weight
(swarm/engine/lora.py): the base stays frozen and bit-identical, the optimizer holds the
adapter's parameters only, the KL reference is the base with the adapter switched off (no
second copy of the model), and `save` writes the adapter, its optimizer state and the base's
directory, not the base. Rank 0 (the default) is full fine-tuning, exactly as before.

    engine = TorchEngine(Path("~/.cache/roost/models/tiny-qwen2").expanduser())
    completion = asyncio.run(engine.generate(GenerateRequest([1, 2, 3])))
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarm.config.lora import LoraSettings
from swarm.engine.base import Completion, EngineError, GenerateRequest, TokenChunk, TrainBatch, completion_of
from swarm.engine.constrained import Grammars
from swarm.engine.continuous import ContinuousBatcher
from swarm.engine.lora import ADAPTER_CONFIG, LoraError, attach, is_adapter_dir, load_adapter, save_adapter, unwrap
from swarm.engine.policy_step import policy_step
from swarm.engine.precision import MasterWeightAdamW, build_optimizer, detect_placement

STATE_FILE = "engine_state.json"
OPTIMIZER_FILE = "optimizer.pt"


GenMark = tuple[float, int, int, int]


def generation_since(batcher: ContinuousBatcher, mark: GenMark) -> tuple[dict[str, float], GenMark]:
    """The engine's own generation work since `mark` (busy seconds, forwards, tokens, prefills reused),
    for a step's metrics beside the server's wall_window_s; and the new mark. Read under the lock."""
    now = (batcher.busy_s, batcher.steps, batcher.tokens_out, batcher.prompts_reused)
    return {
        "gen_busy_s": now[0] - mark[0],
        "gen_forwards": float(now[1] - mark[1]),
        "gen_tokens": float(now[2] - mark[2]),
        "gen_prompts_reused": float(now[3] - mark[3]),  # prefills shared, not recomputed
    }, now


def load_optimizer(optimizer: Any, model: torch.nn.Module, file: Path, device: torch.device) -> None:
    """A saved optimizer state into `optimizer` (the parameters that train in `model`, in order).

    A bf16 (GPU) run's state holds fp32 masters: resumed in fp32 they become the weights.
    """
    state = torch.load(file, weights_only=True, map_location=device)
    if "adamw" in state and not isinstance(optimizer, MasterWeightAdamW):
        optimizer.load_state_dict(state["adamw"])
        with torch.no_grad():
            params = [p for p in model.parameters() if p.requires_grad]
            torch._foreach_copy_(params, [m.to(p.dtype) for p, m in zip(params, state["master"])])
    else:
        optimizer.load_state_dict(state)


class TorchEngine:
    def __init__(
        self,
        model_dir: Path,
        seed: int = 0,
        device: str | None = None,
        max_batch: int = 128,
        reference: bool = True,
        dtype: str | None = None,
        lora: LoraSettings | None = None,
        trainable: bool = True,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.lora = lora or LoraSettings()
        if not (self.model_dir / "config.json").exists() and is_adapter_dir(self.model_dir):
            raise FileNotFoundError(
                f"{self.model_dir} is a LoRA adapter checkpoint, not a model: serve its base model with "
                "--lora-rank (a run resumes its adapter from --out), or merge it first: "
                f"swarm model export {self.model_dir} --merge DIR"
            )
        if not (self.model_dir / "config.json").exists():
            raise FileNotFoundError(
                f"no Hugging Face model at {self.model_dir} (missing config.json); "
                "run `swarm model init` or pass --model PATH"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.manual_seed(seed)
        self.placement = detect_placement(device, dtype)
        self.device = torch.device(self.placement.device)
        if self.placement.threads is not None:
            torch.set_num_threads(self.placement.threads)  # process-wide: the engine owns this process's torch
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        attn = self.placement.attn_implementation
        extra = {"attn_implementation": attn} if attn else {}  # None: the model's default, as on CPU always
        base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=self.placement.torch_dtype, **extra).to(
            self.device
        )
        base.eval()
        #: what trains and checkpoints: the HF model, or (LoRA) the peft wrapper around it
        self.model: torch.nn.Module = attach(base, self.lora, self.model_dir) if self.lora.enabled else base
        #: what generates: the HF model itself, base + adapter layers inside when LoRA (swarm/engine/lora.py)
        self.network = unwrap(self.model)
        self._model_kwargs = {"dtype": self.placement.torch_dtype, **extra}
        self._wants_reference = reference
        # with LoRA the KL reference is the peft model itself, its adapters off in that forward
        self._reference: torch.nn.Module | None = self.model if (reference and self.lora.enabled) else None
        #: None for a host of several policies (swarm/engine/policies.py): each brings its own
        self.optimizer = build_optimizer(self.model, self.placement) if trainable else None
        self.policy_version = 0
        self._lock = threading.Lock()
        cfg = self.network.config
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 2048))
        vocab = int(self.network.get_input_embeddings().weight.shape[0])
        eos = self._eos_ids()
        self.batcher = ContinuousBatcher(
            self.network,
            self._lock,
            eos,
            self.max_positions,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
            vocab_size=vocab,
            max_batch=max_batch,
            seed=seed,
            fuse_pad_tokens=self.placement.fuse_pad_tokens,
            grammars=Grammars(self.tokenizer, vocab, eos),  # response_format: llguidance, built on first use
        )
        # a prompt shared by a group's samples runs once in training: on CPUs (precision.py says why)
        self.share_prefix = self.placement.share_prefix
        self._gen_mark: GenMark = (0.0, 0, 0, 0)  # batcher busy s, forwards, tokens, reused prompts at the last step
        if (self.model_dir / STATE_FILE).exists() and not self.lora.enabled:  # a new adapter starts afresh on it
            self._load_state(self.model_dir)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for tok in ("<|im_end|>", "<|endoftext|>"):
            i = self.tokenizer.convert_tokens_to_ids(tok)
            if isinstance(i, int) and i != self.tokenizer.unk_token_id and i >= 0:
                ids.add(i)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_eos = getattr(getattr(self.network, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, list):
            ids.update(int(x) for x in gen_eos)
        return ids

    # -- generation -----------------------------------------------------------
    async def stream(self, request: GenerateRequest, adapter: str | None = None) -> AsyncIterator[TokenChunk]:
        """Chunks of one request; `UnsupportedRequest` (before any chunk) for a response_format
        the grammar library refuses. A constraint is compiled in a worker thread: a big schema
        takes milliseconds, which the event loop serving every other episode should not wait out.
        `adapter`: the LoRA adapter (policy) that generates this row (swarm/engine/policies.py)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[TokenChunk] = asyncio.Queue()
        fmt = request.params.response_format
        matcher = await asyncio.to_thread(self.batcher.compile, fmt) if fmt is not None else None
        handle = self.batcher.submit(
            request.prompt_ids, request.params, q.put_nowait, loop=loop, matcher=matcher, adapter=adapter
        )
        try:
            while True:
                chunk = await q.get()
                if chunk.finish_reason and chunk.finish_reason.startswith("error"):
                    raise EngineError(chunk.finish_reason)
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            handle.cancel()  # no-op when finished; frees the row when the caller went away

    async def generate(self, request: GenerateRequest, adapter: str | None = None) -> Completion:
        version = self.policy_version
        return completion_of(request, [chunk async for chunk in self.stream(request, adapter)], version)

    # -- training -------------------------------------------------------------
    @property
    def reference(self) -> torch.nn.Module | None:
        """The KL reference: the model as `model_dir` holds it, loaded the first time a step asks for it.

        Lazy because most runs train with kl_coef 0, and a frozen second copy is the largest
        thing after the weights themselves (1.9 GB on the 0.5B preset: the difference between
        fitting and not). Loaded from disk rather than copied, so it is the starting weights even
        when kl_coef is first set (`swarm ctl`) after steps have trained, and even after `load`
        resumed a checkpoint: the reference stays the base the run started from.
        """
        if self._reference is None and self._wants_reference:
            ref = AutoModelForCausalLM.from_pretrained(self.model_dir, **self._model_kwargs).to(self.device)
            self._reference = ref.eval().requires_grad_(False)
        return self._reference

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        config = batch.config
        if self.lora.enabled:  # the adapter's lr, explicit and logged (LoraSettings.lr_scale)
            config = config.model_copy(update={"lr": config.lr * self.lora.lr_scale})
        with self._lock:
            ref = self.reference if config.kl_coef else None
            metrics = policy_step(
                self.model,
                self.optimizer,
                batch.samples,
                config,
                reference=ref,
                share_prefix=self.share_prefix,
                token_advantages=batch.token_advantages,
                teacher=batch.teacher,
            )
            self.batcher.weights_changed()
            self.policy_version += 1
            gen, self._gen_mark = generation_since(self.batcher, self._gen_mark)
        metrics["policy_version"] = float(self.policy_version)
        metrics.update(gen)
        return metrics

    def logprobs(self, ids: list[int]) -> list[float]:
        """Teacher-forced logprob of each token after the first (for checks and tests)."""
        with self._lock, torch.inference_mode():
            t = torch.tensor([ids], device=self.device)
            logits = self.network(input_ids=t).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, t[0, 1:].unsqueeze(-1)).squeeze(-1)
        return lp.tolist()

    # -- persistence ----------------------------------------------------------
    def save(self, path: Path) -> None:
        """Weights (LoRA: the adapter only), tokenizer, optimizer state and policy version; a LoRA
        checkpoint also records its base model's directory and settings, so export and eval rebuild it."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state: dict[str, object] = {"policy_version": self.policy_version}
        with self._lock:
            if self.lora.enabled:
                save_adapter(self.model, path)
                state.update(base_model=str(self.model_dir.resolve()), lora=self.lora.model_dump(mode="json"))
            else:
                self.model.save_pretrained(path, safe_serialization=True)
            self.tokenizer.save_pretrained(path)
            torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)
            (path / STATE_FILE).write_text(json.dumps(state))

    def load(self, path: Path) -> None:
        path = Path(path)
        if self.lora.enabled:
            with self._lock:
                try:
                    load_adapter(self.model, path, self.lora)
                except LoraError as exc:
                    raise EngineError(str(exc)) from None
                self.batcher.weights_changed()
                if isinstance(self.optimizer, MasterWeightAdamW):
                    self.optimizer.sync_from_model()
                self._load_state(path)
            return
        if is_adapter_dir(path):
            raise EngineError(
                f"checkpoint {path} holds a LoRA adapter ({ADAPTER_CONFIG}), not a model: resume it "
                "with the --lora-* settings it was trained with"
            )
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no safetensors weights in {path}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        with self._lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            real_missing = [m for m in missing if not m.endswith("lm_head.weight")]  # tied
            if real_missing or unexpected:
                raise EngineError(
                    f"checkpoint {path} does not fit the model: missing {real_missing}, unexpected {unexpected}"
                )
            if getattr(self.model.config, "tie_word_embeddings", False):
                self.model.tie_weights()
            self.batcher.weights_changed()
            if isinstance(self.optimizer, MasterWeightAdamW):
                self.optimizer.sync_from_model()  # masters follow the loaded weights (unless saved below)
            self._load_state(path)

    def _load_state(self, path: Path) -> None:
        if (path / OPTIMIZER_FILE).exists():
            load_optimizer(self.optimizer, self.model, path / OPTIMIZER_FILE, self.device)
        if (path / STATE_FILE).exists():
            self.policy_version = int(json.loads((path / STATE_FILE).read_text())["policy_version"])

    async def close(self) -> None:
        await asyncio.to_thread(self.batcher.close)
