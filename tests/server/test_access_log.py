"""`OUT/access.jsonl`: one JSON line per request, with its route, status, error code, latency,
episode and model (issue 23, item 7), read back after real requests to a real server on loopback;
and the file rotated at its size bound.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from swarm.server.access_log import ACCESS_LOG_FILE, AccessLog
from swarm.testing import RunningServer, wait_until


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_request_gets_one_line_with_route_status_code_latency_episode_and_model(make_server) -> None:
    srv: RunningServer = make_server()
    out = srv.swarm.config.out_dir
    claim = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t1"}, headers=_h(srv.token))
    assert claim.status_code == 200, claim.text
    ep = claim.json()
    chat = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        json={"model": ep["model"], "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert chat.status_code == 200, chat.text
    wrong_model = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        json={"model": "no-such-model", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert wrong_model.status_code == 404, wrong_model.text
    # a large body (past what the log parses whole) still shows its model, found by the chunk scan
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 200_000}], "model": "big-one", "max_tokens": 1})
    too_long = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers={**_h(ep["api_key"]), "Content-Type": "application/json"},
        content=big.encode(),
    )
    assert too_long.status_code in (400, 404), too_long.text
    finish = httpx.post(
        f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/finish", json={"reward": 1.0}, headers=_h(ep["api_key"])
    )
    assert finish.status_code == 200, finish.text
    refused = httpx.get(f"{srv.url}/swarm/v1/status", headers=_h("wrong-token"))
    assert refused.status_code == 401, refused.text
    unknown = httpx.get(f"{srv.url}/no/such/path?token=secret-in-query")
    assert unknown.status_code == 404

    path = out / ACCESS_LOG_FILE
    wait_until(lambda: len(_lines(path)) >= 7, timeout=10)
    lines = _lines(path)
    assert len(lines) == 7, lines  # one per request, nothing else
    by_order = dict(zip(["claim", "chat", "wrong_model", "too_long", "finish", "refused", "unknown"], lines))
    for line in lines:
        assert set(line) == {"ts", "method", "route", "path", "status", "code", "ms", "episode", "model"}, line
        assert isinstance(line["ms"], float | int) and 0 <= line["ms"] < 30_000, line

    c = by_order["claim"]
    assert (c["method"], c["route"], c["status"], c["code"]) == ("POST", "/swarm/v1/episodes", 200, None), c
    assert c["episode"] == ep["episode_id"] and c["model"] == ep["model"], c  # from the claim's answer

    c = by_order["chat"]
    assert (c["route"], c["status"], c["code"]) == ("/v1/chat/completions", 200, None), c
    assert c["episode"] == ep["episode_id"] and c["model"] == ep["model"], c  # from the episode key

    c = by_order["wrong_model"]
    assert c["status"] == 404 and c["code"] == wrong_model.json()["error"]["code"] and c["code"], c
    assert c["model"] == "no-such-model" and c["episode"] == ep["episode_id"], c

    c = by_order["too_long"]
    assert c["status"] == too_long.status_code and c["code"] == too_long.json()["error"]["code"], c
    assert c["model"] == "big-one", c

    c = by_order["finish"]
    assert c["route"] == "/swarm/v1/episodes/{episode_id}/finish" and c["status"] == 200, c
    assert c["path"] == f"/swarm/v1/episodes/{ep['episode_id']}/finish" and c["episode"] == ep["episode_id"], c

    c = by_order["refused"]
    assert (c["route"], c["status"], c["code"]) == ("/swarm/v1/status", 401, refused.json()["error"]["code"]), c

    c = by_order["unknown"]
    assert c["route"] is None and c["status"] == 404 and c["path"] == "/no/such/path", c
    text = path.read_text()
    for secret in (srv.token, srv.admin_token, ep["api_key"], "secret-in-query"):
        assert secret not in text  # no headers, keys or query strings


def test_the_log_rotates_at_its_size_and_keeps_its_backups(tmp_path: Path) -> None:
    log = AccessLog(tmp_path / ACCESS_LOG_FILE, max_bytes=1000, backups=2)
    for i in range(100):
        log.write({"i": i, "pad": "x" * 80})
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [ACCESS_LOG_FILE, f"{ACCESS_LOG_FILE}.1", f"{ACCESS_LOG_FILE}.2"], files
    for name in files:
        assert (tmp_path / name).stat().st_size <= 1000
    newest = [json.loads(x)["i"] for x in (tmp_path / ACCESS_LOG_FILE).read_text().splitlines()]
    older = [json.loads(x)["i"] for x in (tmp_path / f"{ACCESS_LOG_FILE}.1").read_text().splitlines()]
    oldest = [json.loads(x)["i"] for x in (tmp_path / f"{ACCESS_LOG_FILE}.2").read_text().splitlines()]
    assert newest[-1] == 99 and older[-1] + 1 == newest[0] and oldest[-1] + 1 == older[0]  # no line lost between
    # reopened, it appends (a restarted server keeps its log) and counts the size it found
    again = AccessLog(tmp_path / ACCESS_LOG_FILE, max_bytes=1000, backups=2)
    again.write({"i": 100})
    again.close()
    assert json.loads((tmp_path / ACCESS_LOG_FILE).read_text().splitlines()[-1]) == {"i": 100}


def test_a_log_that_cannot_be_written_turns_off_and_requests_still_answer(make_server, tmp_path: Path) -> None:
    srv: RunningServer = make_server()
    path = srv.swarm.config.out_dir / ACCESS_LOG_FILE
    path.mkdir(parents=True)  # a directory where the file should be: opening it fails
    r = httpx.get(f"{srv.url}/health")
    assert r.status_code == 200
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t1"}, headers=_h(srv.token))
    assert r.status_code == 200, r.text


def test_a_stream_and_a_body_over_the_limit_are_logged_too(make_server) -> None:
    """A stream's line is written at its end (status 200, the request's model: the answer is not JSON);
    a 413 answered by the body limit, before any route, has its code and no route."""
    srv: RunningServer = make_server(max_body_bytes=100_000)
    claim = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t1"}, headers=_h(srv.token))
    ep = claim.json()
    body = {"model": ep["model"], "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", headers=_h(ep["api_key"]), json=body) as r:
        assert r.status_code == 200
        chunks = list(r.iter_lines())
    assert any("[DONE]" in c for c in chunks), chunks
    big = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        json={"model": ep["model"], "messages": [{"role": "user", "content": "x" * 200_000}]},
    )
    assert big.status_code == 413, big.text
    path = srv.swarm.config.out_dir / ACCESS_LOG_FILE
    wait_until(lambda: len(_lines(path)) >= 3, timeout=10)
    claim_line, stream_line, big_line = _lines(path)
    assert (stream_line["route"], stream_line["status"], stream_line["code"]) == ("/v1/chat/completions", 200, None)
    assert stream_line["model"] == ep["model"] and stream_line["episode"] == ep["episode_id"], stream_line
    assert big_line["status"] == 413 and big_line["code"] == big.json()["error"]["code"], big_line
    assert big_line["path"] == "/v1/chat/completions" and big_line["route"] is None, big_line  # refused unread


def test_a_batchs_line_names_the_episodes_it_claimed_and_finished(make_server) -> None:
    """A fleet's claims and finishes are coalesced into batches, whose lines said `episode: null`: which
    episodes a batch touched could not be told afterwards. They list them now, a refused item's too."""
    srv: RunningServer = make_server()
    claims = httpx.post(
        f"{srv.url}/swarm/v1/claims", json={"claims": [{"task_id": "t1"}, {"task_id": "t2"}]}, headers=_h(srv.token)
    )
    assert claims.status_code == 200, claims.text
    eps = [r["body"] for r in claims.json()["results"]]
    finishes = [{"episode_id": ep["episode_id"], "api_key": ep["api_key"], "reward": 1.0} for ep in eps]
    finishes.append({"episode_id": "0" * 32, "api_key": eps[0]["api_key"], "reward": 1.0})  # refused: no such one
    done = httpx.post(f"{srv.url}/swarm/v1/finishes", json={"finishes": finishes}, headers=_h(srv.token))
    assert done.status_code == 200 and [r["status"] for r in done.json()["results"]][:2] == [200, 200], done.text
    path = srv.swarm.config.out_dir / ACCESS_LOG_FILE
    wait_until(lambda: len(_lines(path)) >= 2, timeout=10)
    claim_line, finish_line = _lines(path)
    ids = [ep["episode_id"] for ep in eps]
    assert claim_line["route"] == "/swarm/v1/claims" and claim_line["episodes"] == ids, claim_line
    assert finish_line["route"] == "/swarm/v1/finishes" and finish_line["episodes"] == [*ids, "0" * 32], finish_line
    assert claim_line["episode"] is None and eps[0]["api_key"] not in path.read_text()  # ids only, never a key
