"""Hostile input: every bad request is a 4xx JSON error and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.testing import RunningServer


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def _claim(srv: RunningServer) -> dict:
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t"}, headers=_h(srv.token))
    assert r.status_code == 200, r.text
    return r.json()


def _assert_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["type"] and "code" in err
    return err


def _alive(srv: RunningServer) -> None:
    r = httpx.get(f"{srv.url}/swarm/v1/status", headers=_h(srv.token))
    assert r.status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        b'{"reward": NaN}',
        b'{"reward": Infinity}',
        b'{"reward": -Infinity}',
        b'{"reward": 1e999}',
        b'{"reward": 1e7}',
        b'{"reward": "1"x}',
        b'{"reward": 0.5',
        b"",
        b"[]",
        b"null",
        b'{"reward": true, "metrics": {"a": NaN}}',
        b'{"reward": 1, "agent_rewards": {"a": 1e300}}',
        b"\xff\xfe",
        b'{"reward": 1, "idempotency_key": ""}',
    ],
)
def test_bad_finish_bodies(server: RunningServer, raw: bytes) -> None:
    ep = _claim(server)
    r = httpx.post(f"{server.url}/swarm/v1/episodes/{ep['episode_id']}/finish", content=raw, headers=_h(ep["api_key"]))
    _assert_error(r, 400)
    _alive(server)
    ok = httpx.post(
        f"{server.url}/swarm/v1/episodes/{ep['episode_id']}/finish", json={"reward": 0.5}, headers=_h(ep["api_key"])
    )
    assert ok.status_code == 200  # the episode was not consumed by the bad attempt


def test_deeply_nested_json(server: RunningServer) -> None:
    raw = b'{"task_id": "t", "metadata": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    r = httpx.post(f"{server.url}/swarm/v1/episodes", content=raw, headers=_h(server.token))
    _assert_error(r, 400)
    assert r.json()["error"] == {**r.json()["error"], "code": "invalid_json"}
    assert "nested too deeply" in r.json()["error"]["message"]  # was FastAPI's "error parsing the body"
    _alive(server)


def test_a_body_that_is_not_utf8_is_said_as_such(server: RunningServer) -> None:
    r = httpx.post(
        f"{server.url}/swarm/v1/episodes",
        content=b'{"task_id": "' + bytes([0xFF, 0xFE]) + b'"}',
        headers={**_h(server.token), "Content-Type": "application/json"},
    )
    _assert_error(r, 400)
    assert r.json()["error"]["code"] == "invalid_json"
    assert "not UTF-8 text (byte 13)" in r.json()["error"]["message"], r.json()


def test_lone_surrogate_in_messages(server: RunningServer) -> None:
    ep = _claim(server)
    raw = b'{"model": "tiny-model", "messages": [{"role": "user", "content": "\\ud800"}]}'
    r = httpx.post(f"{server.url}/v1/chat/completions", content=raw, headers=_h(ep["api_key"]))
    _assert_error(r, 400)
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": [0, 10**12]}, headers=_h(ep["api_key"]))
    _assert_error(r, 400)
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": []}, headers=_h(ep["api_key"]))
    _assert_error(r, 400)
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": ["a", "b"]}, headers=_h(ep["api_key"]))
    _assert_error(r, 400)
    _alive(server)


def test_oversized_bodies(make_server) -> None:
    srv = make_server(max_body_bytes=64 * 1024)
    ep = _claim(srv)
    big = json.dumps({"task_id": "t", "metadata": {"blob": "x" * 200_000}}).encode()
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", content=big, headers=_h(srv.token))
    assert _assert_error(r, 413)["code"] == "body_too_large"

    def chunks():  # no Content-Length: chunked transfer, cut off by the streamed count
        yield b'{"model": "tiny-model", "messages": [{"role": "user", "content": "'
        for _ in range(50):
            yield b"y" * 4096
        yield b'"}]}'

    r = httpx.post(f"{srv.url}/v1/chat/completions", content=chunks(), headers=_h(ep["api_key"]))
    assert "content-length" not in {k.lower() for k in r.request.headers}
    _assert_error(r, 413)
    _alive(srv)
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        json={"model": "tiny-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert r.status_code == 200


@pytest.mark.parametrize(
    "token",
    [
        "Bearer \u00e9t\u00e9".encode("latin-1"),
        b"Bearer rk.x.\xc2\xb2.abc",
        "Bearer rk.x.1.\u00e9".encode("latin-1"),
        b"Bearer",
        b"bearer x",
    ],
)
def test_odd_authorization_headers(server: RunningServer, token: bytes) -> None:
    for method, path in (
        ("POST", "/swarm/v1/episodes"),
        ("GET", "/swarm/v1/status"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/swarm/v1/episodes/x/finish"),
        ("POST", "/swarm/v1/admin/stop"),
        ("GET", "/v1/models"),
    ):
        r = httpx.request(method, f"{server.url}{path}", json={}, headers={"Authorization": token})
        _assert_error(r, 401)
    _alive(server)


def test_unknown_routes_and_methods_are_json(server: RunningServer) -> None:
    _assert_error(httpx.get(f"{server.url}/nope"), 404)
    _assert_error(httpx.get(f"{server.url}/swarm/v1/episodes"), 405)
    _assert_error(httpx.post(f"{server.url}/v1/chat/completions", json={}), 401)
    _assert_error(httpx.post(f"{server.url}/v1/chat/completions", json={}, headers={"Authorization": "Basic abc"}), 401)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.dictionaries(
        st.sampled_from(
            [
                "reward",
                "metrics",
                "agent_rewards",
                "status",
                "idempotency_key",
                "task_id",
                "messages",
                "prompt",
                "max_tokens",
                "stop",
                "n",
                "temperature",
                "seed",
            ]
        ),
        json_values,
        max_size=5,
    ),
    route=st.sampled_from(["finish", "abort", "heartbeat", "claim", "chat", "completions"]),
)
def test_fuzzed_bodies_never_500(fuzz_server: RunningServer, body: dict, route: str) -> None:
    srv = fuzz_server
    ep = _claim_or_reuse(srv)
    url, key = {
        "claim": (f"{srv.url}/swarm/v1/episodes", srv.token),
        "chat": (f"{srv.url}/v1/chat/completions", ep["api_key"]),
        "completions": (f"{srv.url}/v1/completions", ep["api_key"]),
    }.get(route, (f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/{route}", ep["api_key"]))
    r = httpx.post(url, json={**body, "max_tokens": 4} if route in ("chat", "completions") else body, headers=_h(key))
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        _assert_error(r, r.status_code)
    if route == "claim" and r.status_code == 200:
        c = r.json()
        httpx.post(f"{srv.url}/swarm/v1/episodes/{c['episode_id']}/abort", headers=_h(c["api_key"]))


_EPISODE: dict = {}


def _claim_or_reuse(srv: RunningServer) -> dict:
    """One open episode for the fuzz run (a new one once the fuzzer finished or aborted it)."""
    ep = _EPISODE.get(srv.url)
    if ep is None or srv.swarm.registry.get(ep["episode_id"]).state != "open":
        ep = _EPISODE[srv.url] = _claim(srv)
    return ep


@pytest.fixture(scope="module")
def fuzz_server(model_dir, tmp_path_factory):
    from swarm.config.server import ServerConfig
    from swarm.engine.fake import FakeEngine
    from swarm.testing import running_server

    config = ServerConfig(
        engine="fake",
        model_dir=model_dir,
        out_dir=tmp_path_factory.mktemp("fuzz"),
        group_size=1_000_000,
        batch_groups=1_000_000,
        token="w",
        admin_token="a",
    )
    with running_server(config, FakeEngine(model_dir)) as srv:
        yield srv
