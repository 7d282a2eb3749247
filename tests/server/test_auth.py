"""Auth: forged and misused keys, wrong tokens, stale epochs, persisted secrets, config files."""

from __future__ import annotations

import json
import re
import stat
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from swarm.config.options import load_config_file
from swarm.config.server import ServerConfig
from swarm.engine.fake import FakeEngine
from swarm.server.bootstrap import SECRETS_FILE, ensure_secrets
from swarm.server.episodes import KeySigner
from swarm.testing import RunningServer, running_server

MESSAGES = [{"role": "user", "content": "hi"}]


def _h(token: str) -> dict[str, bytes]:
    return {"Authorization": f"Bearer {token}".encode()}  # bytes: lets non-ASCII keys through


def _claim(srv: RunningServer, token: str | None = None) -> httpx.Response:
    return httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t"}, headers=_h(token or srv.token))


def _chat(srv: RunningServer, key: str) -> httpx.Response:
    return httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_h(key),
        json={"model": "tiny-model", "messages": MESSAGES, "max_tokens": 2},
    )


def _episode_routes(srv: RunningServer, episode_id: str, key: str) -> list[httpx.Response]:
    base = f"{srv.url}/swarm/v1/episodes/{episode_id}"
    return [
        httpx.post(f"{base}/heartbeat", headers=_h(key)),
        httpx.post(f"{base}/finish", json={"reward": 1.0}, headers=_h(key)),
        httpx.post(f"{base}/abort", json={}, headers=_h(key)),
        _chat(srv, key),
    ]


# -- tokens -----------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["wrong", "worker-tokenx", "worker-toke", "Worker-Token", "wörker", "x" * 5000])
def test_wrong_worker_tokens_get_401(server: RunningServer, token: str) -> None:
    r = httpx.post(
        f"{server.url}/swarm/v1/episodes", json={"task_id": "t"}, headers={"Authorization": f"Bearer {token}".encode()}
    )
    assert r.status_code == 401, r.text
    assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{server.url}/swarm/v1/status", headers=_h("wrong")).status_code == 401
    assert server.swarm.status().open_episodes == 0


def test_no_or_malformed_authorization_header(server: RunningServer) -> None:
    for headers in (
        {},
        {"Authorization": "Basic d29ya2VyOng="},
        {"Authorization": "Bearer"},
        {"Authorization": server.token},
    ):
        r = httpx.post(f"{server.url}/swarm/v1/episodes", json={"task_id": "t"}, headers=headers)
        assert r.status_code == 401


def test_tokens_are_not_episode_keys(server: RunningServer) -> None:
    ep = _claim(server).json()
    for token in (server.token, server.admin_token):
        assert _chat(server, token).status_code == 200  # an evaluation call: generated, never recorded
        assert all(r.status_code == 401 for r in _episode_routes(server, ep["episode_id"], token)[:-1])
    assert server.swarm.registry.get(ep["episode_id"]).calls == []
    assert _claim(server, ep["api_key"]).status_code == 401  # an episode key cannot claim
    assert httpx.get(f"{server.url}/swarm/v1/admin/config", headers=_h(ep["api_key"])).status_code == 401


# -- episode keys ------------------------------------------------------------------------


def test_forged_keys_get_401(server: RunningServer) -> None:
    ep = _claim(server).json()
    eid = ep["episode_id"]
    _, _, epoch, sig = ep["api_key"].split(".")
    forged = [
        f"rk.{eid}.{epoch}.{'0' * len(sig)}",  # wrong signature
        KeySigner("another-secret").sign(eid, int(epoch)),  # another server's secret
        f"rk.{eid}.{int(epoch) + 1}.{sig}",  # epoch edited, signature kept
        f"rk.{eid}.{epoch}.{sig[:-1]}",  # truncated
        f"xx.{eid}.{epoch}.{sig}",
        f"rk.{eid}.{epoch}",
        f"rk.{eid}.-1.{sig}",
        f"rk.{eid}.１.{sig}",  # a non-ASCII digit
        "rk....",
    ]
    for key in forged:
        assert _chat(server, key).status_code == 401, key
        assert all(r.status_code == 401 for r in _episode_routes(server, eid, key)), key
    assert server.swarm.registry.get(eid).state == "open"  # nothing reached the episode
    assert _chat(server, ep["api_key"]).status_code == 200


def test_a_key_works_only_for_its_own_episode(server: RunningServer) -> None:
    a, b = _claim(server).json(), _claim(server).json()
    for r in _episode_routes(server, b["episode_id"], a["api_key"])[:3]:
        assert r.status_code == 403 and r.json()["error"]["code"] == "wrong_episode"
    assert server.swarm.registry.get(b["episode_id"]).state == "open"


