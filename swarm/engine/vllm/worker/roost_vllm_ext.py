"""Roost's methods on vLLM's worker (`--worker-extension-cls roost_vllm_ext.RoostWorkerExtension`).

Runs inside the vLLM worker process, from vLLM's own interpreter (possibly
another virtualenv), with only this file's directory on PYTHONPATH: it imports
nothing of Roost, only torch. The engine calls it through `/collective_rpc`
(arguments are strings, results JSON).

`roost_reload(path)` is vLLM's in-place `reload_weights` plus the fix of its
tied-embeddings bug: with `tie_word_embeddings` the checkpoint has no `lm_head`,
the reload refreshes `embed_tokens` but the CPU backend keeps the *old*
prepacked `lm_head` (a separate packed copy made after loading), so outputs
are silently wrong. Re-running the lm_head's `process_weights_after_loading`
re-packs it from the new shared weight (~50 ms).

`roost_lora_ids()` lists the LoRA adapters the worker holds (tests: unloaded versions do not pile up).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any


class RoostWorkerExtension:
    """Mixed into vLLM's worker class by `--worker-extension-cls`; `self` is the worker."""

    def roost_reload(self, weights_dir: str) -> dict[str, Any]:
        """Load every safetensors file in `weights_dir` in place; returns timings for the engine's metrics."""
        t0 = time.perf_counter()
        self.reload_weights(weights_path=weights_dir, is_checkpoint_format=True)  # type: ignore[attr-defined]
        t1 = time.perf_counter()
        retied = self._roost_retie()
        return {"reload_s": t1 - t0, "retie_s": time.perf_counter() - t1, "retied": retied}

    def _roost_retie(self) -> bool:
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        config = getattr(getattr(model, "config", None), "tie_word_embeddings", None)
        if config is None:
            hf = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
            config = getattr(hf, "tie_word_embeddings", False)
        lm_head = getattr(model, "lm_head", None)
        method = getattr(lm_head, "quant_method", None)
        if not config or lm_head is None or method is None:
            return False
        method.process_weights_after_loading(lm_head)
        return True

    def roost_checksum(self) -> str:
        """sha256 over the model's parameters (names and bytes): tests compare servers with it."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        h = hashlib.sha256()
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            h.update(name.encode())
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()

    def roost_lora_ids(self) -> list[int]:
        """The ids of the LoRA adapters the worker holds now (its cache, at most `--max-loras`): tests
        check that unloaded versions do not pile up."""
        return sorted(int(i) for i in self.list_loras())  # type: ignore[attr-defined]
