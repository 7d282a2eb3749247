"""The vllm engine's stream client alone, against a real loopback HTTP server speaking vLLM's canned SSE.

No vLLM: the server in a thread (vllm_helpers.loopback_server) answers `/v1/completions`
with the chunks each test scripts, so what is checked is the client's side of the
protocol: the body it sends, how it reads the stream, the abort of a stream cut short,
the errors, and the unmasked logprob pass of a constrained request.
"""

from __future__ import annotations

import asyncio
import json
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest
from vllm_helpers import loopback_server, reply

from swarm.children import free_port
from swarm.engine.base import GenerateRequest, SamplingParams, TokenChunk, UnsupportedRequest
from swarm.engine.vllm.errors import VllmEngineError
from swarm.engine.vllm.stream import CompletionsClient

EOS = 9
CONTEXT = 10


def _data(
    ids: list[int], lps: list[float], finish: str | None = None, tops: list[dict[str, float]] | None = None
) -> str:
    logprobs: dict[str, Any] = {"token_logprobs": lps}
    if tops is not None:
        logprobs["top_logprobs"] = tops
    choice = {"index": 0, "text": "x", "logprobs": logprobs, "finish_reason": finish, "token_ids": ids}
    return "data: " + json.dumps({"choices": [choice]}) + "\n\n"


def _sse(handler: BaseHTTPRequestHandler, parts: list[str]) -> None:
    """A streamed 200: `parts` written one by one, then the connection closes (HTTP/1.0)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    for part in parts:
        handler.wfile.write(part.encode())
        handler.wfile.flush()


def _client(url: str) -> CompletionsClient:
    return CompletionsClient(lambda: url, "roost", CONTEXT, [EOS])


def _collect(client: CompletionsClient, request: GenerateRequest) -> list[TokenChunk]:
    async def go() -> list[TokenChunk]:
        return [c async for c in client.completions(request, client.body(request))]

    return asyncio.run(go())


def test_a_stream_is_read_into_chunks_and_the_body_asks_for_token_ids():
    parts = [_data([5], [-0.5]), ": keep-alive\n\n", _data([6, 7], [-1.0, -2.0], "length"), "data: [DONE]\n\n"]
    with loopback_server(lambda m, p, b, h: _sse(h, parts)) as (url, rec):
        client = _client(url)
        chunks = _collect(
            client, GenerateRequest([1, 2, 3], SamplingParams(max_tokens=50, stop_token_ids=(0,), seed=4, stop=("\n",)))
        )
    assert [(c.token_ids, c.logprobs, c.finish_reason) for c in chunks] == [
        ([5], [-0.5], None),
        ([6, 7], [-1.0, -2.0], "length"),
    ]
    ((method, path, body),) = rec.calls
    assert (method, path) == ("POST", "/v1/completions")
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == CONTEXT - 3  # clipped to the room left
    assert body["stream"] and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["stop_token_ids"] == [0, EOS] and body["stop"] == ["\n"] and body["seed"] == 4
    assert "response_format" not in body
    assert _client(url).body(GenerateRequest([1], SamplingParams(ignore_eos=True)))["stop_token_ids"] == []
    with pytest.raises(ValueError, match="exceeds the context"):
        _client(url).body(GenerateRequest(list(range(CONTEXT))))


def test_top_logprobs_come_back_as_sorted_id_pairs():
    parts = [_data([5], [-0.5], "stop", tops=[{"token_id:3": -2.0, "token_id:5": -0.5, "token_id:8": -1.0}])]
    with loopback_server(lambda m, p, b, h: _sse(h, parts)) as (url, rec):
        (chunk,) = _collect(_client(url), GenerateRequest([1], SamplingParams(top_logprobs=2)))
    assert chunk.top_logprobs == [[(5, -0.5), (8, -1.0)]] and rec.calls[0][2]["logprobs"] == 2


@pytest.mark.parametrize(
    "parts",
    [
        [_data([5], [-0.5])],  # closed after a chunk, no finish_reason
        [_data([5], [-0.5]), 'data: {"choices": [{"ind'],  # closed mid-line (a dying engine core)
    ],
    ids=["closed", "cut-mid-line"],
)
def test_a_stream_closed_early_ends_as_an_abort_with_the_tokens_it_had(parts):
    with loopback_server(lambda m, p, b, h: _sse(h, parts)) as (url, _):
        chunks = _collect(_client(url), GenerateRequest([1]))
    assert [c.token_ids for c in chunks] == [[5], []] and chunks[-1].finish_reason == "abort"


def test_errors_of_the_server_and_of_the_stream():
    def answer(method: str, path: str, body: Any, h: BaseHTTPRequestHandler) -> None:
        if body.get("seed") == 1:
            reply(h, 400, {"error": {"message": "bad schema: no"}})
        elif body.get("seed") == 2:
            reply(h, 500, "engine core died", content_type="text/plain")
        else:
            _sse(h, ['data: {"error": {"message": "boom"}}\n\n'])

    fmt = json.dumps({"type": "json_object"})
    with loopback_server(answer) as (url, _):
        with pytest.raises(UnsupportedRequest, match="refused the response_format: bad schema: no") as err:
            _collect(_client(url), GenerateRequest([1], SamplingParams(seed=1, response_format=fmt)))
        assert err.value.code == "invalid_json_schema"
        with pytest.raises(VllmEngineError, match="answered 400"):  # unconstrained: vLLM's fault
            _collect(_client(url), GenerateRequest([1], SamplingParams(seed=1)))
        with pytest.raises(VllmEngineError, match="answered 500: engine core died"):
            _collect(_client(url), GenerateRequest([1], SamplingParams(seed=2)))
        with pytest.raises(VllmEngineError, match="stream error"):
            _collect(_client(url), GenerateRequest([1]))
    with pytest.raises(httpx.TransportError):  # nobody listens: the engine's cue to restart vLLM
        _collect(_client(f"http://127.0.0.1:{free_port()}"), GenerateRequest([1]))


def _forced_pass(body: dict[str, Any], raw: dict[int, float]) -> dict[str, Any]:
    """vLLM's answer to a teacher-forced pass: a row per prompt position (None first), the token and one other."""
    rows: list[Any] = [None]
    for tok in body["prompt"][1:]:
        row = {str(tok): {"logprob": raw.get(tok, -3.0)}}
        if body["prompt_logprobs"]:
            row["1"] = {"logprob": -0.01}
        rows.append(row)
    return {"choices": [{"prompt_logprobs": rows, "text": "", "finish_reason": "length"}]}


