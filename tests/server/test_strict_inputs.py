"""Strict inputs (issue 14, item 3): numbers are numbers, the credential is judged before the body,
and every 4xx carries a stable `error.code` (a walk over the error cases, framework ones included)."""

from __future__ import annotations

import httpx
import pytest

from swarm.testing import RunningServer, wait_until

BAD_JSON = b'{"reward": 0.5'


def _h(token: str | None) -> dict[str, str]:
    out = {"Content-Type": "application/json"}
    if token is not None:
        out["Authorization"] = f"Bearer {token}"
    return out


def _claim(srv: RunningServer, task: str = "t") -> dict:
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": task}, headers=_h(srv.token))
    assert r.status_code == 200, r.text
    return r.json()


def _code(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    code = r.json()["error"]["code"]
    assert isinstance(code, str) and code, r.text
    return code


@pytest.mark.parametrize(
    "body",
    [
        {"reward": "0.5"},
        {"reward": True},
        {"reward": None},
        {"reward": [1]},
        {"reward": 1, "agent_rewards": {"a": "1"}},
        {"reward": 1, "metrics": {"m": "0.1"}},
        {"reward": 1, "metrics": {"m": False}},
    ],
)
def test_a_number_sent_as_anything_else_is_400(server: RunningServer, body: dict) -> None:
    ep = _claim(server)
    url = f"{server.url}/swarm/v1/episodes/{ep['episode_id']}/finish"
    assert _code(httpx.post(url, json=body, headers=_h(ep["api_key"])), 400) == "invalid_request"
    # the same item in a batch finish: its own 400, the episode untouched
    item = {**body, "episode_id": ep["episode_id"], "api_key": ep["api_key"]}
    r = httpx.post(f"{server.url}/swarm/v1/finishes", json={"finishes": [item]}, headers=_h(server.token))
    [res] = r.json()["results"]
    assert res["status"] == 400 and res["body"]["error"]["code"] == "invalid_request"
    ok = httpx.post(url, json={"reward": 1, "metrics": {"m": 2}}, headers=_h(ep["api_key"]))  # ints are numbers
    assert ok.status_code == 200, ok.text


def test_other_strict_fields(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/swarm/v1/episodes", json={"task_id": "t", "wait_s": "1"}, headers=_h(server.token))
    assert _code(r, 400) == "invalid_request"
    ep = _claim(server)
    r = httpx.post(
        f"{server.url}/swarm/v1/episodes/{ep['episode_id']}/abort", json={"release": "false"}, headers=_h(ep["api_key"])
    )
    assert _code(r, 400) == "invalid_request"
    admin = _h(server.swarm.config.admin_token)
    for body in ({"lr": "0.1"}, {"batch_groups": 2.0}, {"quotas": {"a": "1"}}):
        assert (
            _code(httpx.post(f"{server.url}/swarm/v1/admin/config", json=body, headers=admin), 400) == "invalid_request"
        )
    ok = httpx.post(f"{server.url}/swarm/v1/admin/config", json={"lr": 0.001, "advantage": "grpo"}, headers=admin)
    assert ok.status_code == 200, ok.text  # enums still take their string values


@pytest.mark.parametrize(
    "knob",
    [
        {"max_tokens": "8"},
        {"max_tokens": 8.0},
        {"n": "2"},
        {"n": True},
        {"temperature": "1"},
        {"top_p": True},
        {"seed": "3"},
        {"top_logprobs": "2"},
        {"stream": "yes"},
        {"stream": 1},
        {"parallel_tool_calls": "false"},
        {"return_token_ids": "true"},
    ],
)
def test_openai_and_anthropic_knobs_are_strict(server: RunningServer, knob: dict) -> None:
    """`"8"` is not 8 (OpenAI answers 400 too): a knob of the wrong type is refused, not coerced."""
    ep = _claim(server)
    msgs = [{"role": "user", "content": "hi"}]
    chat = {"messages": msgs, "max_tokens": 4, **({"logprobs": True} if "top_logprobs" in knob else {}), **knob}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=chat, headers=_h(ep["api_key"]))
    assert _code(r, 400) == "invalid_request"
    if set(knob) <= {"max_tokens", "temperature", "top_p"}:
        r = httpx.post(
            f"{server.url}/v1/messages",
            json={"model": "m", "max_tokens": 4, "messages": msgs, **knob},
            headers=_h(ep["api_key"]),
        )
        assert r.status_code == 400, r.text
    ok = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        json={"messages": msgs, "max_tokens": 4, "n": 1, "temperature": 1, "top_p": 1, "seed": 3},
    )
    assert ok.status_code == 200, ok.text  # ints are numbers where a float is asked


def test_the_credential_is_judged_before_the_body(server: RunningServer) -> None:
    """A malformed body gets 401/403 when the credential is wrong, 400 only when it is right."""
    ep = _claim(server)
    fin = f"{server.url}/swarm/v1/episodes/{ep['episode_id']}/finish"
    admin_cfg = f"{server.url}/swarm/v1/admin/config"
    chat = f"{server.url}/v1/chat/completions"
    cases = [
        (f"{server.url}/swarm/v1/episodes", None, 401, "missing_api_key"),
        (f"{server.url}/swarm/v1/episodes", "nope", 401, "invalid_token"),
        (f"{server.url}/swarm/v1/claims", "nope", 401, "invalid_token"),
        (f"{server.url}/swarm/v1/finishes", None, 401, "missing_api_key"),
        (fin, None, 401, "missing_api_key"),
        (fin, "rk.forged.1.sig", 401, "invalid_api_key"),
        (admin_cfg, None, 401, "missing_api_key"),
        (admin_cfg, server.token, 403, "admin_only"),
        (chat, None, 401, "missing_api_key"),
        (chat, "rk.forged.1.sig", 401, "invalid_api_key"),
        (fin, ep["api_key"], 400, "invalid_json"),
        (admin_cfg, server.swarm.config.admin_token, 400, "invalid_json"),
        (chat, ep["api_key"], 400, "invalid_json"),
    ]
    for url, token, status, code in cases:
        r = httpx.post(url, content=BAD_JSON, headers=_h(token))
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), (url, token, r.text)


