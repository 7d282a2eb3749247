"""Helpers the vLLM test modules share (imported by name: conftest puts this folder on sys.path)."""

from __future__ import annotations

import asyncio
from typing import Any


def chat_prompt(engine: Any, text: str = "What is 2+3?") -> list[int]:
    """Prompt ids of one user turn, rendered by the engine's own chat template."""
    s = engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return engine.tokenizer.encode(s, add_special_tokens=False)


def generate_all(engine: Any, requests: list) -> list:
    """Completions of `requests`, sent to the engine at once (they share its batch)."""
    async def go() -> list:
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    return asyncio.run(go())
