"""`swarm train --attach`: how a run finds its server's URL and tokens in the server's out folder."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from swarm.attach import NoTokens, SharedServer
from swarm.config.options import write_config
from swarm.config.server import ServerConfig


def _server_folder(tmp_path: Path, secrets: dict[str, str]) -> Path:
    out = tmp_path / "base"
    out.mkdir()
    (out / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9"}))
    (out / "secrets.json").write_text(json.dumps(secrets))
    write_config(out / "config.yaml", ServerConfig(out_dir=str(out)))
    return out


def test_tokens_the_server_was_given_come_from_the_environment(tmp_path, monkeypatch):
    """A server started with --token/--admin-token keeps only its generated secret in secrets.json: the
    run read secrets['token'] and died with a KeyError traceback."""
    monkeypatch.delenv("ROOST_TOKEN", raising=False)
    monkeypatch.delenv("ROOST_ADMIN_TOKEN", raising=False)
    out = _server_folder(tmp_path, {"secret": "s"})
    with pytest.raises(NoTokens, match="set ROOST_TOKEN and ROOST_ADMIN_TOKEN to them"):
        SharedServer.find(out)
    t0 = time.monotonic()
    with pytest.raises(NoTokens):  # no waiting for what waiting cannot bring
        SharedServer.wait(out, timeout_s=60)
    assert time.monotonic() - t0 < 10
    monkeypatch.setenv("ROOST_TOKEN", "w")
    monkeypatch.setenv("ROOST_ADMIN_TOKEN", "a")
    found = SharedServer.find(out)
    assert (found.url, found.token, found.admin_token) == ("http://127.0.0.1:9", "w", "a")


def test_generated_tokens_are_read_from_the_servers_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOST_TOKEN", "not this one")
    found = SharedServer.find(_server_folder(tmp_path, {"token": "t", "admin_token": "a", "secret": "s"}))
    assert (found.token, found.admin_token) == ("t", "a")


def test_a_team_runs_folder_names_its_servers(tmp_path):
    from swarm.run_layout import server_address

    for role in ("planner", "executor"):
        (tmp_path / "servers" / role).mkdir(parents=True)
        (tmp_path / "servers" / role / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9"}))
    with pytest.raises(ValueError, match="a run of several servers: give one, executor or planner under servers/"):
        server_address(tmp_path)
    assert server_address(tmp_path / "servers" / "planner").url == "http://127.0.0.1:9"
