"""The HTTP client of vLLM's OpenAI server: token ids in, streamed token ids and raw logprobs out.

Generation is `/v1/completions` with a token-id prompt, `return_token_ids`, the
sampled tokens' raw logprobs (the server runs with `--logprobs-mode raw_logprobs`)
and `stream: true`; this module builds that body, reads the SSE stream into
`TokenChunk`s, and turns a stream vLLM closed early (a dying engine core, an abort
by `/pause?mode=abort`) into `finish_reason: "abort"` with the tokens it had.

`top_logprobs = k` is vLLM's `logprobs: k` (ids via `return_tokens_as_token_ids`).
vLLM masks the logits *before* it computes even its "raw" logprobs, so under a
`response_format` it reports the grammar-renormalised ones; the trainer recomputes
unmasked ones. A constrained request is therefore not streamed token by token: once
it is complete, one teacher-forced pass (`prompt_logprobs`) over prompt + completion,
still inside the same request (so on the same weights), replaces them (and the top-k)
with the raw values, as the torch engine records (docs/constrained-decoding.md).

A plain JSON format (`json_object`, `json_schema`) goes as `structured_outputs.grammar` where the
client knows the template's end-of-turn id (`end_id`): the format's compact JSON, then that token
(`swarm.chat.tool_grammar.answer_grammar`). vLLM's guidance backend would end the format with the
tokenizer's EOS, `<|endoftext|>` for a base model's tokenizer, where the torch engine ends it with
`<|im_end|>`; the trained sample must end as the template renders the turn on both engines.

Each request names a `model`: the served name, or (LoRA) the adapter version the engine
admitted it under (`body(request, model)`, `logprobs(ids, model)`).

It knows nothing of weight syncs or restarts: the engine admits each request through
the drain gate and recovers a server that went away (`httpx.TransportError`), so this
client can be tested against any server that speaks the same SSE.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx

from swarm.chat.tool_grammar import END_OF_TURN, answer_grammar
from swarm.engine.base import GenerateRequest, TokenChunk, UnsupportedRequest
from swarm.engine.constrained import grammar_of, json_schema_of
from swarm.engine.vllm.errors import VllmEngineError
from swarm.tls import tls_context

log = logging.getLogger("swarm.engine.vllm")


class CompletionsClient:
    """Token-in/token-out requests to the vLLM server at `url()` (read per request: a restart may move it).

    `served_name` is the `model` a request names unless the caller names another (a LoRA adapter
    version: the engine names the one served when the request was admitted); a callable is read per request.
    `end_id`: the chat template's end-of-turn token (`<|im_end|>`), with which a constrained JSON answer
    ends; None sends a JSON format as vLLM's `response_format` (it ends with the tokenizer's EOS).
    """

    def __init__(
        self,
        url: Callable[[], str],
        served_name: str | Callable[[], str],
        max_positions: int,
        eos_ids: Sequence[int],
        end_id: int | None = None,
    ) -> None:
        self.url = url
        self.model: Callable[[], str] = served_name if callable(served_name) else (lambda: served_name)
        self.max_positions = max_positions
        self.eos_ids = sorted(eos_ids)
        self.end_id = end_id

    def body(self, request: GenerateRequest, model: str | None = None) -> dict[str, Any]:
        """The `/v1/completions` body of `request` for `model` (default: the served name); `ValueError` if
        the prompt leaves no room. The engine may set `body["model"]` later, at admission."""
        p = request.params
        room = self.max_positions - len(request.prompt_ids)
        if room <= 0:
            raise ValueError(f"prompt of {len(request.prompt_ids)} tokens exceeds the context of {self.max_positions}")
        body: dict[str, Any] = {
            "model": model or self.model(),
            "prompt": list(request.prompt_ids),
            "max_tokens": min(p.max_tokens, room),
            "temperature": p.temperature,
            "top_p": p.top_p,
            "logprobs": p.top_logprobs,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stream": True,
            "skip_special_tokens": False,
            "ignore_eos": p.ignore_eos,
            "stop_token_ids": sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_ids))),
        }
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = p.seed
        schema = None if p.response_format is None else json_schema_of(p.response_format)
        if schema is not None and self.end_id is not None:  # the JSON, then the template's end of turn
            body["structured_outputs"] = {"grammar": answer_grammar(schema, {END_OF_TURN: self.end_id})}
        elif schema is not None:
            body["response_format"] = json.loads(p.response_format)
        elif p.response_format is not None and (lark := grammar_of(p.response_format)) is not None:
            body["structured_outputs"] = {"grammar": lark}  # a tool call or the answer (swarm.chat.tool_grammar)
        return body

    async def completions(self, request: GenerateRequest, body: dict[str, Any]) -> AsyncIterator[TokenChunk]:
        """vLLM's streamed chunks of `body`; a constrained one (`response_format`) as one chunk of the whole
        completion with its raw logprobs. `httpx.TransportError` when the server cannot be reached."""
        k = request.params.top_logprobs
        raw = "response_format" in body or "structured_outputs" in body
        # a client per request (it belongs to this event loop), on the process's TLS context: a new
        # context per request cost ~20 ms of the server's CPU (swarm/tls.py)
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None), verify=tls_context()) as client:
            async with client.stream("POST", self.url() + "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:500]
                    if resp.status_code == 400 and raw:  # a schema vLLM refused
                        raise UnsupportedRequest(
                            "invalid_json_schema", f"vLLM refused the response_format: {_error_message(detail)}"
                        )
                    raise VllmEngineError(f"vLLM answered {resp.status_code}: {detail}")
                finished = False
                chunks: list[TokenChunk] = []
                async for line in resp.aiter_lines():
                    try:
                        chunk = parse_chunk(line, k)
                    except json.JSONDecodeError:  # only the last line can be cut: vLLM closed the
                        log.warning("vLLM closed a stream mid-line; ending the request as aborted")
                        break  # stream early (a dying engine core), which ends as an abort below
                    if chunk is not None:
                        finished = chunk.finish_reason is not None
                        if raw:
                            chunks.append(chunk)
                        else:
                            yield chunk
                if not finished:  # vLLM closed the stream early: an abort
                    aborted = TokenChunk([], [], "abort")
                    if raw:
                        chunks.append(aborted)
                    else:
                        yield aborted
            if raw:
                for chunk in await self._unmasked(client, request.prompt_ids, chunks, k, body["model"]):
                    yield chunk

    async def _unmasked(
        self, client: httpx.AsyncClient, prompt_ids: list[int], chunks: list[TokenChunk], k: int, model: str
    ) -> list[TokenChunk]:
        """`chunks` merged into one, its logprobs (and top-k) recomputed unmasked by a teacher-forced pass
        (on `model`, the request's: the same weights).

        The pass needs one position of room after the completion; a completion that filled the
        context keeps vLLM's grammar-renormalised logprobs (logged: the one case they are recorded).
        """
        ids = [t for c in chunks for t in c.token_ids]
        logps = [x for c in chunks for x in c.logprobs]
        tops = [t for c in chunks for t in (c.top_logprobs or [])] if k > 0 else None
        reason = next((c.finish_reason for c in reversed(chunks) if c.finish_reason), None)
        if ids and len(prompt_ids) + len(ids) < self.max_positions and reason != "abort":
            forced = self._forced(list(prompt_ids) + ids, k, model)
            resp = await client.post(self.url() + "/v1/completions", json=forced)
            if resp.status_code != 200:
                raise VllmEngineError(f"vLLM answered {resp.status_code} to a logprob pass: {resp.text[:300]}")
            rows = resp.json()["choices"][0]["prompt_logprobs"][len(prompt_ids) :]
            logps = [float(row[str(tok)]["logprob"]) for row, tok in zip(rows, ids)]
            if tops is not None:
                tops = [
                    sorted(((int(t), float(v["logprob"])) for t, v in row.items()), key=lambda p: -p[1])[:k]
                    for row in rows
                ]
        elif ids:
            log.warning(
                "constrained completion of %d tokens: no room for the unmasked logprob pass (%s); "
                "recording vLLM's grammar-renormalised logprobs",
                len(ids),
                reason,
            )
        return [TokenChunk(ids, logps, reason, top_logprobs=tops)]

    def logprobs(self, ids: list[int], model: str | None = None) -> list[float]:
        """Teacher-forced logprob of each token after the first, as vLLM computes it with `model` (checks,
        tests, and every `echo` request to a vLLM-engine server: hence the process's TLS context)."""
        forced = self._forced(list(ids), 0, model)
        resp = httpx.post(self.url() + "/v1/completions", timeout=60, json=forced, verify=tls_context())
        resp.raise_for_status()
        rows = resp.json()["choices"][0]["prompt_logprobs"][1:]
        return [float(row[str(tok)]["logprob"]) for row, tok in zip(rows, ids[1:])]

    def _forced(self, ids: list[int], k: int, model: str | None) -> dict[str, Any]:
        """A teacher-forced pass over `ids` by `model`: their prompt logprobs (and the top `k`), one token generated."""
        return {
            "model": model or self.model(),
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": k,
        }


def _error_message(detail: str) -> str:
    """vLLM's error body (`{"error": {"message": ...}}`) to its message; the text as is otherwise."""
    try:
        body = json.loads(detail)
        return str(body["error"]["message"]) if isinstance(body.get("error"), dict) else str(body)
    except (json.JSONDecodeError, KeyError, AttributeError):
        return detail


def _top(row: dict[str, float] | None, k: int) -> list[tuple[int, float]]:
    """vLLM's top-logprob dict (keys `token_id:N`; it may add the sampled token) as the k best pairs."""
    pairs = [(int(key.rsplit(":", 1)[-1]), float(v)) for key, v in (row or {}).items()]
    return sorted(pairs, key=lambda p: -p[1])[:k]


def parse_chunk(line: str, k: int = 0) -> TokenChunk | None:
    """One SSE line of a streamed `/v1/completions` into a `TokenChunk` (None: not a data chunk)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    payload = json.loads(data)
    if "error" in payload:
        raise VllmEngineError(f"vLLM stream error: {payload['error']}")
    choice = payload["choices"][0]
    ids = [int(t) for t in (choice.get("token_ids") or [])]
    logprobs = choice.get("logprobs") or {}
    lp = logprobs.get("token_logprobs") or []
    if len(lp) != len(ids):
        raise VllmEngineError(f"vLLM sent {len(ids)} tokens with {len(lp)} logprobs")
    tops = [_top(row, k) for row in (logprobs.get("top_logprobs") or [])] if k > 0 else None
    if tops is not None and len(tops) != len(ids):
        raise VllmEngineError(f"vLLM sent {len(ids)} tokens with {len(tops)} top-logprob rows")
    return TokenChunk(ids, [float(x) for x in lp], choice.get("finish_reason"), top_logprobs=tops)