def test_stale_epoch_gets_409(server: RunningServer) -> None:
    ep = _claim(server).json()
    reg = server.swarm.registry
    episode = reg.get(ep["episode_id"])
    episode.epoch += 1  # what a lease hand-over does: the old holder's key goes stale
    for r in _episode_routes(server, ep["episode_id"], ep["api_key"]):
        assert r.status_code == 409 and r.json()["error"]["code"] == "stale_epoch", r.text
    assert episode.state == "open" and episode.calls == []
    fresh = reg.key_for(episode)
    assert _chat(server, fresh).status_code == 200


def test_keys_of_a_restarted_server_still_verify(tmp_path: Path, model_dir: Path) -> None:
    base = ServerConfig(
        engine="fake",
        model_dir=model_dir,
        out_dir=tmp_path / "out",
        group_size=2,
        batch_groups=2,
        checkpoint_every=0,
        stop_grace_s=0.1,
    )
    first, source = ensure_secrets(base, env={})
    assert set(source.values()) == {"generated"}
    with running_server(first, FakeEngine(model_dir)) as srv:
        ep = _claim(srv).json()
    second, source = ensure_secrets(base, env={})
    assert set(source.values()) == {"file"}
    assert (second.token, second.admin_token, second.secret) == (first.token, first.admin_token, first.secret)
    with running_server(second, FakeEngine(model_dir)) as srv:
        assert srv.swarm.registry.signer.verify(ep["api_key"]) == (ep["episode_id"], 1)
        assert _chat(srv, ep["api_key"]).status_code != 401  # genuine (the episode itself may be gone)
        assert _claim(srv, first.token).status_code == 200


# -- persisted secrets and sources -------------------------------------------------------


def test_secrets_file_is_private_and_sources_have_an_order(tmp_path: Path, model_dir: Path) -> None:
    base = ServerConfig(engine="fake", model_dir=model_dir, out_dir=tmp_path)
    cfg, _ = ensure_secrets(base, env={})
    path = tmp_path / SECRETS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"token": cfg.token, "admin_token": cfg.admin_token, "secret": cfg.secret}
    assert cfg.token.startswith("swt-") and cfg.admin_token.startswith("swa-") and len(cfg.secret) == 64
    env = {"ROOST_TOKEN": "from-env", "ROOST_SECRET": "env-secret"}
    cfg2, source = ensure_secrets(base.model_copy(update={"admin_token": "given"}), env=env)
    assert (cfg2.token, cfg2.admin_token, cfg2.secret) == ("from-env", "given", "env-secret")
    assert source == {"token": "env", "admin_token": "config", "secret": "env"}
    path.chmod(0o644)
    cfg3, _ = ensure_secrets(base, env={})
    assert cfg3.token == cfg.token and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match="secrets.json"):
        ensure_secrets(base, env={})


# -- config file --------------------------------------------------------------------------


def _serve_config(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict | None = None) -> ServerConfig:
    import swarm.server.app as app_module
    from swarm.cli import app

    seen: list[ServerConfig] = []
    monkeypatch.setattr(app_module, "serve", lambda config, held=None: seen.append(config) or 0)
    r = CliRunner().invoke(app, ["serve", *args], env=env)
    assert r.exit_code == 0, r.output
    return seen[0]