def test_a_constrained_completion_comes_back_whole_with_raw_logprobs():
    raw = {5: -0.7, 6: -1.7}
    fmt = json.dumps({"type": "json_object"})

    def answer(method: str, path: str, body: Any, h: BaseHTTPRequestHandler) -> None:
        if body.get("stream"):  # the grammar-masked (renormalised) logprobs
            _sse(
                h,
                [
                    _data([5], [-0.1], tops=[{"token_id:5": -0.1}]),
                    _data([6], [-0.2], "stop", tops=[{"token_id:6": -0.2}]),
                ],
            )
        else:
            reply(h, 200, _forced_pass(body, raw))

    with loopback_server(answer) as (url, rec):
        (chunk,) = _collect(_client(url), GenerateRequest([1, 2], SamplingParams(top_logprobs=1, response_format=fmt)))
        forced = _client(url).logprobs([1, 5, 6])
    assert chunk.token_ids == [5, 6] and chunk.logprobs == [-0.7, -1.7] and chunk.finish_reason == "stop"
    assert chunk.top_logprobs == [[(1, -0.01)], [(1, -0.01)]]
    stream_body, pass_body, lp_body = (body for _m, _p, body in rec.calls)
    assert stream_body["response_format"] == {"type": "json_object"}
    assert pass_body["prompt"] == [1, 2, 5, 6] and pass_body["max_tokens"] == 1 and pass_body["prompt_logprobs"] == 1
    assert forced == [-0.7, -1.7] and lp_body["prompt_logprobs"] == 0


def test_a_grammar_format_goes_as_structured_outputs_and_comes_back_whole():
    """The core's tool-call grammar (swarm/chat/tool_grammar.py) reaches vLLM as its structured outputs'
    `grammar` (guidance backend: the same Lark text the torch engine compiles), never as a response_format."""
    grammar = 'start: body <[2]>\nbody: "x"\n'
    fmt = json.dumps({"type": "grammar", "grammar": grammar}, sort_keys=True)
    body = _client("http://127.0.0.1:1").body(GenerateRequest([1], SamplingParams(response_format=fmt)))
    assert body["structured_outputs"] == {"grammar": grammar} and "response_format" not in body

    def answer(method: str, path: str, body: Any, h: BaseHTTPRequestHandler) -> None:
        if body.get("stream"):
            _sse(h, [_data([5], [-0.1]), _data([2], [-0.2], "stop")])
        else:
            reply(h, 200, _forced_pass(body, {5: -0.5, 2: -0.6}))

    with loopback_server(answer) as (url, rec):
        (chunk,) = _collect(_client(url), GenerateRequest([1], SamplingParams(response_format=fmt)))
    assert chunk.token_ids == [5, 2] and chunk.logprobs == [-0.5, -0.6]  # re-scored unmasked, as a json format
    assert rec.calls[0][2]["structured_outputs"] == {"grammar": grammar}


def test_a_json_format_goes_as_a_grammar_that_ends_the_turn():
    """With the template's end-of-turn id (`end_id`), a json_object / json_schema format reaches vLLM as
    `structured_outputs.grammar`: the format's compact JSON, then that token (`answer_grammar`), so the
    completion ends as the torch engine's does, whatever EOS vLLM's tokenizer names."""
    end = 3
    client = CompletionsClient(lambda: "http://127.0.0.1:1", "roost", CONTEXT, [EOS, end], end_id=end)
    for fmt, schema in (
        ({"type": "json_object"}, {"type": "object"}),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "integer"}}}, {"type": "integer"}),
    ):
        body = client.body(GenerateRequest([1], SamplingParams(response_format=json.dumps(fmt))))
        assert "response_format" not in body
        grammar = body["structured_outputs"]["grammar"]
        assert grammar.startswith(f"start: body <[{end}]>\n")
        assert json.dumps({**schema, "x-guidance": {"whitespace_flexible": False}}, sort_keys=True) in grammar
    text = client.body(GenerateRequest([1], SamplingParams(response_format=json.dumps({"type": "text"}))))
    assert "structured_outputs" not in text and "response_format" not in text
