"""The `researcher` command line (typer's CliRunner, in-process)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from sqlmodel import Session, select
from typer.testing import CliRunner

import researcher.llm as llm
from researcher.cli import app
from researcher.scripted_model import ScriptedChatModel
from store.models import Job, RunSummary, Study, Trial
from store.schema import init_db

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"
runner = CliRunner()


def test_dry_run_prints_the_plan_and_launches_nothing():
    res = runner.invoke(app, ["study", TOPIC, "--dry-run", "--steps", "8", "--seeds", "4"])
    assert res.exit_code == 0, res.output
    assert "lr=0" in res.output and "lr=0.0003" in res.output and "8 trials" in res.output
    assert "dry run" in res.output


def test_a_dry_run_of_a_design_that_cannot_run_shows_it_and_exits_1():
    """It exited 0 below "This design cannot run yet": a script checking designs read it as runnable."""
    res = runner.invoke(
        app, ["study", "Does timeline merging matter? Compare on and off", "--shared-base", "--dry-run"]
    )
    out = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 1 and "This design cannot run yet" in out and "timeline_merge" in out, out
    assert "dry run: nothing launched" in out


def test_verbose_leaves_alembics_lines_out():
    """`-v` printed ~15 alembic plugin and context lines before every command's own."""
    import logging

    logging.getLogger("alembic").setLevel(logging.NOTSET)
    res = runner.invoke(app, ["-v", "status"])
    assert res.exit_code == 0 and logging.getLogger("alembic").getEffectiveLevel() == logging.WARNING


def test_status_without_studies_says_how_to_start_one():
    res = runner.invoke(app, ["status"])
    assert res.exit_code == 0 and "No studies yet" in res.output and "researcher study TOPIC" in res.output


def test_fewer_than_three_seeds_is_refused():
    res = runner.invoke(app, ["study", TOPIC, "--seeds", "2", "--dry-run"])
    assert res.exit_code != 0


