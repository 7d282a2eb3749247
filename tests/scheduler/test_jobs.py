"""Swarm job specs, the in-job supervisors, and trials on the local backend (with a fake `swarm`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sched_helpers import wait_for
from sqlmodel import select

from scheduler import jobs
from scheduler.jobs import Trial, client_fleet_job, make_trial, submit_trial, swarm_server_job
from scheduler.local import LocalBackend
from scheduler.manager import JobManager
from scheduler.records import StoreSink
from scheduler.slurm import render_script
from store.db import get_engine, session_scope
from store.models import JobState, ServerStatus, SwarmServer

FAKE_SWARM = [sys.executable, str(Path(__file__).parent / "fake_swarm.py")]


def test_server_job_spec(tmp_path: Path) -> None:
    spec = swarm_server_job("srv", model="/m/tiny", out_dir=tmp_path / "out", token="s3cret",
                            server_args=["--max-steps", "5"], db_url="sqlite:////x.db", time_limit_s=600, cpus=2)
    i = spec.command.index("--")
    sup, serve = spec.command[:i], spec.command[i + 1:]
    assert sup[1:4] == ["-m", "scheduler.register", "serve"] and "--db" in sup
    assert serve[1:] == ["serve", "--model", "/m/tiny", "--host", "127.0.0.1", "--port", "0",
                         "--out", str(tmp_path / "out"), "--engine", "torch", "--max-steps", "5"]
    assert "s3cret" not in " ".join(spec.command)  # the token travels in the environment
    assert spec.env["ROOST_TOKEN"] == "s3cret" and spec.env["HF_HUB_OFFLINE"] == "1"
    assert (spec.time_limit_s, spec.cpus, spec.setup) == (600, 2, [])


def test_verl_server_starts_ray_first(tmp_path: Path) -> None:
    spec = swarm_server_job("big", model="/m/qwen", out_dir="/runs/x", token="t", engine="verl", nodes=2, gpus=8,
                            cpus=32, host="0.0.0.0", log_dir=str(tmp_path))
    script = render_script(spec)
    head = script.index("ray start --head")
    assert head < script.index("srun --nodes=1") < script.index("scheduler.register serve")
    assert "--num-gpus=8" in script and "export RAY_ADDRESS=" in script and "#SBATCH --gpus-per-node=8" in script
    assert "--engine verl" in script


def test_fleet_job_spec() -> None:
    spec = client_fleet_job("fl", server_name="t1-server", task="guess", token="t", clients=3, group_size=4,
                            concurrency=2, seed=7, dataset_size=64)
    i = spec.command.index("--")
    assert spec.command[i + 1:][1:] == ["client", "--url", "{url}", "--task", "guess", "--n", "4",
                                        "--concurrency", "2", "--seed", "{seed}", "--dataset-size", "64"]
    sup = spec.command[:i]
    assert sup[sup.index("--clients") + 1] == "3" and sup[sup.index("--name") + 1] == "t1-server"


def test_make_trial_pairs_server_and_fleets() -> None:
    trial = make_trial("s1-a-0", model="/m", out_dir="/o", task="arith", fleets=2, group_size=4, seed=3)
    assert trial.server.name == "s1-a-0-server" and [f.name for f in trial.fleets] == ["s1-a-0-fleet0", "s1-a-0-fleet1"]
    assert {f.env["ROOST_TOKEN"] for f in trial.fleets} == {trial.server.env["ROOST_TOKEN"]}
    with pytest.raises(ValueError):
        Trial(group_key="x", server=trial.server, fleets=[])


# ---------------------------------------------------------------- trials on the local backend


@pytest.fixture
def mgr(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobManager]:
    monkeypatch.setattr(jobs, "swarm_argv", lambda: FAKE_SWARM)
    m = JobManager(StoreSink(db_url), {"local": LocalBackend(max_concurrent=4, state_dir=tmp_path / "st",
                                                             kill_wait_s=2)})
    yield m
    for rec in m.sink.active():
        if rec.handle() is not None:
            m.backend("local").cancel(rec.handle(), force=True)  # type: ignore[arg-type]


def _servers(db_url: str) -> list[SwarmServer]:
    with session_scope(get_engine(db_url)) as s:
        return list(s.exec(select(SwarmServer)).all())


@pytest.mark.integration
def test_trial_registers_url_and_fleet_ends_with_server(mgr: JobManager, db_url: str, tmp_path: Path) -> None:
    trial = make_trial("t1", model="/m", out_dir=tmp_path / "out", task="arith", clients=2, seed=1,
                       server_args=["--max-steps", "6"], db_url=db_url, log_dir=str(tmp_path / "logs"))
    trial.server.command[trial.server.command.index("--heartbeat") + 1] = "0.3"
    server, fleet = submit_trial(mgr, trial, backend="local")
    assert server.group_key == fleet.group_key == "t1"

    rows = wait_for(lambda: [r for r in _servers(db_url) if r.status == ServerStatus.UP.value], 30, what="server UP")
    row = rows[0]  # type: ignore[index]
    assert row.name == "t1-server" and row.url.startswith("http://127.0.0.1:") and row.job_id == server.id
    first_beat = row.last_heartbeat
    wait_for(lambda: _servers(db_url)[0].last_heartbeat > first_beat, 10, what="heartbeat")

    done = mgr.wait([server.id, fleet.id], timeout_s=60)
    assert [(r.state, r.exit_code) for r in done] == [(JobState.COMPLETED, 0), (JobState.COMPLETED, 0)]
    assert _servers(db_url)[0].status == ServerStatus.STOPPED.value
    out = mgr.logs(fleet.id)
    # 2 clients, each its own dataset slice: seed (1*100 + fleet 0)*1000 + client i
    assert f"seed=100000 url={row.url} status=200" in out and "seed=100001" in out


@pytest.mark.integration
def test_cancelling_a_trial_stops_server_and_fleet(mgr: JobManager, db_url: str, tmp_path: Path) -> None:
    trial = make_trial("t2", model="/m", out_dir=tmp_path / "out", task="arith", db_url=db_url,
                       log_dir=str(tmp_path / "logs"))
    recs = submit_trial(mgr, trial, backend="local")
    wait_for(lambda: "status=200" in mgr.logs(recs[1].id), 30, what="client connected")
    mgr.cancel_group("t2")
    done = mgr.wait([r.id for r in recs], timeout_s=30)
    assert all(r.state == JobState.CANCELLED for r in done), done
    assert _servers(db_url)[0].status == ServerStatus.STOPPED.value


def test_client_gives_up_without_a_server(db_url: str) -> None:
    res = subprocess.run([sys.executable, "-m", "scheduler.register", "client", "--name", "nobody", "--db", db_url,
                          "--wait", "0.5", "--", "true"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3 and "no UP server named 'nobody'" in res.stderr


def test_server_that_dies_is_marked_down(db_url: str, tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "scheduler.register", "serve", "--name", "dead", "--db", db_url,
                          "--out", str(tmp_path), "--", "bash", "-c", "exit 9"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 9
    assert [(r.name, r.status) for r in _servers(db_url)] == [("dead", ServerStatus.DOWN.value)]
