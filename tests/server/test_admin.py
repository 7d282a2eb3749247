"""Live control: admin auth, validated partial config, when changes take effect, metrics, pause, `swarm ctl`."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from typer.testing import CliRunner

from swarm.cli import app as cli_app
from swarm.engine.fake import FakeEngine
from swarm.testing import RunningServer, wait_until

MESSAGES = [{"role": "user", "content": "What is 1+1?"}]


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _set(srv: RunningServer, body: dict, token: str | None = None) -> httpx.Response:
    return httpx.post(f"{srv.url}/swarm/v1/admin/config", json=body, headers=_h(token or srv.admin_token))


def _claim(srv: RunningServer, task_id: str, family: str = "default") -> httpx.Response:
    return httpx.post(
        f"{srv.url}/swarm/v1/episodes", json={"task_id": task_id, "task_family": family}, headers=_h(srv.token)
    )


def _call(srv: RunningServer, ep: dict, **extra) -> None:
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        json={"model": "tiny-model", "messages": MESSAGES, "max_tokens": 4, **extra},
    )
    assert r.status_code == 200, r.text


def _finish(srv: RunningServer, ep: dict, reward: float = 1.0) -> None:
    r = httpx.post(
        f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/finish", json={"reward": reward}, headers=_h(ep["api_key"])
    )
    assert r.status_code == 200, r.text


def _episode(srv: RunningServer, task_id: str, **call) -> dict:
    r = _claim(srv, task_id)
    assert r.status_code == 200, r.text
    ep = r.json()
    _call(srv, ep, **call)
    return ep


def _step(srv: RunningServer, n: int) -> None:
    wait_until(lambda: srv.swarm.trainer.step == n and not srv.swarm.batcher.training)


def _rows(srv: RunningServer) -> list[dict]:
    return [json.loads(x) for x in (srv.swarm.out_dir / "metrics.jsonl").read_text().splitlines()]


# -- auth -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "route", ["GET /config", "POST /config", "POST /pause", "POST /resume", "POST /stop", "POST /checkpoint"]
)
def test_admin_routes_need_the_admin_token(server: RunningServer, route: str) -> None:
    method, path = route.split()
    url = f"{server.url}/swarm/v1/admin{path}"
    body = {"lr": 1e-4} if path == "/config" and method == "POST" else None
    assert httpx.request(method, url, json=body).status_code == 401
    r = httpx.request(method, url, json=body, headers=_h("not-the-token"))
    assert r.status_code == 401 and r.json()["error"]["code"] == "admin_only"
    r = httpx.request(method, url, json=body, headers=_h(server.token))  # a worker is known, not allowed
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_only"
    assert server.swarm.trainer.config.lr != 1e-4 and not server.swarm.stopping


# -- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"lr": -1},
        {"lr": 0},
        {"lr": None},
        {"learning_rate": 1e-4},
        {"temperature": 3},
        {"batch_groups": 0},
        {"quotas": {"a": 0.7, "b": 0.7}},
        {"quotas": {"a": 1}, "quota_schedule": [{"from_step": 0, "quotas": {"a": 1}}]},
        {"advantage": "ppo"},
        {"ppo_epochs": 0},
        {"ppo_epochs": 1.5},
        {"batch_groups": None},
        [1, 2],
        {"lr": "fast"},
    ],
)
def test_invalid_updates_are_400_and_change_nothing(server: RunningServer, body) -> None:
    before = httpx.get(f"{server.url}/swarm/v1/admin/config", headers=_h(server.admin_token)).json()
    r = _set(server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] in ("invalid_request", "invalid_json")
    after = httpx.get(f"{server.url}/swarm/v1/admin/config", headers=_h(server.admin_token)).json()
    assert before["live"] == after["live"] and after["pending"] == {}


def test_an_unknown_key_is_answered_with_the_name_meant(server: RunningServer) -> None:
    r = _set(server, {"learning_rate": 1e-4, "temprature": 0.5, "zzz": 1})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "temprature: not a field; did you mean 'temperature'?" in message
    assert "zzz: not a field here (these are: " in message and "lr" in message
    assert "Extra inputs" not in message


# -- effects ----------------------------------------------------------------------------


def test_get_reports_the_live_values(make_server) -> None:
    srv = make_server(temperature=None, quotas={"math": 0.5})
    r = httpx.get(f"{srv.url}/swarm/v1/admin/config", headers=_h(srv.admin_token))
    assert r.status_code == 200
    data = r.json()
    assert data["live"]["lr"] == srv.swarm.config.train.lr and data["live"]["batch_groups"] == 2
    assert data["live"]["quotas"] == {"math": 0.5} and data["quotas"]["slots"] == {"math": 1, "other": 1}
    assert data["paused"] is False and data["pending"] == {}


def test_idle_window_changes_apply_at_once(server: RunningServer) -> None:
    eng: FakeEngine = server.engine
    r = _set(server, {"temperature": 0.25, "default_temperature": 0.5})
    assert r.status_code == 200
    assert r.json()["changed"]["temperature"] == {"old": None, "new": 0.25, "effective": "now"}
    ep = _episode(server, "a", temperature=1.0)
    assert eng.requests[-1].params.temperature == 0.25  # forced
    _set(server, {"temperature": None})  # stop forcing: a window is open now, so this waits
    _call(server, ep)
    assert eng.requests[-1].params.temperature == 0.25
    assert server.swarm.control.pending == {"temperature": None}


def test_window_settings_wait_for_the_next_window(server: RunningServer) -> None:
    eng: FakeEngine = server.engine
    a1 = _episode(server, "a")
    assert eng.requests[-1].params.temperature == 1.0  # the default default
    r = _set(server, {"default_temperature": 0.5, "batch_groups": 1, "lr": 3e-4})
    assert r.status_code == 200, r.text
    changed = r.json()["changed"]
    assert changed["default_temperature"]["effective"] == "next window"
    assert changed["lr"]["effective_step"] == 1
    assert r.json()["pending"] == {"default_temperature": 0.5, "batch_groups": 1}
    a2 = _episode(server, "a")
    assert eng.requests[-1].params.temperature == 1.0  # same window: same temperature
    b = [_episode(server, "b") for _ in range(2)]
    for ep in (a1, a2, *b):
        _finish(server, ep)
    _step(server, 1)
    assert eng.batches[0].config.lr == 3e-4  # training knob: the next step
    assert server.swarm.batcher.batch_groups == 1 and server.swarm.config.batch_groups == 1
    c = [_episode(server, "c") for _ in range(2)]
    assert eng.requests[-1].params.temperature == 0.5
    assert _claim(server, "d").status_code == 429  # B=1 now
    for ep in c:
        _finish(server, ep)
    _step(server, 2)
    rows = _rows(server)
    assert rows[0]["live/lr"] == 3e-4 and rows[0]["live/default_temperature"] == 1.0
    assert rows[0]["live/batch_groups"] == 2
    assert rows[1]["live/default_temperature"] == 0.5 and rows[1]["live/batch_groups"] == 1
    # step 2's window opened (and took the pending settings) while step 1 trained: both events precede row 1
    assert [e["event"] for e in rows[0]["config_changed"]] == ["config_changed", "config_applied"]
    assert rows[0]["config_changed"][1]["effective_step"] == 2 and "config_changed" not in rows[1]
    events = [json.loads(x) for x in (server.swarm.out_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["config_changed", "config_applied"]


def test_lr_change_during_a_step_applies_to_the_step_after(make_server, model_dir) -> None:
    srv = make_server(engine=FakeEngine(model_dir, train_delay_s=0.5), batch_groups=1, group_size=1)
    _finish(srv, _episode(srv, "a"))
    wait_until(lambda: srv.swarm.trainer.running)
    r = _set(srv, {"lr": 5e-5, "kl_coef": 0.1, "ppo_epochs": 2})
    assert r.json()["changed"]["lr"]["effective_step"] == 2
    _step(srv, 1)
    _finish(srv, _episode(srv, "b"))
    _step(srv, 2)
    eng: FakeEngine = srv.engine
    assert eng.batches[0].config.lr != 5e-5 and eng.batches[1].config.lr == 5e-5
    assert eng.batches[1].config.kl_coef == 0.1 and eng.batches[1].config.ppo_epochs == 2
    assert eng.batches[0].config.ppo_epochs == 1
    rows = _rows(srv)
    assert rows[0]["live/lr"] == eng.batches[0].config.lr and rows[1]["live/lr"] == 5e-5


def test_live_quotas(server: RunningServer) -> None:
    r = _set(server, {"quotas": {"math": 0.5, "code": 0.5}})
    assert r.status_code == 200 and r.json()["live"]["quotas"] == {"math": 0.5, "code": 0.5}
    assert _claim(server, "m1", "math").status_code == 200
    r = _claim(server, "m2", "math")
    assert r.status_code == 429 and r.json()["error"]["family"] == "math"
    _set(server, {"quotas": None})  # pending until this window is trained
    assert _claim(server, "m3", "math").status_code == 429


def test_pause_and_resume(server: RunningServer) -> None:
    ep = _episode(server, "a")
    r = httpx.post(f"{server.url}/swarm/v1/admin/pause", headers=_h(server.admin_token))
    assert r.status_code == 200 and r.json()["ok"]
    again = httpx.post(f"{server.url}/swarm/v1/admin/pause", headers=_h(server.admin_token)).json()
    assert again["ok"] and again["message"].startswith("already paused")  # said so; no second event
    r = _claim(server, "b")
    assert r.status_code == 429 and r.json()["error"]["code"] == "paused" and r.headers["retry-after"]
    _call(server, ep)  # running episodes carry on
    _finish(server, ep)
    status = httpx.get(f"{server.url}/swarm/v1/status", headers=_h(server.token)).json()
    assert status["paused"] is True
    assert httpx.post(f"{server.url}/swarm/v1/admin/resume", headers=_h(server.admin_token)).status_code == 200
    again = httpx.post(f"{server.url}/swarm/v1/admin/resume", headers=_h(server.admin_token)).json()
    assert again["ok"] and again["message"] == "not paused: nothing to resume"
    assert _claim(server, "b").status_code == 200
    events = [json.loads(x)["event"] for x in (server.swarm.out_dir / "events.jsonl").read_text().splitlines()]
    assert events == ["paused", "resumed"]


# -- swarm ctl --------------------------------------------------------------------------


def test_ctl_commands(server: RunningServer) -> None:
    runner = CliRunner()

    def ctl(*args: str, token: str | None = None) -> object:
        return runner.invoke(cli_app, ["ctl", "--url", server.url, "--admin-token", token or server.admin_token, *args])

    r = ctl("set", "lr=1e-4", "temperature=0.8", "quota.math=0.5", "quota.code=0.5", "kl=0.05")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["live"]["lr"] == 1e-4
    assert server.swarm.config.temperature == 0.8 and server.swarm.trainer.config.kl_coef == 0.05
    assert server.swarm.control.book.quotas == {"math": 0.5, "code": 0.5}
    r = ctl("get")
    assert r.exit_code == 0 and json.loads(r.output)["live"]["temperature"] == 0.8
    r = ctl("set", "lr=-5")
    assert r.exit_code == 2 and "lr" in r.output
    # settings as `swarm serve`'s flags: "No such option: --lr" before
    r = ctl("set", "--lr", "2e-4", "--temperature=0.7", "--quota.math", "1", "--url", server.url)
    assert r.exit_code == 0, r.output
    assert server.swarm.config.temperature == 0.7 and server.swarm.control.book.quotas == {"math": 1}
    changed = json.loads(ctl("set", "lr=2e-4", "temperature=0.5").output)["changed"]  # lr is 2e-4 already
    assert changed["lr"]["unchanged"] is True and "unchanged" not in changed["temperature"], changed
    r = ctl("set", "--lr")
    assert r.exit_code == 2 and "--lr needs a value: --lr VALUE, or lr=VALUE" in r.output
    assert ctl("get", token="wrong").exit_code == 2
    assert ctl("pause").exit_code == 0 and server.swarm.control.paused
    assert ctl("resume").exit_code == 0 and not server.swarm.control.paused
    r = ctl("status")
    assert r.exit_code == 0 and json.loads(r.output)["step"] == 0
    # where the server is, said after the command: "No such option: --url" before
    r = runner.invoke(cli_app, ["ctl", "status", f"--url={server.url}", "--admin-token", server.admin_token])
    assert r.exit_code == 0 and json.loads(r.output)["step"] == 0, r.output
    r = runner.invoke(cli_app, ["ctl", "--url", "http://127.0.0.1:9", "get", "--url", server.url, "--timeout", "5"])
    assert r.exit_code == 2 and "admin token is required" in r.output  # the last --url won; the token still asked
    r = runner.invoke(cli_app, ["ctl", "status", "--url"])
    assert r.exit_code == 2 and "'--url' requires an argument" in r.output
    r = ctl("checkpoint")
    assert r.exit_code == 0 and "checkpoint" in json.loads(r.output)["message"]
    assert ctl("stop").exit_code == 0
    wait_until(lambda: server.swarm.stopping)


def test_ctl_says_what_was_refused_and_exits_by_one_rule(server: RunningServer, monkeypatch) -> None:
    """A wrong admin token read "invalid worker token" (status) or "admin token required" (the admin routes),
    and `--policy` on a server without policies listed "served: " and nothing. Exit status: 2 for what the
    command line can fix (400, 401, 403, 404), 1 for what the server cannot do now (409)."""
    monkeypatch.delenv("ROOST_ADMIN_TOKEN", raising=False)

    def ctl(*args: str, token: str | None = None, env: dict | None = None) -> tuple[int, str]:
        given = ["--admin-token", token] if token else []
        r = CliRunner().invoke(cli_app, ["ctl", "--url", server.url, *given, *args], env=env)
        return r.exit_code, r.output

    wrong = "the admin token (--admin-token) is not this server's"
    for command in ("status", "get", "pause", "stop"):
        code, said = ctl(command, token="nope")
        assert code == 2 and wrong in said and "worker token" not in said, said
    code, said = ctl("get", env={"ROOST_ADMIN_TOKEN": "nope"})
    assert code == 2 and "the admin token (ROOST_ADMIN_TOKEN) is not this server's" in said, said
    code, said = ctl("get", token=server.token)
    assert code == 2 and "403 admin_only: admin token required: this is the worker token" in said, said
    code, said = ctl("--policy", "foo", "get", token=server.admin_token)
    assert code == 2 and "no policy 'foo': this server has no policies (started without --policy)" in said, said
    code, said = ctl("policy", "add", "critic", token=server.admin_token)
    assert code == 1 and "409 not_a_policy_server" in said, said
    assert not server.swarm.stopping and not server.swarm.control.paused


def test_the_server_says_which_token_it_refused(server: RunningServer) -> None:
    r = httpx.get(f"{server.url}/swarm/v1/status", headers=_h("nope"))
    assert r.json()["error"]["message"] == "the token is neither this server's worker token nor its admin token"
    r = httpx.get(f"{server.url}/swarm/v1/admin/config", headers=_h("nope"))
    assert r.status_code == 401 and "the admin token is not this server's" in r.json()["error"]["message"]


def test_ctl_finds_a_server_by_its_folder(server: RunningServer, tmp_path, monkeypatch) -> None:
    """`swarm train` picks the port and generates the tokens: --server reads them from the run's folder."""
    monkeypatch.delenv("ROOST_ADMIN_TOKEN", raising=False)
    runner = CliRunner()
    run = tmp_path / "run"
    (run / "server").mkdir(parents=True)
    (run / "server" / "server.json").write_text(json.dumps({"url": server.url}))
    (run / "server" / "secrets.json").write_text(json.dumps({"admin_token": server.admin_token}))
    for where in (run, run / "server"):  # a run folder or the server's own
        r = runner.invoke(cli_app, ["ctl", "status", "--server", str(where)])
        assert r.exit_code == 0 and json.loads(r.output)["step"] == 0, r.output
    r = runner.invoke(cli_app, ["ctl", "--server", str(run), "status", "--admin-token", "wrong"])
    assert r.exit_code == 2  # a token on the command line wins over the folder's
    r = runner.invoke(cli_app, ["ctl", "--server", str(run), "--url", server.url, "status"])
    assert r.exit_code == 2 and "give --url or --server, not both" in r.output
    r = runner.invoke(cli_app, ["ctl", "--server", str(tmp_path), "status"])
    out = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 2 and "is not the out folder of a started `swarm serve`" in out
    # a server given its tokens on its command line keeps them out of secrets.json: said so
    (run / "server" / "secrets.json").write_text("{}")
    r = runner.invoke(cli_app, ["ctl", "--server", str(run), "status"], env={"COLUMNS": "300"})
    out = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 2 and "secrets.json holds none (a server given its tokens keeps them)" in out, out
    # a run that has ended: its server.json names a process that is gone
    ended = subprocess.Popen(["true"])
    ended.wait()
    (run / "server" / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": ended.pid}))
    r = runner.invoke(cli_app, ["ctl", "--server", str(run), "--admin-token", "a", "status"])
    assert r.exit_code == 1 and f"(its server, pid {ended.pid}, is not running: its run has ended)" in r.output


# -- restarts ---------------------------------------------------------------------------


def _restart(model_dir, out_dir, **overrides):
    from swarm.config.server import ServerConfig
    from swarm.testing import running_server

    fields = {
        "engine": "fake",
        "model_dir": model_dir,
        "out_dir": out_dir,
        "group_size": 2,
        "batch_groups": 2,
        "checkpoint_every": 0,
        "token": "worker-token",
        "admin_token": "admin-token",
        "stop_grace_s": 0.2,
    }
    return running_server(ServerConfig(**{**fields, **overrides}), FakeEngine(model_dir))


def test_live_settings_survive_a_restart(model_dir, tmp_path) -> None:
    out = tmp_path / "run"
    with _restart(model_dir, out) as srv:
        a = _episode(srv, "a")  # a window is open: the window settings wait as pending
        r = _set(srv, {"lr": 1e-4, "kl_coef": 0.2, "default_temperature": 0.5, "quotas": {"m": 0.5, "c": 0.5}})
        assert r.status_code == 200 and r.json()["pending"]["default_temperature"] == 0.5
        assert httpx.post(f"{srv.url}/swarm/v1/admin/pause", headers=_h(srv.admin_token)).status_code == 200
        del a  # killed with an open episode, pending settings unapplied
    with _restart(model_dir, out) as srv:  # the configured lr is not 1e-4; the operator set 1e-4
        live = httpx.get(f"{srv.url}/swarm/v1/admin/config", headers=_h(srv.admin_token)).json()
        assert live["live"]["lr"] == 1e-4 and live["live"]["kl_coef"] == 0.2
        assert live["live"]["default_temperature"] == 0.5 and live["live"]["quotas"] == {"m": 0.5, "c": 0.5}
        assert live["paused"] is True and live["pending"] == {}
        assert _claim(srv, "b", "m").json()["error"]["code"] == "paused"
        assert httpx.post(f"{srv.url}/swarm/v1/admin/resume", headers=_h(srv.admin_token)).status_code == 200
        r = _claim(srv, "b", "m")  # quotas restored too: family "m" has a slot, "default" none
        assert r.status_code == 200, r.text
        _call(srv, r.json())
        assert srv.engine.requests[-1].params.temperature == 0.5
        assert _claim(srv, "x").json()["error"]["code"] == "quota_exceeded"
        events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
        assert "config_restored" in [e["event"] for e in events]
    with _restart(model_dir, out, resume=False) as srv:  # a fresh run ignores what an earlier one set
        assert srv.swarm.trainer.config.lr != 1e-4 and not srv.swarm.control.paused


def test_a_corrupt_live_file_is_set_aside(model_dir, tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "live_config.json").write_text('{"overrides": {"lr": -3}}')
    with _restart(model_dir, out) as srv:
        assert srv.swarm.trainer.config.lr > 0 and not srv.swarm.control.paused
    assert (out / "live_config.json.invalid").is_file() and not (out / "live_config.json").exists()


def test_an_unknown_policy_on_a_server_without_policies_names_the_model_it_serves(server: RunningServer) -> None:
    """Its one policy is kept under "": the 404 said "served: " and nothing."""
    r = httpx.post(f"{server.url}/swarm/v1/episodes", json={"task_id": "t", "policy": "foo"}, headers=_h(server.token))
    served = server.swarm.config.served_model_name
    assert r.status_code == 404 and r.json()["error"]["message"].endswith(f"served: {served}"), r.text
    assert r.json()["error"]["models"] == [served]


def test_a_start_time_setting_set_live_is_said_as_such(server: RunningServer) -> None:
    """`swarm ctl set distill_coef=1` read "not a field; did you mean 'kl_coef'?": another knob altogether."""
    r = _set(server, {"distill_coef": 1.0})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "distill_coef: set when the server starts" in message, r.text
    assert "swarm serve --distill-coef" in message and "kl_coef" in message  # the live ones are listed
    r = _set(server, {"lrr": 1e-4})
    assert r.status_code == 400 and "did you mean 'lr'?" in r.json()["error"]["message"], r.text  # a typo still