def test_every_4xx_has_a_stable_code(make_server) -> None:
    """Walk the error cases a client can hit; each answers its documented code (never null)."""
    srv = make_server(group_size=2, batch_groups=1, lease_seconds=0.3, max_body_bytes=4096)
    u, w = srv.url, _h(srv.token)
    ep = _claim(srv)
    stale = _claim(srv, "t")
    wait_until(lambda: srv.swarm.counters["expired"] >= 2)  # nobody heartbeats: both leases lapse
    expected = {
        "unknown route": (httpx.get(f"{u}/nope", headers=w), 404, "not_found"),
        "wrong method": (httpx.get(f"{u}/swarm/v1/episodes", headers=w), 405, "method_not_allowed"),
        "too large": (httpx.post(f"{u}/swarm/v1/episodes", content=b"x" * 5000, headers=w), 413, "body_too_large"),
        "not json": (
            httpx.post(f"{u}/swarm/v1/episodes", content=b"task_id=t", headers={**w, "Content-Type": "text/plain"}),
            400,
            "invalid_request",
        ),
        "bad json": (httpx.post(f"{u}/swarm/v1/episodes", content=BAD_JSON, headers=w), 400, "invalid_json"),
        "schema": (httpx.post(f"{u}/swarm/v1/episodes", json={"task_id": ""}, headers=w), 400, "invalid_request"),
        "no token": (httpx.get(f"{u}/swarm/v1/status"), 401, "missing_api_key"),
        "bad token": (httpx.get(f"{u}/swarm/v1/status", headers=_h("x")), 401, "invalid_token"),
        "admin only": (httpx.post(f"{u}/swarm/v1/admin/pause", headers=w), 403, "admin_only"),
        "other episode": (
            httpx.post(f"{u}/swarm/v1/episodes/{ep['episode_id']}/heartbeat", headers=_h(_claim(srv, "o")["api_key"])),
            403,
            "wrong_episode",
        ),
        "stale epoch": (
            httpx.post(
                f"{u}/swarm/v1/episodes/{stale['episode_id']}/finish", json={"reward": 1}, headers=_h(stale["api_key"])
            ),
            409,
            "stale_epoch",
        ),
        "unknown model": (
            httpx.post(
                f"{u}/v1/chat/completions",
                headers=w,
                json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
            ),
            404,
            "model_not_found",
        ),
    }
    got = {name: _code(r, status) for name, (r, status, _) in expected.items()}
    assert got == {name: code for name, (_, _, code) in expected.items()}


def test_a_request_no_route_takes_names_the_routes_beside_it(make_server) -> None:
    """`responses.retrieve`, `embeddings.create`, a typo'd path or a wrong method read "Not Found" /
    "Method Not Allowed": the message names what was asked and what the server has instead."""
    srv = make_server(group_size=2, batch_groups=1)
    u, w = srv.url, _h(srv.token)
    r = httpx.get(f"{u}/v1/responses/resp_1", headers=w)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    message = r.json()["error"]["message"]
    assert message.startswith("GET /v1/responses/resp_1 is not a route of this server: responses are kept only")
    assert "POST /v1/chat/completions" in message and "POST /v1/responses" in message
    assert "/swarm/" not in message and "GET /openapi.json" in message  # only the routes beside it
    message = httpx.post(f"{u}/v1/embeddings", json={}, headers=w).json()["error"]["message"]
    assert "serves no embeddings" in message
    message = httpx.get(f"{u}/swarm/v1/episode", headers=w).json()["error"]["message"]
    assert "POST /swarm/v1/episodes" in message and "more" in message and "/v1/chat" not in message
    r = httpx.delete(f"{u}/v1/chat/completions", headers=w)
    assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")
    assert r.json()["error"]["message"] == "DELETE /v1/chat/completions is not a route: /v1/chat/completions takes POST"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses", "/swarm/v1/episodes"])
def test_a_body_that_is_no_json_object_is_said_in_words(server: RunningServer, route: str) -> None:
    """Not pydantic's "body: Input should be a valid dictionary" or "14: JSON decode error": what is wrong
    with the body, and where in it."""
    ep = _claim(server)
    token = server.token if route.startswith("/swarm") else ep["api_key"]
    auth = {"Authorization": f"Bearer {token}"}
    cases = [
        (
            b'{"input": "hi"}',
            auth,
            "invalid_request",
            "the request body must be a JSON object (send Content-Type: application/json)",
        ),
        (
            b'{"input": "hi",\n "x": }',
            _h(token),
            "invalid_json",
            "the request body is not valid JSON: Expecting value: line 2 column 7 (char 22)",
        ),
        (b"[1, 2]", _h(token), "invalid_request", "the request body must be a JSON object, not an array"),
        (
            b"",
            _h(token),
            "invalid_request",
            "the request body is empty: send a JSON object (Content-Type: application/json)",
        ),
    ]
    for content, headers, code, message in cases:
        r = httpx.post(f"{server.url}{route}", content=content, headers=headers)
        assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["message"]) == (400, code, message), content