def test_the_steps_and_seeds_a_topic_names_are_run_unless_the_command_line_says_otherwise():
    res = runner.invoke(app, ["study", "Does lr 3e-4 beat 0 over 60 steps with 4 seeds?", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "8 trials" in res.output and "[0, 1, 2, 3]" in res.output and "│ 60 " in res.output
    res = runner.invoke(app, ["study", "Does lr 3e-4 beat 0 over 60 steps?", "--dry-run", "--steps", "60"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["study", "Does lr 3e-4 beat 0 over 60 steps?", "--dry-run", "--steps", "40"])
    out = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and "the topic says 60 steps and --steps says 40; drop one" in out
    res = runner.invoke(app, ["study", "Does lr 3e-4 beat 0 with 2 seeds?", "--dry-run"])
    out = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and "the topic names 2 seeds; a study runs at least 3 per arm" in out


def test_an_llm_endpoint_that_is_no_url_is_refused_at_once(monkeypatch):
    monkeypatch.setenv("ROOST_LLM_BASE_URL", "localhost:8000/v1")  # no scheme: it retried for 8 s before
    monkeypatch.setenv("ROOST_LLM_MODEL", "m")
    res = runner.invoke(app, ["study", TOPIC, "--dry-run"])
    out = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and "ROOST_LLM_BASE_URL: 'localhost:8000/v1' is not an http(s) URL" in out


def test_an_empty_topic_is_a_usage_error():
    for topic in ("", "   "):
        res = runner.invoke(app, ["study", topic, "--dry-run"])
        out = " ".join(res.output.replace("│", " ").split())
        assert res.exit_code == 2 and "TOPIC: it is empty: say what to study" in out, out


def test_a_topic_too_short_to_be_a_question_is_a_usage_error_not_a_traceback():
    res = runner.invoke(app, ["study", " lr ", "--dry-run"])  # a ValidationError's traceback before
    out = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and "TOPIC: 'lr' is not a question: say what to study" in out, out


def test_llm_planner_needs_a_configured_model():
    res = runner.invoke(app, ["study", TOPIC, "--planner", "llm", "--dry-run"])
    assert res.exit_code != 0 and "no LLM configured" in res.output


def test_status_shows_each_finished_trials_final_reward(fake_program):
    """A study's trials with their outcome, not only their state: the final reward of each finished one."""
    program = " ".join(fake_program)
    res = runner.invoke(app, ["study", TOPIC, "--steps", "3", "--poll", "0.2", "--trial-program", program])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["status", "1"])
    with Session(init_db()) as s:
        finals = {r.trial_id: r.metrics["final_reward"] for r in s.exec(select(RunSummary)).all()}
    assert res.exit_code == 0 and "final reward" in res.output and len(finals) == 6
    rows = [line for line in res.output.splitlines() if line.startswith("│") and "COMPLETED" in line]
    assert len(rows) == 6
    for row in rows:
        cells = [c.strip() for c in row.split("│")]
        assert cells[5] == f"{finals[int(cells[1])]:.3f}", row


def test_a_model_that_is_not_one_is_refused_before_the_study_is_created(tmp_path, monkeypatch):
    """A wrong --model made every trial exit 2 (its reason in each trial's stderr) and the study "completed"."""
    monkeypatch.chdir(tmp_path)  # short paths: the error box wraps long ones
    for model, said in (("nope", "does not exist"), (".", "no config.json")):
        res = runner.invoke(app, ["study", TOPIC, "--model", model, "--background"])
        out = " ".join(res.output.replace("│", " ").split())
        assert res.exit_code == 2 and f"--model: {model}" in out and said in out, out
    with Session(init_db()) as s:
        assert s.exec(select(Study)).all() == []


def test_relative_model_and_out_are_kept_absolute_for_the_daemon_and_resume(tmp_path, monkeypatch, fake_program):
    """The trials and a resumed study run from wherever the daemon or `resume` starts: a relative --model
    meant another folder there, and --out was forgotten (report.html went to ./studies/study-N)."""
    from researcher.cli_output import export_html
    from researcher.runner import load_config

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(
        app,
        ["study", TOPIC, "--model", "m", "--out", "rep", "--background", "--trial-program", " ".join(fake_program)],
    )
    assert res.exit_code == 0, res.output
    cfg = load_config(init_db(), 1)
    assert cfg.model_dir == str(tmp_path / "m") and cfg.report_out == str(tmp_path / "rep")
    monkeypatch.chdir(tmp_path / "m")  # `researcher resume 1` from another folder
    assert export_html(1) == tmp_path / "rep" / "report.html"


def test_an_interrupt_while_mlflow_loads_names_the_study_it_leaves(monkeypatch, fake_program):
    """The row is committed before the MLflow run is made (seconds of imports): an interrupt there said
    only "`researcher status` lists it if it was", and its report printed `?`, `None` and "0 ()"."""
    import researcher.runner

    def interrupted(engine, study_id):
        raise KeyboardInterrupt

    monkeypatch.setattr(researcher.runner, "_ensure_study_run", interrupted)
    res = runner.invoke(app, ["study", TOPIC, "--background", "--trial-program", " ".join(fake_program)])
    out = " ".join(res.output.split())
    assert res.exit_code == 130 and "study 1 was created" in out and "researcher resume 1" in out, out
    report = runner.invoke(app, ["report", "1"]).output
    assert "not framed yet" in report and "- Trials: 0;" in report and "no parent run yet" in report, report
    assert "None" not in report and "`?`" not in report, report


def test_a_background_study_says_when_no_daemon_will_drive_it(fake_program):
    """It said "left to the daemon" with none running: the study then waited, silently, for ever."""
    from scheduler.daemon import lock_path, running_daemon
    from store.db import database_url

    args = ["study", TOPIC, "--background", "--trial-program", " ".join(fake_program)]
    assert running_daemon() is None
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "no researcher daemon runs on this machine" in res.output, res.output
    path = lock_path(database_url(None))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))  # as a live daemon's lock file holds its pid
    assert running_daemon() == os.getpid()
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "no researcher daemon" not in res.output, res.output