def test_config_file_with_flags_and_env_on_top(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "server.yaml"
    f.write_text(f"""
engine: fake
model_dir: {model_dir}
out_dir: {tmp_path / "run"}
group_size: 4
batch_groups: 6
token: file-token
admin_token: file-admin
default_temperature: 0.7
train:
  lr: 0.001
  kl_coef: 0.2
quota_schedule:
  - {{from_step: 0, quotas: {{math: 0.5, code: 0.5}}}}
  - {{from_step: 10, quotas: {{math: 1.0}}}}
""")
    cfg = _serve_config(
        monkeypatch,
        ["--config", str(f), "--group-size", "3"],
        env={"ROOST_ADMIN_TOKEN": "env-admin", "ROOST_TOKEN": None, "ROOST_SECRET": None},
    )
    assert cfg.engine == "fake" and cfg.model_dir == model_dir and cfg.out_dir == tmp_path / "run"
    assert cfg.group_size == 3 and cfg.batch_groups == 6  # flag over file; file over default
    assert cfg.token == "file-token" and cfg.admin_token == "env-admin"
    assert cfg.train.lr == 0.001 and cfg.train.kl_coef == 0.2 and cfg.default_temperature == 0.7
    assert [p.from_step for p in cfg.quota_schedule] == [0, 10]
    cfg = _serve_config(
        monkeypatch,
        ["--config", str(f), "--lr", "0.01", "--quota", "shell=1"],
        env={"ROOST_ADMIN_TOKEN": None, "ROOST_TOKEN": None, "ROOST_SECRET": None},
    )
    assert cfg.train.lr == 0.01 and cfg.train.kl_coef == 0.2 and cfg.admin_token == "file-admin"
    assert cfg.quotas == {"shell": 1.0} and cfg.quota_schedule is None


def test_json_config_and_quota_flags_without_file(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "server.json"
    f.write_text(json.dumps({"engine": "fake", "model_dir": str(model_dir), "port": 0, "quotas": {"a": 1}}))
    assert _serve_config(monkeypatch, ["--config", str(f)]).quotas == {"a": 1.0}
    cfg = _serve_config(
        monkeypatch, ["--engine", "fake", "--model", str(model_dir), "--quota", "math=0.4", "--quota", "code=0.6"]
    )
    assert cfg.quotas == {"math": 0.4, "code": 0.6}


@pytest.mark.parametrize(
    "content,match",
    [
        ("port: [1, 2", "YAML"),
        ("- 1\n- 2", "mapping"),
        ("bogus_field: 1", "bogus_field"),
        ("quotas: {a: 2}", "quota"),
        ("!!python/object/apply:os.system ['true']", "YAML"),
    ],
)
def test_bad_config_files_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, match: str
) -> None:
    import swarm.server.app as app_module
    from swarm.cli import app

    f = tmp_path / "bad.yaml"
    f.write_text(content)
    monkeypatch.setattr(app_module, "serve", lambda config: pytest.fail("must not start"))
    r = CliRunner().invoke(app, ["serve", "--config", str(f)])
    assert r.exit_code == 2 and re.search(match, r.output), r.output
    r = CliRunner().invoke(app, ["serve", "--engine", "fake", "--quota", "math"])
    assert r.exit_code == 2


def test_load_config_file_reads_plain_data_only(tmp_path: Path) -> None:
    f = tmp_path / "c.yml"
    f.write_text("")
    assert load_config_file(f) == {}
    with pytest.raises(ValueError, match="cannot read"):
        load_config_file(tmp_path / "missing.yaml")


def test_no_server_module_runs_client_supplied_code() -> None:
    """Static guard: nothing in the server evaluates, unpickles or imports what a request names."""
    root = Path(__file__).resolve().parents[2] / "swarm" / "server"
    banned = re.compile(
        r"(?<![\w.])(eval|exec|compile|__import__)\(|pickle|import_module|subprocess|os\.system"
        r"|yaml\.load\(|yaml\.unsafe_load|marshal"
    )
    for path in root.glob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            assert not banned.search(code), f"{path.name}:{n}: {line.strip()}"


def test_serve_generates_persists_and_reuses_secrets(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from swarm.server.app import serve

    for var in ("ROOST_TOKEN", "ROOST_ADMIN_TOKEN", "ROOST_SECRET"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "out"
    config = ServerConfig(
        engine="fake", model_dir=model_dir, out_dir=out, port=0, checkpoint_every=0, stop_grace_s=0.05
    )

    def run_once() -> list[str]:
        lines: list[str] = []
        (out / "server.json").unlink(missing_ok=True)
        t = threading.Thread(
            target=serve, args=(config, FakeEngine(model_dir)), kwargs={"announce": lines.append}, daemon=True
        )
        t.start()
        deadline = time.monotonic() + 30
        while not (out / "server.json").exists() or not any("out dir" in x for x in lines):
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.05)
        url = json.loads((out / "server.json").read_text())["url"]
        saved = json.loads((out / SECRETS_FILE).read_text())
        while httpx.get(f"{url}/health").status_code != 200:  # pragma: no cover - startup race
            time.sleep(0.05)
        assert _claim_url(url, saved["token"]) == 200
        r = httpx.post(f"{url}/swarm/v1/admin/stop", headers=_h(saved["admin_token"]))
        assert r.status_code == 200
        t.join(30)
        assert not t.is_alive()
        return lines

    first = run_once()
    saved = json.loads((out / SECRETS_FILE).read_text())
    assert any(saved["token"] in x for x in first) and any("secrets.json" in x for x in first)
    second = run_once()
    assert json.loads((out / SECRETS_FILE).read_text()) == saved  # reused, not regenerated
    assert any(saved["admin_token"] in x for x in second) and not any("generated" in x for x in second)
    assert "server.json" not in saved and all(saved[k] not in (out / "server.json").read_text() for k in saved)


def _claim_url(url: str, token: str) -> int:
    return httpx.post(f"{url}/swarm/v1/episodes", json={"task_id": "t"}, headers=_h(token)).status_code
