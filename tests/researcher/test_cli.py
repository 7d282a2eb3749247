"""The `researcher` command line (typer's CliRunner, in-process)."""

from __future__ import annotations

import time

from sqlmodel import Session, select
from typer.testing import CliRunner

from researcher.cli import app
from researcher.runner import store_engine
from store.models import Job, Study, Trial

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"
runner = CliRunner()


def test_dry_run_prints_the_plan_and_launches_nothing():
    res = runner.invoke(app, ["study", TOPIC, "--dry-run", "--steps", "8", "--seeds", "4"])
    assert res.exit_code == 0, res.output
    assert "lr=0" in res.output and "lr=0.0003" in res.output and "8 trials" in res.output
    assert "dry run" in res.output


def test_fewer_than_three_seeds_is_refused():
    res = runner.invoke(app, ["study", TOPIC, "--seeds", "2", "--dry-run"])
    assert res.exit_code != 0


def test_llm_planner_needs_a_configured_model():
    res = runner.invoke(app, ["study", TOPIC, "--planner", "llm", "--dry-run"])
    assert res.exit_code != 0 and "no LLM configured" in res.output


def test_study_status_report_and_stop(fake_program, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_SLEEP", "60")
    res = runner.invoke(app, ["study", TOPIC, "--background", "--steps", "5",
                              "--trial-program", " ".join(fake_program)])
    assert res.exit_code == 0, res.output
    from researcher.daemon import tick

    assert tick() == {1: "waiting"}  # the daemon's tick launches the first trials and returns
    res = runner.invoke(app, ["status", "1"])
    assert res.exit_code == 0 and "RUNNING" in res.output
    assert "ACTIVE" in runner.invoke(app, ["status"]).output
    res = runner.invoke(app, ["report", "1"])
    assert res.exit_code == 0 and "# Study 1" in res.output
    res = runner.invoke(app, ["stop", "1"])
    assert res.exit_code == 0, res.output
    engine = store_engine()
    with Session(engine) as s:
        assert s.get(Study, 1).status == "CANCELLED"
        assert {t.status for t in s.exec(select(Trial)).all()} == {"CANCELLED"}
    from scheduler.manager import JobManager
    from scheduler.records import StoreSink

    mgr = JobManager(StoreSink(engine=engine))
    for _ in range(50):  # the wrapper records CANCELLED once the trial process is gone
        mgr.reconcile()
        with Session(engine) as s:
            states = {j.state for j in s.exec(select(Job)).all()}
        if states == {"CANCELLED"}:
            break
        time.sleep(0.2)
    assert states == {"CANCELLED"}
    assert tick() == {}