def test_stop_keeps_the_trials_that_finished_before_it(fake_program, monkeypatch):
    """With no daemon ticking, a trial whose job had exited was still RUNNING in the store, and `stop`
    marked it CANCELLED: its summary.json was there, its result left out of the report."""
    monkeypatch.setenv("FAKE_TRIAL_SLEEP", "0")
    res = runner.invoke(
        app, ["study", TOPIC, "--background", "--steps", "5", "--trial-program", " ".join(fake_program)]
    )
    assert res.exit_code == 0, res.output
    from researcher.daemon import tick
    from scheduler.manager import JobManager
    from scheduler.records import StoreSink

    assert tick() == {1: "waiting"}  # launches the first trials; nothing ticks after it
    engine = init_db()
    with Session(engine) as s:
        trials = s.exec(select(Trial)).all()
        launched = {t.id for t in trials if t.status == "RUNNING"}
        done_in_tick = {t.id for t in trials if t.status == "COMPLETED"}  # a slow tick saw the first ones end
    assert launched
    mgr = JobManager(StoreSink(engine=engine))
    for _ in range(300):  # the jobs exit; the trials' rows still say RUNNING
        mgr.reconcile()
        with Session(engine) as s:
            jobs = s.exec(select(Job)).all()
        if len(jobs) == len(launched | done_in_tick) and {j.state for j in jobs} == {"COMPLETED"}:
            break
        time.sleep(0.2)
    with Session(engine) as s:
        assert {t.status for t in s.exec(select(Trial)).all() if t.id in launched} == {"RUNNING"}
    res = runner.invoke(app, ["stop", "1"])
    assert res.exit_code == 0, res.output
    with Session(engine) as s:
        status = {t.id: t.status for t in s.exec(select(Trial)).all()}
    assert {status[i] for i in launched} == {"COMPLETED"}, status
    assert set(status.values()) <= {"COMPLETED", "CANCELLED"}, status
    report = runner.invoke(app, ["report", "1"]).output
    assert f"completed {len(launched | done_in_tick)}" in report, report  # "- Trials: 6 (cancelled 4, completed 2)"


