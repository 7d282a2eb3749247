"""A server of several policies (swarm serve --policy): routing by `model` and `policy`, each policy's own
windows, steps, metrics and checkpoints, adding and removing policies live, and the refusals.

The routing runs on the fake engine (one FakeEngine per policy: fast); the shared LoRA base with a
real model is `test_two_lora_policies_train_apart_on_one_base` at the end."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from swarm.client import SwarmClient
from swarm.config.server import ServerConfig
from swarm.engine.fake import FakePolicyHost
from swarm.testing import RunningServer, running_server, wait_until

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def _config(model_dir: Path, tmp_path: Path, policies: list[dict], **fields) -> ServerConfig:
    base = {"engine": "fake", "group_size": 1, "batch_groups": 1, "stop_grace_s": 0.2, **fields}
    return ServerConfig(
        model_dir=model_dir,
        out_dir=tmp_path / "out",
        token="worker-token",
        admin_token="admin-token",
        policies=policies,
        **base,
    )


def _fake_host(config: ServerConfig) -> FakePolicyHost:
    host = FakePolicyHost(config.model_dir)
    for spec in config.policies or []:
        host.add(spec.name)
    return host


@pytest.fixture
def policy_server(model_dir: Path, tmp_path: Path):
    policies = [{"name": "planner"}, {"name": "executor", "train": {"lr": 5e-5}, "batch_groups": 2}]
    config = _config(model_dir, tmp_path, policies, checkpoint_every=1)
    with running_server(config, _fake_host(config)) as srv:
        yield srv


def _admin(srv: RunningServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {srv.admin_token}"}


def _play(client: SwarmClient, model: str | None, task: str = "t", reward: float = 1.0):
    ep = client.claim(task, model=model)
    r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
    assert r.choices[0].message.content is not None
    return ep, ep.finish(reward)


def test_claims_and_calls_go_to_the_policy_they_name(policy_server: RunningServer) -> None:
    srv = policy_server
    router = srv.app.state.policies
    with SwarmClient(srv.url, srv.token) as client:
        ep, done = _play(client, "planner")
        assert ep.model == "planner" and done.step == 0
        wait_until(lambda: router.swarms["planner"].trainer.step == 1)
        assert router.swarms["executor"].trainer.step == 0  # a window of its own, not yet full
        _play(client, "executor")
        assert router.swarms["executor"].trainer.step == 0  # batch_groups=2 for executor only
        _play(client, None)  # no policy named: the first
        wait_until(lambda: router.swarms["planner"].trainer.step == 2)
        _play(client, "executor")
        wait_until(lambda: router.swarms["executor"].trainer.step == 1)
        assert router.swarms["executor"].engine.batches[0].config.lr == 5e-5
        assert router.swarms["planner"].engine.batches[0].config.lr != 5e-5
        status = SwarmClient(srv.url, srv.token, model="executor").status()
        assert status.model == "executor" and status.step == 1 and status.policies == ["planner", "executor"]
    out = Path(router.swarms["planner"].config.out_dir)
    assert out.name == "planner" and (out / "metrics.jsonl").exists() and (out / "checkpoints").is_dir()
    rows = [json.loads(x) for x in (out.parent / "executor" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1


def test_models_and_unknown_names(policy_server: RunningServer) -> None:
    srv = policy_server
    auth = {"Authorization": f"Bearer {srv.token}"}
    models = httpx.get(f"{srv.url}/v1/models", headers=auth).json()
    assert [m["id"] for m in models["data"]] == ["planner", "executor"]
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t", "policy": "nobody"}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert "planner" in r.json()["error"]["message"] and "executor" in r.json()["error"]["message"]
    body = {"model": "nobody", "messages": MESSAGES, "max_tokens": 2}
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "model": "executor"}, headers=auth)
    assert r.status_code == 200 and r.json()["model"] == "executor"  # an evaluation call of that policy
    with SwarmClient(srv.url, srv.token) as client:  # an episode's call names another policy: 400
        ep = client.claim("t", model="planner")
        key = {"Authorization": f"Bearer {ep.api_key}"}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "model": "executor"}, headers=key)
        assert r.status_code == 400 and r.json()["error"]["code"] == "episode_policy_mismatch"
        assert "plays policy 'planner'" in r.json()["error"]["message"]
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=key)  # unknown: every policy listed
        assert r.status_code == 404 and r.json()["error"]["models"] == ["planner", "executor"]
        ep.finish(0.0)
    # A claim may spell the policy `model`, as its answer does; it used to be ignored (the first policy played).
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t", "model": "executor"}, headers=auth)
    assert r.status_code == 200 and r.json()["model"] == "executor"
    abort = {"Authorization": f"Bearer {r.json()['api_key']}"}
    assert httpx.post(f"{srv.url}/swarm/v1/episodes/{r.json()['episode_id']}/abort", json={}, headers=abort).is_success
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t", "model": "nobody"}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    both = {"task_id": "t", "model": "executor", "policy": "planner"}
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json=both, headers=auth)
    assert r.status_code == 400 and "name different policies" in r.json()["error"]["message"]


def test_policies_added_and_removed_while_serving(policy_server: RunningServer) -> None:
    srv = policy_server
    url = f"{srv.url}/swarm/v1/admin/policies"
    r = httpx.post(url, json={"name": "critic", "train": {"lr": 1e-4}}, headers=_admin(srv))
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "critic"
    assert httpx.post(url, json={"name": "critic"}, headers=_admin(srv)).status_code == 409
    r = httpx.post(url, json={"name": "bad/name"}, headers=_admin(srv))
    assert r.status_code == 400 and "policy name" in r.json()["error"]["message"]
    r = httpx.post(url, json={"name": "x", "train": {"lr": -1}}, headers=_admin(srv))
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "policy x: lr: Input should be greater than or equal to 0"
    r = httpx.post(url, json={"name": "x", "lora": {"rank": "eight"}}, headers=_admin(srv))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("lora.rank: Input should be a valid")
    worker = {"Authorization": f"Bearer {srv.token}"}
    assert httpx.post(url, json={"name": "y"}, headers=worker).status_code == 403
    with SwarmClient(srv.url, srv.token) as client:
        _play(client, "critic")
        wait_until(lambda: srv.app.state.policies.swarms["critic"].trainer.step == 1)
        open_ep = client.claim("t", model="critic")
        r = httpx.delete(f"{url}/critic", headers=_admin(srv))
        assert r.status_code == 200 and r.json()["path"].endswith("step_000001"), r.text
        listed = httpx.get(url, headers=_admin(srv)).json()["policies"]
        assert [p["name"] for p in listed] == ["planner", "executor"]
        r = httpx.post(
            f"{srv.url}/swarm/v1/episodes/{open_ep.id}/finish",
            json={"reward": 1.0},
            headers={"Authorization": f"Bearer {open_ep.api_key}"},
        )
        assert r.status_code == 409 and r.json()["error"]["code"] == "policy_removed"
        r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t", "policy": "critic"}, headers=worker)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        _play(client, "planner")  # the others go on
    assert httpx.delete(f"{url}/nobody", headers=_admin(srv)).status_code == 404
    httpx.delete(f"{url}/executor", headers=_admin(srv))
    r = httpx.delete(f"{url}/planner", headers=_admin(srv))
    assert r.status_code == 409 and r.json()["error"]["code"] == "last_policy"


def test_ctl_names_the_policy_before_or_after_its_command(policy_server: RunningServer) -> None:
    from typer.testing import CliRunner

    from swarm.cli import app as cli_app

    srv = policy_server

    def ctl(*args: str):
        return CliRunner().invoke(cli_app, ["ctl", "--url", srv.url, "--admin-token", srv.admin_token, *args])

    r = ctl("status", "--policy", "executor")  # was "No such option" (the option belonged to the group only)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"] == "executor"
    assert json.loads(ctl("--policy", "executor", "status").output)["model"] == "executor"
    assert json.loads(ctl("status").output)["model"] == "planner"
    r = ctl("set", "lr=2e-5", "--policy", "executor")
    assert r.exit_code == 0, r.output
    assert srv.app.state.policies.swarms["executor"].control.describe().live["lr"] == 2e-5
    assert srv.app.state.policies.swarms["planner"].control.describe().live["lr"] != 2e-5
    r = ctl("--policy", "planner", "status", "--policy", "executor")
    assert r.exit_code == 2 and "two policies named" in r.output
    r = ctl("status", "--policy", "nobody")  # a name the command line can fix: 2, as a bad value (it was 1)
    assert r.exit_code == 2 and "model_not_found" in r.output and "served: planner, executor" in r.output
    # `policy add`'s keys are ctl's own (lora_rank): a misspelt one is named here, nothing is added
    r = ctl("policy", "add", "critic", "lora_rnak=8")
    said = " ".join(r.output.replace("│", " ").split())  # rich's error box, unwrapped
    assert r.exit_code == 2 and "lora_rnak: not a policy setting; did you mean lora_rank?" in said
    assert "critic" not in srv.app.state.policies.swarms
    r = ctl("policy", "add", "critic", "--lora-rank", "4", "--lr=5e-5")  # as serve's flags: "No such option"
    assert r.exit_code == 0, r.output
    assert srv.app.state.policies.swarms["critic"].control.describe().live["lr"] == 5e-5


def test_a_full_parameter_policy_is_refused_at_start(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="share a base train LoRA"):
        ServerConfig(engine="torch", model_dir=model_dir, policies=[{"name": "a"}, {"name": "b"}])
    with pytest.raises(ValueError, match="named more than once"):
        ServerConfig(engine="fake", model_dir=model_dir, policies=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValueError, match="torch and vllm engines, not --engine verl"):
        ServerConfig(engine="verl", model_dir=model_dir, policies=[{"name": "a", "lora": {"rank": 4}}])
    ServerConfig(engine="vllm", model_dir=model_dir, policies=[{"name": "a"}, {"name": "b"}], lora={"rank": 4})
    with pytest.raises(ValueError, match="share a base train LoRA"):  # the same rule on vLLM
        ServerConfig(engine="vllm", model_dir=model_dir, policies=[{"name": "a"}, {"name": "b", "lora": {"rank": 4}}])
    # several vLLM processes each serve every policy's adapters (tests/engine_vllm/test_vllm_policies.py)
    ServerConfig(engine="vllm", model_dir=model_dir, policies=[{"name": "a"}], lora={"rank": 4}, vllm={"replicas": 2})
    with pytest.raises(ValueError, match="rank at most 512"):
        ServerConfig(engine="vllm", model_dir=model_dir, policies=[{"name": "a", "lora": {"rank": 1024}}])
    with pytest.raises(ValueError, match="engine: not a setting a policy can change"):
        ServerConfig(engine="fake", model_dir=model_dir, policies=[{"name": "a", "engine": "torch"}])
    with pytest.raises(ValueError, match="policy b: lr: Input should be greater than or equal to 0"):
        ServerConfig(engine="fake", model_dir=model_dir, policies=[{"name": "a"}, {"name": "b", "train": {"lr": -1}}])
    with pytest.raises(ValueError, match="larger than the width"):  # checked where the model is: at start
        from swarm.config.lora import LoraSettings
        from swarm.engine.policies import PolicyHost

        PolicyHost(model_dir, device="cpu").add("a", LoraSettings(rank=100_000))


def test_each_policy_stops_at_its_own_max_steps_and_the_server_after_the_last(model_dir: Path, tmp_path: Path) -> None:
    config = _config(model_dir, tmp_path, [{"name": "short", "max_steps": 1}, {"name": "long", "max_steps": 2}])
    with running_server(config, _fake_host(config)) as srv:
        router = srv.app.state.policies
        with SwarmClient(srv.url, srv.token) as client:
            _play(client, "short")
            wait_until(lambda: router.swarms["short"].stopping)
            assert not srv.server.should_exit  # "long" still trains
            _play(client, "long")
            _play(client, "long")
        wait_until(lambda: srv.server.should_exit, timeout=15)
        assert router.swarms["long"].trainer.step == 2 and router.swarms["short"].trainer.step == 1


def test_two_lora_policies_train_apart_on_one_base(model_dir: Path, tmp_path: Path) -> None:
    """Real torch engine, one base, two adapters: each policy steps on its own episodes and checkpoints
    its own adapter; a restart resumes each from its own checkpoint."""
    from swarm.engine.policies import PolicyHost

    policies = [{"name": "a"}, {"name": "b", "lora": {"rank": 8}}]
    config = _config(model_dir, tmp_path, policies, engine="torch", group_size=2, checkpoint_every=1, lora={"rank": 4})

    def host() -> PolicyHost:
        h = PolicyHost(model_dir, seed=0, device="cpu")
        for spec in config.policies or []:
            h.add(spec.name, config.for_policy(spec).lora)
        return h

    with running_server(config, host()) as srv:
        router = srv.app.state.policies
        with SwarmClient(srv.url, srv.token) as client:
            for reward in (0.0, 1.0):
                _play(client, "a", reward=reward)
            wait_until(lambda: router.swarms["a"].trainer.step == 1, timeout=60)
            wait_until(lambda: router.swarms["a"].last_checkpoint is not None, timeout=30)
            assert router.swarms["b"].trainer.step == 0 and router.swarms["b"].engine.policy_version == 0
            for reward in (1.0, 0.0):
                _play(client, "b", reward=reward)
            wait_until(lambda: router.swarms["b"].last_checkpoint is not None, timeout=60)
    ckpt_a = tmp_path / "out" / "policies" / "a" / "checkpoints"
    ckpt_b = tmp_path / "out" / "policies" / "b" / "checkpoints"
    assert json.loads(next(ckpt_b.glob("step_*/adapter_config.json")).read_text())["r"] == 8
    assert json.loads(next(ckpt_a.glob("step_*/adapter_config.json")).read_text())["r"] == 4
    with running_server(config.model_copy(update={"resume": True}), host()) as srv:
        router = srv.app.state.policies
        assert router.swarms["a"].trainer.step == 1 and router.swarms["b"].trainer.step == 1
        assert router.swarms["a"].engine.policy_version == 1 and router.swarms["b"].engine.policy_version == 1
        # A policy named at start, removed, comes back under its name and resumes its checkpoint; with
        # another rank it is refused before anything is built, and the refusal frees nothing it holds.
        url = f"{srv.url}/swarm/v1/admin/policies"
        assert httpx.delete(f"{url}/b", headers=_admin(srv), timeout=60).status_code == 200
        r = httpx.post(url, json={"name": "b", "lora": {"rank": 4}}, headers=_admin(srv), timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_policy"
        assert "lora_rank=8" in r.json()["error"]["message"] and "under a new name" in r.json()["error"]["message"]
        r = httpx.post(url, json={"name": "b", "lora": {"rank": 8}}, headers=_admin(srv), timeout=60)
        assert r.status_code == 200 and r.json()["step"] == 1, r.text


def test_a_policy_folder_left_out_of_a_start_is_said(model_dir: Path, tmp_path: Path, caplog) -> None:
    """A restart with the first start's flags dropped the policies added live without a word."""
    (tmp_path / "out" / "policies" / "added-live").mkdir(parents=True)
    config = _config(model_dir, tmp_path, [{"name": "planner"}])
    with caplog.at_level("WARNING", logger="swarm.server"), running_server(config, _fake_host(config)):
        pass
    said = [r.getMessage() for r in caplog.records if "not in this start's list" in r.getMessage()]
    assert len(said) == 1 and "1 policy under" in said[0] and "not served: added-live (" in said[0], said
