"""The Tinker routes through a real loopback server (torch engine, tiny model): what they do."""

from __future__ import annotations

import time
from typing import Any

import pytest
from tinker_kit import BASE, datum, fwdbwd, sample_body

pytestmark = pytest.mark.timeout(300)

TOKENS = [5, 17, 42, 9, 33, 8]
TARGETS = [17, 42, 9, 33, 8, 11]


def test_capabilities_session_model_and_info(tinker_server: Any) -> None:
    srv, t = tinker_server()
    caps = t.http.get("/api/v1/get_server_capabilities").json()
    assert caps["supported_models"][0]["model_name"] == BASE
    assert caps["supported_models"][0]["trainable"] is True
    sid = t.session()
    assert t.ok("session_heartbeat", {"session_id": sid}) == {"type": "session_heartbeat"}
    model_id = t.model(sid, rank=4)
    assert model_id == f"{sid}:train:0"
    info = t.ok("get_info", {"model_id": model_id})
    assert info["lora_rank"] == 4 and info["is_lora"] is True
    # the new model is a policy of the server: the OpenAI routes list it
    listed = t.http.get("/v1/models", headers={"Authorization": f"Bearer {srv.token}"}).json()["data"]
    names = [m["id"] for m in listed]
    assert model_id.replace(":", "-") in names


def test_forward_backward_then_optim_step_changes_the_logprobs(tinker_server: Any) -> None:
    _, t = tinker_server()
    model_id = t.model(t.session())
    data = [datum(TOKENS, TARGETS, weights=[1.0] * 6)]
    before = t.call("forward", fwdbwd(model_id, data))
    lp0 = before["loss_fn_outputs"][0]["logprobs"]["data"]
    assert len(lp0) == 6 and all(x < 0 for x in lp0)
    assert before["metrics"]["loss:sum"] == pytest.approx(-sum(lp0), rel=1e-5)
    fb = t.call("forward_backward", fwdbwd(model_id, data, seq=1))
    assert fb["metrics"]["loss:sum"] == pytest.approx(before["metrics"]["loss:sum"], rel=1e-5)
    step = t.call("optim_step", {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 1e-2}})
    assert step["metrics"]["grad_norm"] > 0
    after = t.call("forward", fwdbwd(model_id, data))
    assert after["metrics"]["loss:sum"] < before["metrics"]["loss:sum"]  # the cross entropy fell


def test_save_state_load_state_and_the_checkpoint_list(tinker_server: Any) -> None:
    _, t = tinker_server()
    sid = t.session()
    model_id = t.model(sid)
    data = [datum(TOKENS, TARGETS)]
    t.call("forward_backward", fwdbwd(model_id, data, seq=1))
    t.call("optim_step", {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 5e-2}})
    saved = t.call("save_weights", {"model_id": model_id, "path": "one", "seq_id": 3})
    assert saved["path"] == f"tinker://{model_id}/weights/one"
    trained = t.call("forward", fwdbwd(model_id, data))["metrics"]["loss:sum"]
    other = t.model(sid, seq=1)
    fresh = t.call("forward", fwdbwd(other, data))["metrics"]["loss:sum"]
    assert fresh != pytest.approx(trained, abs=1e-4)
    t.call("load_weights", {"model_id": other, "path": saved["path"], "optimizer": True, "seq_id": 1})
    assert t.call("forward", fwdbwd(other, data))["metrics"]["loss:sum"] == pytest.approx(trained, abs=1e-5)
    listed = t.http.get(f"/api/v1/training_runs/{model_id}/checkpoints").json()["checkpoints"]
    assert [c["tinker_path"] for c in listed] == [saved["path"]]
    assert listed[0]["checkpoint_type"] == "training"