def test_study_status_report_and_stop(fake_program, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_SLEEP", "60")
    res = runner.invoke(
        app, ["study", TOPIC, "--background", "--steps", "5", "--trial-program", " ".join(fake_program)]
    )
    assert res.exit_code == 0, res.output
    from researcher.daemon import tick

    assert tick() == {1: "waiting"}  # the daemon's tick launches the first trials and returns
    res = runner.invoke(app, ["status", "1"])
    assert res.exit_code == 0 and "RUNNING" in res.output
    listed = runner.invoke(app, ["status"]).output
    assert "ACTIVE" in listed
    with Session(init_db()) as s:
        n = len(s.exec(select(Trial)).all())
    assert f"│ 1  │ ACTIVE │ {n:<6} │" in listed  # the study's row counts its trials
    res = runner.invoke(app, ["report", "1"])
    assert res.exit_code == 0 and "# Study 1" in res.output
    res = runner.invoke(app, ["stop", "1"])
    assert res.exit_code == 0, res.output
    engine = init_db()
    with Session(engine) as s:
        assert s.get(Study, 1).status == "CANCELLED"
        assert {t.status for t in s.exec(select(Trial)).all()} == {"CANCELLED"}
        run_id = s.get(Study, 1).mlflow_run_id
    from store.tracking import get_client

    assert get_client().get_run(run_id).info.status == "KILLED"  # stopped by hand: not FINISHED in MLflow
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
    report = runner.invoke(app, ["report", "1"]).output
    for args, message in (
        (["stop", "1"], "study 1 has ended (CANCELLED): nothing to stop"),
        (["approve", "1"], "study 1 is not waiting for approval: it is CANCELLED"),
        (["resume", "1"], "study 1 has ended (CANCELLED): nothing to resume"),  # exit 0, HTML rewritten, before
        (["stop", "7"], "no study 7"),
        (["resume", "7"], "no study 7"),
        (["status", "7"], "no study 7"),  # it was a usage error box, unlike the others
    ):
        res = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert res.exit_code == 1 and message in res.output, (args, res.output)
    assert runner.invoke(app, ["report", "1"]).output == report  # refused: nothing rewritten


def test_status_records_trials_whose_jobs_exited_since_the_driver_last_looked(fake_program):
    """`status N` showed RUNNING until the daemon's next tick (or for good, with nothing driving the study)."""
    res = runner.invoke(
        app, ["study", TOPIC, "--background", "--steps", "5", "--trial-program", " ".join(fake_program)]
    )
    assert res.exit_code == 0, res.output
    from researcher.daemon import tick

    assert tick() == {1: "waiting"}  # launches the first trials; no tick after this one
    engine = init_db()
    with Session(engine) as s:
        launched = [t.id for t in s.exec(select(Trial)).all() if t.status == "RUNNING"]
    assert launched
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # each job's wrapper writes exit.json beside its logs as it ends
        with Session(engine) as s:
            logs = [Path(j.stdout_path or "") for j in s.exec(select(Job)).all()]
        if len(logs) == len(launched) and all((p.parent / "exit.json").exists() for p in logs):
            break
        time.sleep(0.2)
    res = runner.invoke(app, ["status", "1"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    with Session(engine) as s:
        status = {t.id: t.status for t in s.exec(select(Trial)).all()}
    assert {status[i] for i in launched} == {"COMPLETED"}, status
    assert "RUNNING" not in res.output and "COMPLETED" in res.output, res.output


def test_a_completed_study_is_not_stopped_or_approved_and_its_report_stays(fake_program):
    """`researcher stop` on a finished study rewrote it as CANCELLED and its report as "stopped early"."""
    res = runner.invoke(
        app, ["study", TOPIC, "--steps", "5", "--poll", "0.2", "--trial-program", " ".join(fake_program)]
    )
    assert res.exit_code == 0 and "Study 1 completed" in res.output, res.output
    with Session(init_db()) as s:
        before = s.get(Study, 1).report
    for args in (["stop", "1"], ["approve", "1"], ["approve", "1", "--reject"]):
        res = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert res.exit_code == 1 and "COMPLETED" in res.output, (args, res.output)
    with Session(init_db()) as s:
        study = s.get(Study, 1)
        assert study.status == "COMPLETED" and study.report == before and "Stopped early" not in before


def test_a_study_left_to_the_daemon_leaves_its_html_where_it_was_started(fake_program, tmp_path, monkeypatch):
    """report.html reached ./studies/study-N only when a foreground study ended: a study the daemon drove (or
    `stop` ended) left none, and a copy made mid-run (`report --html`) stayed stale; that copy said "No round
    was planned" of a round whose trials were running."""
    from researcher.runner import advance, drive

    monkeypatch.chdir(tmp_path)
    program = ["--trial-program", " ".join(fake_program)]
    res = runner.invoke(app, ["study", TOPIC, "--background", "--steps", "5", "--poll", "0.2", *program])
    assert res.exit_code == 0, res.output
    assert advance(1).state == "waiting"  # a daemon's tick: planned, trials launched
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # `report --html` from another folder: the copy still lands where it started
    res = runner.invoke(app, ["report", "1", "--html"], env={"COLUMNS": "300"})
    copy = tmp_path / "studies" / "study-1" / "report.html"
    assert res.exit_code == 0 and copy.exists(), res.output
    mid_run = copy.read_text()
    assert "1 (running)" in mid_run and "No round was planned" not in mid_run
    assert drive(1, poll_s=0.2).state == "done"  # the daemon's ticks, to the end
    with Session(init_db()) as s:
        study_dir = Path(s.get(Study, 1).config["study_dir"])
    assert copy.read_text() == (study_dir / "report" / "report.html").read_text() != mid_run
    assert not (elsewhere / "studies").exists()


@pytest.mark.parametrize(("extra", "parallel"), [([], 12), (["--parallel", "3"], 3)])
def test_shared_base_runs_a_rounds_trials_at_once_unless_parallel_says_otherwise(fake_program, extra, parallel):
    program = ["--trial-program", " ".join(fake_program)]
    res = runner.invoke(app, ["study", TOPIC, "--shared-base", "--background", "--steps", "5", *program, *extra])
    assert res.exit_code == 0, res.output
    with Session(init_db()) as s:
        (study,) = s.exec(select(Study)).all()
    assert study.config["shared_base"] is True and study.config["parallel"] == parallel
    runner.invoke(app, ["stop", str(study.id)])


# ---------------------------------------------------------------- issue 16: the CLI never surprises


def test_help_shows_every_default():
    """The rich help renderer ate bracketed text: "[default: 40]" written into a help string vanished."""
    res = runner.invoke(app, ["study", "--help"], terminal_width=250, env={"COLUMNS": "250"})
    assert res.exit_code == 0
    for default in (
        "default: 40",
        "default: (llm if configured, else rules)",
        "default: 3",
        "default: foreground",
        "default: (the embedded model)",
        "default: 1h",
        "default: (no limit)",
    ):
        assert default in res.output, default
    options = [line for line in res.output.splitlines() if line.lstrip("│ ").startswith("--") and "--help" not in line]
    assert options and all("default:" in line for line in options), [o for o in options if "default:" not in o]


@pytest.mark.parametrize(
    "option, value", [("--wall-clock", "5x"), ("--trial-time-limit", "an hour"), ("--deadline", "tomorrowish")]
)
def test_a_bad_duration_is_a_usage_error_not_a_traceback(option, value):
    res = runner.invoke(app, ["study", TOPIC, "--dry-run", option, value])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert option in res.output and value in res.output and "Traceback" not in res.output


def test_the_dry_run_names_its_planner():
    res = runner.invoke(app, ["study", TOPIC, "--dry-run"])
    assert res.exit_code == 0 and "Planner: rules" in res.output


def test_a_topic_outside_the_rules_planners_knobs_is_refused_with_what_it_can_study():
    res = runner.invoke(app, ["study", "Does Adam beat SGD?", "--dry-run"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "error: the rules planner cannot study the optimizer" in res.output
    assert "lr: learning rate" in res.output and "hint:" in res.output
    res = runner.invoke(app, ["study", "Does Adam beat SGD?", "--steps", "2"])  # refused before any study exists
    assert res.exit_code == 1 and _studies() == []


def test_a_trial_budget_too_small_for_the_design_is_refused_up_front():
    res = runner.invoke(
        app, ["study", "Does the learning rate matter for arithmetic?", "--steps", "2", "--max-trials", "2"]
    )
    assert res.exit_code == 1, res.output
    assert "error: a trial budget of 2 cannot cover even the smallest design" in res.output
    assert "--max-trials" in res.output and _studies() == []
    res = runner.invoke(app, ["study", "learning rate 0 vs 1e-4 vs 3e-4", "--dry-run", "--max-trials", "6"])
    assert res.exit_code == 0 and "6 trials" in res.output and "Shrunk to fit the trial budget of 6" in res.output


def _llm_env(monkeypatch) -> None:
    monkeypatch.setenv("ROOST_LLM_BASE_URL", "http://127.0.0.1:9/v1")  # discard port: connection refused
    monkeypatch.setenv("ROOST_LLM_MODEL", "some-model")
    monkeypatch.setenv("ROOST_LLM_WAIT_S", "0")  # these tests are about the error's form, not the wait


def _studies() -> list[Study]:
    with Session(init_db()) as s:
        return list(s.exec(select(Study)).all())


def test_an_unreachable_llm_endpoint_is_one_line_and_a_hint(monkeypatch, fake_program):
    _llm_env(monkeypatch)
    monkeypatch.setenv(llm.ENV_ALLOW, "1")  # a real request, to a closed port on loopback
    with llm.model_requests_allowed(True):
        res = runner.invoke(app, ["study", TOPIC, "--dry-run"])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
        assert "error: cannot reach the LLM endpoint http://127.0.0.1:9/v1" in res.output
        assert "hint:" in res.output and "Traceback" not in res.output and len(res.output.splitlines()) <= 4
        debug = runner.invoke(app, ["--debug", "study", TOPIC, "--dry-run"])
        assert isinstance(debug.exception, llm.LLMUnreachable)
        res = runner.invoke(app, ["study", TOPIC, "--steps", "2", "--trial-program", " ".join(fake_program)])
    # a study: left FAILED (the daemon does not retry it every tick), resumable
    assert res.exit_code == 1 and "researcher resume 1" in res.output, res.output
    assert [s.status for s in _studies()] == ["FAILED"]


def test_an_invalid_planner_answer_after_retries_is_one_line_and_a_hint(monkeypatch, fake_program):
    _llm_env(monkeypatch)
    with llm.override_model(ScriptedChatModel(script=lambda messages: "I think lr matters.")):
        res = runner.invoke(app, ["study", TOPIC, "--dry-run"])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
        assert "error: no valid Frame after 3 attempts" in res.output and "hint:" in res.output
        # a study: ends with the reason in its report
        res = runner.invoke(app, ["study", TOPIC, "--steps", "2", "--trial-program", " ".join(fake_program)])
    assert res.exit_code == 0 and "Stopped early:** the llm planner gave no valid answer" in res.output
    assert "Planner: llm (model `some-model`" in _studies()[0].report


def test_daemon_and_report_refusals_are_lines_not_tracebacks(fake_program):
    """A second daemon printed "tick every" then a DaemonAlreadyRunning traceback; --interval 0 a ValueError
    from the scheduler; `report --html --out` into what cannot hold it a FileNotFoundError from the copy."""
    from scheduler.daemon import lock_path
    from store.db import database_url

    res = runner.invoke(app, ["daemon", "--interval", "0"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--interval" in res.output, res.output
    lock = lock_path(database_url())
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(str(os.getpid()))  # as a running daemon leaves it
    res = runner.invoke(app, ["daemon"], env={"COLUMNS": "200"})
    assert res.exit_code == 1 and f"a daemon (pid {os.getpid()}) already serves this database" in res.output
    assert "tick every" not in res.output and "Traceback" not in res.output
    lock.unlink()
    res = runner.invoke(
        app, ["study", TOPIC, "--steps", "5", "--poll", "0.2", "--trial-program", " ".join(fake_program)]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", "1", "--html", "--out", "/proc/nope"], env={"COLUMNS": "200"})
    out = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and "cannot create /proc/nope" in out, res.output


@pytest.mark.parametrize(
    "args, says",
    [
        (["--trial-time-limit", "0"], "trial_time_limit_s"),  # became the default hour in silence
        (["--deadline", "2020-01-01T00:00"], "has passed already"),  # a study that launched nothing, "completed"
        (["--max-seeds", "3", "--seeds", "4"], "--max-seeds 3 is fewer than --seeds 4"),
        (["--dataset", "foo:bar"], "--dataset feeds a --workflow of yours"),  # trials ran the task's own
        (["--early-stop", "--shared-base"], "--early-stop: trials sharing one server"),  # switched off in silence
    ],
)
def test_options_that_were_bent_or_dropped_in_silence_are_refused(args, says):
    res = runner.invoke(app, ["study", TOPIC, "--dry-run", *args], env={"COLUMNS": "200"})
    out = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and says in out, res.output


def test_a_study_whose_every_trial_failed_is_failed_and_says_why(fake_program, monkeypatch):
    """It was COMPLETED, "too few seeds to say", and each trial's note said only its exit code."""
    monkeypatch.setenv("FAKE_TRIAL_FAIL_ALL", "1")
    res = runner.invoke(
        app,
        ["study", TOPIC, "--steps", "5", "--poll", "0.2", "--trial-program", " ".join(fake_program)],
        env={"COLUMNS": "300"},
    )
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "Study 1 failed" in out and "every trial failed; the first: " in out, res.output
    assert "no model.safetensors in the model folder" in out, res.output
    with Session(init_db()) as s:
        assert s.get(Study, 1).status == "FAILED"


def test_approving_a_study_whose_plan_is_not_made_yet_says_so(fake_program):
    """It said "not waiting for approval: it is ACTIVE" and "a study started with --approve waits for one",
    which this study was started with."""
    res = runner.invoke(
        app, ["study", TOPIC, "--approve", "--background", "--steps", "5", "--trial-program", " ".join(fake_program)]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["approve", "1", "--reject"], env={"COLUMNS": "300"})
    out = " ".join(res.output.split())
    assert res.exit_code == 1 and "it is ACTIVE, its plan not made yet" in out, res.output
