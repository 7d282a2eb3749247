"""What the torch-engine tests share: a chat prompt's ids and running requests together."""

from __future__ import annotations

import asyncio

from swarm.engine.base import Completion, GenerateRequest


def chat_prompt(engine, text: str = "What is 2+3?") -> list[int]:
    """The ids the server would send for one user message (generation prompt added)."""
    s = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return engine.tokenizer.encode(s, add_special_tokens=False)


def generate_all(engine, reqs: list[GenerateRequest]) -> list[Completion]:
    """Every request submitted at once (so they share the engine's batches), in order."""

    async def go() -> list[Completion]:
        return await asyncio.gather(*(engine.generate(r) for r in reqs))

    return asyncio.run(go())
