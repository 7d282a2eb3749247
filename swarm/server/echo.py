"""`echo` on `/v1/completions`: the prompt back, with its logprobs, as vLLM and OpenAI's legacy API answer.

    {"prompt": [ids], "echo": true, "logprobs": 1, "max_tokens": 1}
    -> choices[0].text = prompt text + completion text
       choices[0].logprobs.token_logprobs = [null, lp(prompt[1]), ..., lp(prompt[-1]), lp(generated)...]

This is what makes a Roost server usable as the teacher of another one's on-policy distillation
(swarm/model/teacher.py asks exactly this): the prompt is scored teacher-forced by the engine's
`logprobs(ids)` (raw, temperature 1), under the generation gate so the weights do not change
under it. Each prompt token's `top_logprobs` entry holds that token alone (not the top k).
Streaming with echo is refused (400 `unsupported_echo`), and so is an engine that cannot score
a prompt (the fake engine).
"""

from __future__ import annotations

import asyncio
from typing import Any

from swarm.server.exceptions import InvalidRequest
from swarm.server.render import ChatRenderer
from swarm.server.state import Swarm


def check_echo(swarm: Swarm, stream: bool | None) -> None:
    """Refuse, before anything is generated, an echo this server cannot answer."""
    if stream:
        raise InvalidRequest("unsupported_echo", "echo is supported without stream")
    if not callable(getattr(swarm.engine, "logprobs", None)):
        raise InvalidRequest("unsupported_echo", "echo needs an engine that scores prompts (torch, vllm)")


async def prompt_logprobs(swarm: Swarm, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, by the served weights (never while a step changes them)."""
    async with swarm.gate.generating():
        return list(await asyncio.to_thread(swarm.engine.logprobs, ids))  # type: ignore[attr-defined]


def echoed(r: ChatRenderer, prompt_ids: list[int], lps: list[float], choice: dict[str, Any]) -> None:
    """Put the prompt in front of a built choice: its text, and (asked for logprobs) its tokens."""
    prompt_text = r.tok.decode(prompt_ids, skip_special_tokens=False)
    choice["text"] = prompt_text + choice["text"]
    gen = choice.get("logprobs")
    if gen is None:
        return
    tokens = [r.token_text(t) for t in prompt_ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    scored: list[float | None] = [None, *lps[: len(prompt_ids) - 1]]
    choice["logprobs"] = {
        "tokens": tokens + gen["tokens"],
        "token_logprobs": scored + gen["token_logprobs"],
        "top_logprobs": (
            [None, *({t: lp} for t, lp in zip(tokens[1:], lps))] + gen["top_logprobs"]
            if gen["top_logprobs"] is not None
            else None
        ),
        "text_offset": offsets + [len(prompt_text) + o for o in gen["text_offset"]],
    }


__all__ = ["check_echo", "echoed", "prompt_logprobs"]
