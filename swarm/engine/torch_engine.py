"""The `torch` engine: a Hugging Face causal LM generating and training in-process.

The embedded default: one process, CPU or one GPU. Generation goes through a
continuous batcher (many episodes share each forward pass and a KV cache);
`train_step` takes the same lock, so weights never change under a running
forward pass. Good for small models and for tests; it is the only real engine
today (vLLM and verl engines for larger models are planned, behind the same
`Engine` interface).

    engine = TorchEngine(Path("~/.cache/roost/models/tiny-qwen2").expanduser())
    completion = asyncio.run(engine.generate(GenerateRequest([1, 2, 3])))
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
from pathlib import Path
from typing import AsyncIterator

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarm.engine.base import Completion, GenerateRequest, TokenChunk, TrainBatch
from swarm.engine.continuous import ContinuousBatcher
from swarm.engine.policy_step import policy_step

STATE_FILE = "engine_state.json"
OPTIMIZER_FILE = "optimizer.pt"


class EngineError(RuntimeError):
    pass


class TorchEngine:
    def __init__(
        self,
        model_dir: Path,
        seed: int = 0,
        device: str | None = None,
        max_batch: int = 128,
        reference: bool = True,
    ) -> None:
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").exists():
            raise FileNotFoundError(
                f"no Hugging Face model at {self.model_dir} (missing config.json); "
                "run `swarm model init` or pass --model PATH"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.manual_seed(seed)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).to(self.device)
        self.model.eval()
        self.reference = copy.deepcopy(self.model).requires_grad_(False) if reference else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5, betas=(0.9, 0.99), eps=1e-8)
        self.policy_version = 0
        self._lock = threading.Lock()
        cfg = self.model.config
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 2048))
        self.batcher = ContinuousBatcher(
            self.model, self._lock, self._eos_ids(), self.max_positions,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
            vocab_size=int(self.model.get_input_embeddings().weight.shape[0]), max_batch=max_batch, seed=seed,
        )
        if (self.model_dir / STATE_FILE).exists():
            self._load_state(self.model_dir)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for tok in ("<|im_end|>", "<|endoftext|>"):
            i = self.tokenizer.convert_tokens_to_ids(tok)
            if isinstance(i, int) and i != self.tokenizer.unk_token_id and i >= 0:
                ids.add(i)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, list):
            ids.update(int(x) for x in gen_eos)
        return ids

    # -- generation -----------------------------------------------------------
    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[TokenChunk] = asyncio.Queue()
        handle = self.batcher.submit(request.prompt_ids, request.params,
                                     lambda c: loop.call_soon_threadsafe(q.put_nowait, c))
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

    async def generate(self, request: GenerateRequest) -> Completion:
        version = self.policy_version
        ids: list[int] = []
        logps: list[float] = []
        reason = "length"
        async for chunk in self.stream(request):
            ids.extend(chunk.token_ids)
            logps.extend(chunk.logprobs)
            if chunk.finish_reason:
                reason = chunk.finish_reason
        return Completion(list(request.prompt_ids), ids, logps, reason, version)

    # -- training -------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        with self._lock:
            ref = self.reference if batch.config.kl_coef else None
            metrics = policy_step(self.model, self.optimizer, batch.samples, batch.config, reference=ref)
            self.policy_version += 1
        metrics["policy_version"] = float(self.policy_version)
        return metrics

    def logprobs(self, ids: list[int]) -> list[float]:
        """Teacher-forced logprob of each token after the first (for checks and tests)."""
        with self._lock, torch.inference_mode():
            t = torch.tensor([ids], device=self.device)
            logits = self.model(input_ids=t).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, t[0, 1:].unsqueeze(-1)).squeeze(-1)
        return lp.tolist()

    # -- persistence ----------------------------------------------------------
    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self.model.save_pretrained(path, safe_serialization=True)
            self.tokenizer.save_pretrained(path)
            torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)
            (path / STATE_FILE).write_text(json.dumps({"policy_version": self.policy_version}))

    def load(self, path: Path) -> None:
        path = Path(path)
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
                raise EngineError(f"checkpoint {path} does not fit the model: missing {real_missing}, "
                                  f"unexpected {unexpected}")
            if getattr(self.model.config, "tie_word_embeddings", False):
                self.model.tie_weights()
            self._load_state(path)

    def _load_state(self, path: Path) -> None:
        if (path / OPTIMIZER_FILE).exists():
            self.optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
        if (path / STATE_FILE).exists():
            self.policy_version = int(json.loads((path / STATE_FILE).read_text())["policy_version"])

    async def close(self) -> None:
        await asyncio.to_thread(self.batcher.close)