def test_sampler_snapshot_is_served_to_the_sdk_and_the_openai_route(tinker_server: Any) -> None:
    srv, t = tinker_server()
    sid = t.session()
    model_id = t.model(sid)
    out = t.call("save_weights_for_sampler", {"model_id": model_id, "path": "v1", "seq_id": 1})
    path = out["path"]
    assert path == f"tinker://{model_id}/sampler_weights/v1"
    sampler = t.ok("create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "model_path": path})
    body = sample_body(sampler["sampling_session_id"], TOKENS, 3, True, max_tokens=5, temperature=1.0, seed=7)
    res = t.call("asample", body)
    assert len(res["sequences"]) == 3
    assert all(1 <= len(q["tokens"]) <= 5 and len(q["logprobs"]) == len(q["tokens"]) for q in res["sequences"])
    assert res["prompt_logprobs"][0] is None and len(res["prompt_logprobs"]) == len(TOKENS)
    # the snapshot's prompt logprobs are the training model's (nothing trained since the save)
    fwd = t.call("forward", fwdbwd(model_id, [datum(TOKENS[:-1], TOKENS[1:])]))
    assert res["prompt_logprobs"][1:] == pytest.approx(fwd["loss_fn_outputs"][0]["logprobs"]["data"], abs=1e-5)
    # and the OpenAI route serves the same snapshot under its model name
    name = f"{model_id.replace(':', '-')}.v1"
    r = t.http.post(
        "/v1/completions",
        headers={"Authorization": f"Bearer {srv.token}"},
        json={"model": name, "prompt": "hello", "max_tokens": 3},
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"] == name


def test_a_finished_session_frees_its_models(tinker_server: Any) -> None:
    srv, t = tinker_server()
    sid = t.session()
    model_id = t.model(sid)
    t.call("save_weights", {"model_id": model_id, "path": "kept", "seq_id": 1})
    assert t.post(f"sessions/{sid}/finish", {"reason": {"type": "success"}, "detail": None}).status_code == 200
    r = t.post("forward", fwdbwd(model_id, [datum(TOKENS, TARGETS)]))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert model_id.replace(":", "-") not in srv.app.state.policies.names()
    assert model_id.replace(":", "-") not in srv.app.state.host.policies
    # what it saved stays loadable
    sid2 = t.session()
    out = t.call("load_weights", {"session_id": sid2, "model_seq_id": 0, "path": f"tinker://{model_id}/weights/kept"})
    assert out["model_id"] == f"{sid2}:train:0"


def test_a_sampler_of_the_base_runs_no_adapter(tinker_server: Any) -> None:
    _, t = tinker_server()
    sid = t.session()
    trained = t.model(sid)
    t.call("forward_backward", fwdbwd(trained, [datum(TOKENS, TARGETS)], seq=1))
    t.call("optim_step", {"model_id": trained, "seq_id": 2, "adam_params": {"learning_rate": 5e-2}})
    fresh = t.model(sid, seq=1)  # an adapter that has not trained is the base
    base_lp = t.call("forward", fwdbwd(fresh, [datum(TOKENS[:-1], TOKENS[1:])]))["loss_fn_outputs"][0]["logprobs"]
    sampler = t.ok("create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "base_model": BASE})
    body = {
        "sampling_session_id": sampler["sampling_session_id"],
        "seq_id": 0,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": TOKENS}]},
        "sampling_params": {"max_tokens": 1},
        "prompt_logprobs": True,
    }
    t.call("forward", fwdbwd(trained, [datum(TOKENS, TARGETS)]))  # the trained adapter is the active one now
    got = t.call("asample", body)["prompt_logprobs"]
    assert got[1:] == pytest.approx(base_lp["data"], abs=1e-5)
    # and its samples are the base's: their logprobs are what the untrained adapter scores them
    t.call("forward", fwdbwd(trained, [datum(TOKENS, TARGETS)]))
    seq = t.call("asample", {**body, "prompt_logprobs": False, "sampling_params": {"max_tokens": 4, "seed": 5}})
    gen = seq["sequences"][0]
    scored = t.call("forward", fwdbwd(fresh, [datum(TOKENS + gen["tokens"][:-1], TOKENS[1:] + gen["tokens"])]))
    tail = scored["loss_fn_outputs"][0]["logprobs"]["data"][-len(gen["tokens"]) :]
    assert tail == pytest.approx(gen["logprobs"], abs=1e-4)


def test_an_expired_session_frees_its_models_as_a_finish_does(tinker_server: Any) -> None:
    srv, t = tinker_server()
    srv.app.state.tinker.lease_s = 1.0  # (the lease is the server's, three SDK heartbeats at least: 30 s)
    auth = {"Authorization": f"Bearer {srv.token}"}
    sid = t.session()
    model_id = t.model(sid)
    name = model_id.replace(":", "-")
    kept = t.call("save_weights", {"model_id": model_id, "path": "kept", "seq_id": 1})["path"]
    chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert t.http.post("/v1/chat/completions", headers=auth, json=chat).status_code == 200
    deadline = time.monotonic() + 10
    while name in srv.app.state.host.policies and time.monotonic() < deadline:  # no request: the sweeper frees it
        time.sleep(0.1)
    assert name not in srv.app.state.host.policies and name not in srv.app.state.policies.names()
    assert name not in [m["id"] for m in t.http.get("/v1/models", headers=auth).json()["data"]]
    r = t.http.post("/v1/chat/completions", headers=auth, json=chat)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # the client is told why (410, as for its session), and what it saved stays loadable
    r = t.post("get_info", {"model_id": model_id})
    assert r.status_code == 410 and r.json()["error"]["code"] == "session_expired"
    assert t.post("session_heartbeat", {"session_id": sid}).status_code == 410
    out = t.call("load_weights", {"session_id": t.session(), "model_seq_id": 0, "path": kept})
    assert out["path"] == kept
    # the SDK's close after the expiry is answered, once and again (a retry)
    assert t.post(f"sessions/{sid}/finish", {"reason": {"type": "success"}}).status_code == 200
    assert t.post(f"sessions/{sid}/finish", {"reason": {"type": "success"}}).status_code == 200
