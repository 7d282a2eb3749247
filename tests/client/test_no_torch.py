"""The client SDK must run on machines without torch: importing it never loads torch."""

from __future__ import annotations

import subprocess
import sys

import swarm.client


def test_client_imports_without_torch_or_transformers() -> None:
    code = (
        "import sys, swarm.client, swarm.client.cli, swarm.protocol; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "assert not bad, bad; print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_public_api_is_exactly_all() -> None:
    public = sorted(
        n
        for n in vars(swarm.client)
        if not n.startswith("_") and n not in {"annotations"} and not isinstance(getattr(swarm.client, n), type(swarm))
    )
    assert sorted(swarm.client.__all__) == swarm.client.__all__ == public


def test_client_imports_skip_the_store_and_openai() -> None:
    """The two lazy imports in the SDK are there for this: `store` (SQLAlchemy) and `openai` load on use."""
    code = (
        "import sys, swarm.client, swarm.client.cli; "
        "bad = [m for m in ('sqlalchemy', 'sqlmodel', 'openai') if m in sys.modules]; "
        "assert not bad, bad; print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_base_install_is_the_client_and_the_rest_are_extras() -> None:
    """`pip install roost` pulls the client's six packages only; server and researcher are extras."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    base = {d.split(">")[0].split("[")[0].split("=")[0].strip().lower() for d in project["dependencies"]}
    assert base == {"httpx", "openai", "pydantic", "typer", "rich", "pyyaml"}
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["server"]) and "roost[server]" in extras["research"]
    assert any(d.startswith("langchain-openai") for d in extras["research"])
    assert extras["all"] == ["roost[server,research]"] and extras["client"] == []


# ---------------------------------------------------------------- a client-only install against a real server
# .ci/client.sh runs this file with `--noconftest` in a fresh virtualenv holding only `pip install .`,
# against a `swarm serve` started from the full install (ROOST_CLIENT_TEST_URL / ROOST_CLIENT_TEST_TOKEN).

import os  # noqa: E402

import pytest  # noqa: E402

REMOTE = os.environ.get("ROOST_CLIENT_TEST_URL")
remote = pytest.mark.skipif(
    not REMOTE,
    reason="no external server: set ROOST_CLIENT_TEST_URL and "
    "ROOST_CLIENT_TEST_TOKEN (.ci/client.sh does, for a client-only install)",
)


@remote
def test_client_only_install_has_no_server_packages() -> None:
    import importlib.util

    if os.environ.get("ROOST_CLIENT_ONLY") == "1":
        heavy = {"torch", "transformers", "fastapi", "sqlmodel", "mlflow", "langgraph"}
        present = {m for m in heavy if importlib.util.find_spec(m) is not None}
        assert not present, f"a client-only install holds {present}"


@remote
def test_client_only_install_plays_episodes_against_a_real_server() -> None:
    from swarm.client import SwarmClient, run_fleet
    from swarm.tasks import get_task

    token = os.environ["ROOST_CLIENT_TEST_TOKEN"]
    client = SwarmClient(REMOTE, token=token)
    try:
        before = client.status().counters.get("finished", 0)
        with client.episode(task_id="no-torch-1", task_family="no-torch") as ep:  # the README's snippet
            reply = ep.openai.chat.completions.create(
                model=ep.model, messages=[{"role": "user", "content": "What is 12+30?"}], max_tokens=4
            )
            assert reply.choices[0].message.content is not None
            ep.finish(reward=1.0)
        task = get_task("arith")
        stats = run_fleet(client, task.workflow, task.dataset(0, 4), n=1, concurrency=2, epochs=1)
        assert stats.finished == 4 and stats.failed == 0
        assert client.status().counters.get("finished", 0) >= before + 5
    finally:
        client.close()


@remote
def test_client_only_swarm_client_command_runs_a_fleet(tmp_path) -> None:
    token = os.environ["ROOST_CLIENT_TEST_TOKEN"]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm",
            "client",
            "--url",
            REMOTE,
            "--token",
            token,
            "--task",
            "arith",
            "--max-episodes",
            "3",
            "--n",
            "1",
            "--concurrency",
            "1",
            "--quiet",
            "--fresh",
            "--state",
            str(tmp_path / "cursor.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ROOST_HOME": str(tmp_path)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 finished, 0 failed" in r.stdout + r.stderr
