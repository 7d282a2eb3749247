"""Requests the Tinker routes refuse: the status, the stable `error.code`, and nothing applied.

"Nothing applied" is checked on the model itself: its forward loss (its weights) and its seq_id
lane are as before the refused request, so the next good request goes through as if it had not
been sent.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from tinker_kit import TinkerHTTP, datum, fwdbwd, proto_fwdbwd, sample_body

pytestmark = pytest.mark.timeout(300)

TOKENS = [5, 17, 42, 9, 33, 8]
TARGETS = [17, 42, 9, 33, 8, 11]
LP = [-6.0] * 6


def _code(r: Any) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


def _loss(t: TinkerHTTP, model_id: str) -> float:
    return t.call("forward", fwdbwd(model_id, [datum(TOKENS, TARGETS)]))["metrics"]["loss:sum"]


def test_bad_training_requests_are_refused_and_change_nothing(tinker_server: Any) -> None:
    _, t = tinker_server()
    sid = t.session()
    m = t.model(sid)
    t.call("forward_backward", fwdbwd(m, [datum(TOKENS, TARGETS)], seq=1))  # gradients accumulated
    before = _loss(t, m)
    bad = {
        "length_mismatch": fwdbwd(m, [datum(TOKENS, TARGETS[:-1])], seq=2),
        "unknown_loss": fwdbwd(m, [datum(TOKENS, TARGETS)], loss="kl_magic", seq=2),
        "missing_loss_input": fwdbwd(m, [datum(TOKENS, TARGETS, logprobs=LP)], "importance_sampling", seq=2),
        "invalid_loss_config": fwdbwd(m, [datum(TOKENS, TARGETS, logprobs=LP, advantages=[1] * 6)], "ppo", 2, x=1.0),
        "invalid_token": fwdbwd(m, [datum([5, 10**6], [1, 2])], seq=2),
        "empty_batch": fwdbwd(m, [], seq=2),
    }
    for code, body in bad.items():
        assert _code(t.post("forward_backward", body)) == (400, code), code
    # NaN advantages, as the SDK sends them (protobuf: JSON has no NaN)
    nan = [datum(TOKENS, TARGETS, logprobs=LP, advantages=[1.0, math.nan, 1, 1, 1, 1])]
    raw = proto_fwdbwd(m, nan, "ppo", 2)
    r = t.http.post("/api/v1/forward_backward", content=raw, headers={"Content-Type": "application/x-protobuf"})
    assert _code(r) == (400, "non_finite_input")
    r = t.http.post("/api/v1/forward_backward", content=b"\xff\xff", headers={"Content-Type": "application/x-protobuf"})
    assert _code(r) == (400, "invalid_protobuf")
    r = t.post("optim_step", {"model_id": m, "seq_id": 2, "adam_params": {"learning_rate": -1e-3}})
    assert _code(r) == (400, "invalid_adam_params")
    r = t.post("optim_step", {"model_id": m, "seq_id": 2, "adam_params": {"learning_rate": 1e-3, "beta1": 1.5}})
    assert _code(r) == (400, "invalid_adam_params")
    assert _loss(t, m) == before  # no weight moved
    # the lane is where it was: seq 2 is still free, and the gradients of seq 1 alone are applied
    step = t.call("optim_step", {"model_id": m, "seq_id": 2, "adam_params": {"learning_rate": 1e-2}})
    assert step["metrics"]["skipped"] == 0 and _loss(t, m) < before


def test_a_second_client_on_the_same_model_is_409(tinker_server: Any) -> None:
    _, t = tinker_server()
    m = t.model(t.session())
    first = fwdbwd(m, [datum(TOKENS, TARGETS)], seq=1)
    rid = t.ok("forward_backward", first)["request_id"]
    assert t.ok("forward_backward", first)["request_id"] == rid  # the same request again: a retry, one future
    t.result(rid)
    before = _loss(t, m)
    other = fwdbwd(m, [datum(TOKENS[:3], TARGETS[:3])], seq=1)  # another client's seq 1
    assert _code(t.post("forward_backward", other)) == (409, "seq_conflict")
    assert _code(t.post("optim_step", {"model_id": m, "seq_id": 1, "adam_params": {}})) == (409, "seq_conflict")
    assert _loss(t, m) == before


def test_unknown_things_are_404(tinker_server: Any) -> None:
    _, t = tinker_server()
    sid = t.session()
    m = t.model(sid)
    assert _code(t.post("forward", fwdbwd("nobody:train:0", [datum(TOKENS, TARGETS)]))) == (404, "model_not_found")
    assert _code(t.post("session_heartbeat", {"session_id": "s-none"})) == (404, "session_not_found")
    body = {"session_id": sid, "model_seq_id": 5, "base_model": "gpt-9", "lora_config": {"rank": 4}}
    assert _code(t.post("create_model", body)) == (404, "unknown_base_model")
    # sampling from a model never saved for sampling
    never = f"tinker://{m}/sampler_weights/never"
    r = t.post("create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "model_path": never})
    assert _code(r) == (404, "checkpoint_not_found")
    sample = {"model_path": never, "prompt": {"chunks": [{"type": "encoded_text", "tokens": TOKENS}]}}
    assert _code(t.post("asample", {**sample, "sampling_params": {"max_tokens": 2}})) == (404, "checkpoint_not_found")
    load = {"model_id": m, "seq_id": 1, "path": f"tinker://{m}/weights/never", "optimizer": False}
    assert _code(t.post("load_weights", load)) == (404, "checkpoint_not_found")
    assert _code(t.post("load_weights", {**load, "path": "tinker://../../etc/weights/x"})) == (400, "invalid_path")
    r = t.post("create_model", {**body, "base_model": "tiny-model", "lora_config": {"rank": 0}})
    assert _code(r) == (400, "full_finetune_unsupported")
    r = t.post("create_model", {**body, "base_model": "tiny-model", "lora_config": {"rank": -3}})
    assert _code(r) == (400, "invalid_request") and "rank must be >= 1" in r.text  # was the rank-0 message
    # nothing named to sample: it sampled the base unasked (create_sampling_session says 400 already)
    r = t.post("asample", {"prompt": sample["prompt"], "sampling_params": {"max_tokens": 2}})
    assert _code(r) == (400, "invalid_request") and "sampling_session_id, model_path or base_model" in r.text


def test_keys(tinker_server: Any) -> None:
    srv, t = tinker_server()
    assert t.http.get("/api/v1/get_server_capabilities", headers={"X-API-Key": "tml-wrong"}).status_code == 401
    assert t.http.get("/api/v1/get_server_capabilities", headers={"X-API-Key": ""}).status_code == 401
    bare = TinkerHTTP(srv.url, key=srv.token)  # the token itself works too; so does Bearer
    assert bare.http.get("/api/v1/get_server_capabilities").status_code == 200
    bare.close()
    r = t.http.get("/api/v1/get_server_capabilities", headers={"X-API-Key": "", "Authorization": f"Bearer {srv.token}"})
    assert r.status_code == 200


def test_swarm_and_primitives_do_not_train_one_policy(tinker_server: Any) -> None:
    srv, t = tinker_server()
    m = t.model(t.session())
    # the swarm trainer's policy `main` is not trainable through the primitives...
    assert _code(t.post("forward_backward", fwdbwd("main", [datum(TOKENS, TARGETS)], seq=1))) == (
        409,
        "policy_trained_by_swarm",
    )
    # ...and the primitives' policy takes no episode claims
    claim = t.http.post(
        "/swarm/v1/episodes",
        headers={"Authorization": f"Bearer {srv.token}"},
        json={"task_id": "t1", "policy": m.replace(":", "-")},
    )
    assert _code(claim) == (409, "policy_trained_by_primitives")
    ok = t.http.post(
        "/swarm/v1/episodes", headers={"Authorization": f"Bearer {srv.token}"}, json={"task_id": "t1", "policy": "main"}
    )
    assert ok.status_code == 200, ok.text


def test_a_session_that_stops_heartbeating_loses_its_models(tinker_server: Any) -> None:
    srv, t = tinker_server()
    srv.app.state.tinker.lease_s = 1.0  # (the lease is the server's, three SDK heartbeats at least: 30 s)
    sid = t.session()
    m = t.model(sid)
    t.call("forward", fwdbwd(m, [datum(TOKENS, TARGETS)]))
    time.sleep(1.3)
    assert _code(t.post("forward_backward", fwdbwd(m, [datum(TOKENS, TARGETS)], seq=1))) == (410, "session_expired")
    assert _code(t.post("session_heartbeat", {"session_id": sid})) == (410, "session_expired")


def test_malformed_bodies_are_one_readable_line(tinker_server: Any) -> None:
    _, t = tinker_server()
    every = ("forward_backward", "forward", "optim_step", "get_info", "create_model", "create_session", "asample")
    cases: list[tuple[tuple[str, ...], dict[str, Any]]] = [
        (every[:-2] + every[-1:], {"json": {}}),
        (every, {"content": b"{not json", "headers": {"Content-Type": "application/json"}}),
        (every[:2], {"json": {"model_id": "x", "forward_backward_input": "garbage"}}),
    ]
    for routes, kw in cases:
        for route in routes:
            r = t.http.post(f"/api/v1/{route}", **kw)
            assert _code(r) == (400, "invalid_request"), (route, kw)
            message = r.json()["error"]["message"]
            assert "'input'" not in message and "'url'" not in message and "[{" not in message, (route, message)
    r = t.post("forward_backward", {})
    assert r.json()["error"]["message"] == "model_id: Field required; forward_backward_input: Field required"
    r = t.post("forward_backward", {"model_id": "x", "forward_backward_input": "garbage"})
    assert r.json()["error"]["message"] == "forward_backward_input: Input should be an object"


def test_an_out_of_vocabulary_prompt_is_refused_before_it_is_queued(tinker_server: Any) -> None:
    srv, t = tinker_server()
    sid = t.session()
    sampler = t.ok(
        "create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "base_model": "tiny-model"}
    )
    vocab = srv.app.state.tinker.host.base.batcher.vocab_size
    for bad in ([5, 999999], [-1, 5], [vocab]):
        body = sample_body(sampler["sampling_session_id"], bad, 1, False, max_tokens=2)
        r = t.post("asample", body)
        assert _code(r) == (400, "invalid_token"), bad
        assert f"[0, {vocab})" in r.json()["error"]["message"]
    ok = t.call("asample", sample_body(sampler["sampling_session_id"], [vocab - 1], 1, False, max_tokens=2))
    assert len(ok["sequences"]) == 1


def test_unknown_ids_and_missing_choices_are_4xx(tinker_server: Any) -> None:
    _, t = tinker_server()
    sid = t.session()
    m = t.model(sid)
    # futures: an id this server never issued is 404; one of its own still answers
    real = t.ok("save_weights", {"model_id": m, "path": "one", "seq_id": 1})["request_id"]
    t.result(real)
    boot, n = real.split("-")
    for rid in ("zzz", "", f"{boot}-{int(n) + 1000}", f"{boot}-0", "0123abcd-1", f"{real} "):
        assert _code(t.post("retrieve_future", {"request_id": rid})) == (404, "future_not_found"), rid
    # sessions: finishing one that never was is 404; a finish is answered again (the SDK retries)
    assert _code(t.post("sessions/nope/finish", {"reason": {"type": "success"}})) == (404, "session_not_found")
    # checkpoints: a run never made here (nor saved) is 404; a live model with saves lists them
    assert _code(t.http.get("/api/v1/training_runs/nope/checkpoints")) == (404, "model_not_found")
    assert _code(t.http.get("/api/v1/training_runs/%2E%2E/checkpoints")) == (404, "model_not_found")
    assert len(t.http.get(f"/api/v1/training_runs/{m}/checkpoints").json()["checkpoints"]) == 1
    # a sampling session of nothing: the SDK's own client refuses it too
    r = t.post("create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0})
    assert _code(r) == (400, "invalid_request")
    # and a finished session's run still lists what it saved
    assert t.post(f"sessions/{sid}/finish", {"reason": {"type": "success"}}).status_code == 200
    assert t.post(f"sessions/{sid}/finish", {"reason": {"type": "success"}}).status_code == 200
    assert _code(t.post("session_heartbeat", {"session_id": sid})) == (404, "session_not_found")
    assert len(t.http.get(f"/api/v1/training_runs/{m}/checkpoints").json()["checkpoints"]) == 1
