"""A whole study through the real graph, store, local scheduler backend and MLflow,
with `fake_trial.py` standing in for `swarm train` (seconds, not minutes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlmodel import Session, select

from researcher.config import Adaptive, Budget, StudyConfig
from researcher.planning import PlanDefaults
from researcher.runner import create_study, drive, make_context
from store.models import Hypothesis, Job, Study, Trial
from store.schema import init_db

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"


def config(program: list[str], **kw) -> StudyConfig:
    return StudyConfig(topic=TOPIC, trial_program=program, defaults=PlanDefaults(steps=10), poll_s=0.2, **kw)


def rows(model, **where):
    with Session(init_db()) as s:
        stmt = select(model)
        for k, v in where.items():
            stmt = stmt.where(getattr(model, k) == v)
        return list(s.exec(stmt).all())


def starts(cfg_dir: str) -> dict[str, int]:
    return {p.parent.name: len(p.read_text().split()) for p in Path(cfg_dir).glob("trials/*/starts.log")}


def test_rules_study_end_to_end(fake_program):
    sid = create_study(config(fake_program))
    step = drive(sid, poll_s=0.2)
    assert step.state == "done"
    study = rows(Study, id=sid)[0]
    assert study.status == "COMPLETED" and study.finished_at is not None
    trials = rows(Trial, study_id=sid)
    assert len(trials) == 6 and {t.status for t in trials} == {"COMPLETED"}
    assert sorted((t.arm, t.seed) for t in trials)[0] == ("lr=0", 0)
    (hyp,) = rows(Hypothesis, study_id=sid)
    assert hyp.status == "SUPPORTED"
    report = Path(make_context(sid).cfg.study_dir) / "report" / "report.md"
    text = report.read_text()
    assert "**lr=0 is worse than lr=0.0003**" in text and "do not overlap" in text
    # the difference with the sign its interval has (it said "differs by 0.25" beside a CI of [-0.35, -0.15])
    assert "final_reward of lr=0.0003 minus lr=0 is 0." in text, text
    # each finished trial's final reward in the trials table (a stopped study's showed statuses alone)
    scored = [line for line in text.splitlines() if line.startswith("| ") and "| COMPLETED | 0." in line]
    assert len(scored) == 6, text[-1500:]
    assert "- Planner: rules;" in text and "Planned by the rules planner." in text
    assert re.search(r"CPU-hours \d+\.\d{3}; wall \d+:\d\d:\d\d;", text), text[:800]
    assert "*Verdict rule.* Each treatment is compared" in text and "95 % t-interval" in text
    for line in text.splitlines():
        if line.startswith("!["):
            assert (report.parent / line.split("(")[1].rstrip(")")).exists()
    assert study.report == text
    # MLflow: the report is an artifact of the parent run; every trial a child run with its curve
    from store.tracking import get_client

    client = get_client()
    arts = {a.path for a in client.list_artifacts(study.mlflow_run_id, "report")}
    assert "report/report.md" in arts and "report/plots" in arts
    plots = {a.path for a in client.list_artifacts(study.mlflow_run_id, "report/plots")}
    assert "report/plots/round0_final_reward.png" in plots
    for t in trials:
        run = client.get_run(t.mlflow_run_id)
        assert run.data.tags["mlflow.parentRunId"] == study.mlflow_run_id
        assert run.info.run_name == f"{t.arm} seed={t.seed}"
        assert len(client.get_metric_history(t.mlflow_run_id, "reward_mean")) == 10
    parent = client.get_run(study.mlflow_run_id)
    assert parent.info.status == "FINISHED"
    # the parent run carries the study's summary
    m = parent.data.metrics
    assert m["trials_completed"] == 6 and m["round1/verdict"] == 1.0 and m["round1/lr_0/n"] == 3
    assert m["round1/lr_0.0003 vs lr_0/p_holm"] < 0.05 and m["round1/lr_0.0003/mean"] > m["round1/lr_0/mean"]
    assert parent.data.tags["roost.verdict.round1"] == "supported" and parent.data.tags["roost.planner"] == "rules"
    assert set(starts(make_context(sid).cfg.study_dir).values()) == {1}


def test_approve_pauses_before_anything_launches(fake_program):
    sid = create_study(config(fake_program, approve=True))
    started: list[str] = []  # the graph's nodes as they start (the CLI's spinner names the work)
    step = drive(sid, poll_s=0.2, on_node=started.append)
    assert step.state == "approval" and step.detail["design"]["baseline"] == "lr=0"
    assert started == ["frame", "hypothesize", "design", "approve"]
    assert rows(Study, id=sid)[0].status == "PAUSED"
    assert rows(Job) == [] and {t.status for t in rows(Trial)} == {"PENDING"}
    assert drive(sid, poll_s=0.2).state == "approval"  # a tick does not approve
    started.clear()
    step = drive(sid, poll_s=0.2, resume={"approved": True}, on_node=started.append)
    assert step.state == "done" and rows(Study, id=sid)[0].status == "COMPLETED"
    assert len(rows(Job)) == 6
    assert started[:2] == ["approve", "launch"] and started[-3:] == ["analyze", "decide", "report"]


def test_rejected_plan_launches_nothing(fake_program):
    sid = create_study(config(fake_program, approve=True))
    drive(sid, poll_s=0.2)
    assert drive(sid, poll_s=0.2, resume={"approved": False}).state == "done"
    assert rows(Job) == [] and {t.status for t in rows(Trial)} == {"CANCELLED"}
    assert "not approved" in rows(Study, id=sid)[0].report
    assert rows(Study, id=sid)[0].status == "CANCELLED"  # stored COMPLETED before: nothing was studied


def test_a_study_number_handed_out_again_starts_clean_and_keeps_the_earlier_studys_files(fake_program, _isolated):
    """A store made again (roost.db deleted) numbers its first study 1 again. That study must not resume
    the earlier study 1's graph (finished: it ended at once, nothing run) nor write into its folder."""
    from store.db import dispose_engines

    first = create_study(config(fake_program, approve=True))
    assert drive(first, poll_s=0.2, resume=None).state == "approval"
    assert drive(first, poll_s=0.2, resume={"approved": False}).state == "done"
    old_dir = Path(make_context(first).cfg.study_dir)
    (old_dir / "notes.txt").write_text("the earlier study's")
    dispose_engines()
    (_isolated / "roost.db").unlink()

    again = create_study(config(fake_program, approve=True))
    assert again == first
    assert drive(again, poll_s=0.2).state == "approval"  # planned afresh, not the earlier graph's end
    assert Path(make_context(again).cfg.study_dir) == old_dir and not (old_dir / "notes.txt").exists()
    (aside,) = old_dir.parent.glob(f"{old_dir.name}.earlier-*")
    assert (aside / "notes.txt").read_text() == "the earlier study's"


def test_a_trial_budget_too_small_for_the_design_is_refused_before_anything_launches(fake_program):
    sid = create_study(config(fake_program, budget=Budget(max_trials=4)))  # the design needs 2 × 3
    assert drive(sid, poll_s=0.2).state == "done"
    assert rows(Job) == [] and rows(Trial) == []
    report = rows(Study, id=sid)[0].report
    assert "Stopped early:** refused: a trial budget of 4 cannot cover even the smallest design" in report


def test_a_design_is_shrunk_to_the_trial_budget_and_says_so(fake_program):
    topic = "Does the learning rate matter for arithmetic? Compare 0, 1e-4 and 3e-4"
    sid = create_study(config(fake_program, budget=Budget(max_trials=7)).model_copy(update={"topic": topic}))
    assert drive(sid, poll_s=0.2).state == "done"
    assert sorted({t.arm for t in rows(Trial)}) == ["lr=0", "lr=0.0001"] and len(rows(Job)) == 6
    report = rows(Study, id=sid)[0].report
    assert "Shrunk to fit the trial budget of 7: dropped arm(s) lr=0.0003" in report


def test_failed_trials_are_reported(fake_program, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_FAIL_ARM", "0.0")
    sid = create_study(config(fake_program))
    assert drive(sid, poll_s=0.2).state == "done"
    by_arm = {(t.arm, t.status) for t in rows(Trial)}
    assert by_arm == {("lr=0", "FAILED"), ("lr=0.0003", "COMPLETED")}
    assert rows(Hypothesis)[0].status == "INCONCLUSIVE"


def test_a_trial_whose_workflow_failed_says_so_in_the_report(fake_program, monkeypatch):
    """A trial's run that lost episodes to its workflow (summary.json `workflow_failures`) read like a
    clean one in the study's report: its trials table says it."""
    monkeypatch.setenv("FAKE_TRIAL_WORKFLOW_FAILS", "0.0003")
    sid = create_study(config(fake_program))
    assert drive(sid, poll_s=0.2).state == "done"
    with Session(init_db()) as s:
        report = s.get(Study, sid).report
    noted = [line for line in report.splitlines() if "the workflow failed: KeyError: 'x' (+1 more kind)" in line]
    assert len(noted) == 3 and all("lr=0.0003" in line for line in noted), report[-2000:]


def test_daemon_tick_drives_a_background_study(fake_program):
    import time

    from researcher.daemon import tick

    sid = create_study(config(fake_program))
    for _ in range(200):
        if tick().get(sid) in ("done", None):
            break
        time.sleep(0.2)
    assert rows(Study, id=sid)[0].status == "COMPLETED"
    assert tick() == {}  # nothing active any more


@pytest.mark.parametrize(
    "budget, why",
    [
        (Budget(wall_clock_s=0.001), "wall-clock budget"),
        (Budget(deadline="2000-01-01T00:00:00Z"), "deadline"),
    ],
)
def test_spent_budgets_launch_nothing(fake_program, budget, why):
    sid = create_study(config(fake_program, budget=budget))
    assert drive(sid, poll_s=0.2).state == "done"
    assert rows(Job) == [] and {t.status for t in rows(Trial)} == {"CANCELLED"}
    report = rows(Study, id=sid)[0].report
    assert f"Stopped early:** {why}" in report and "not enough completed trials" in report


def test_cpu_budget_uses_measured_trial_cost(fake_program, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_SLEEP", "1")
    sid = create_study(config(fake_program, budget=Budget(cpu_hours=2.5 / 3600)))  # 2.5 CPU-seconds
    assert drive(sid, poll_s=0.2).state == "done"
    launched = len(rows(Job))
    assert 2 <= launched < 6  # the first wave runs, then the projected cost stops launches
    assert "CPU budget" in rows(Study, id=sid)[0].report


def test_parse_duration():
    from researcher.config import parse_duration

    assert parse_duration("90") == 90 and parse_duration("45m") == 2700
    assert parse_duration("1h30m") == 5400 and parse_duration("2d") == 172800
    assert parse_duration(None) is None
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_a_trial_programs_own_mlflow_run_is_adopted_as_the_child_run():
    from researcher import tracking
    from store.tracking import RunLogger, get_client

    parent = tracking.start_study_run(99, "x-abcdef", {"topic": "t"})
    exp = get_client().get_run(parent).info.experiment_id
    own = RunLogger.start(tracking.experiment_name(99, "x-abcdef"), "server", parent_run_id=parent, flush_interval_s=0)
    own.log_metrics(0, {"reward_mean": 0.5})
    own.flush()
    summary = {"steps": [{"step": 0, "reward_mean": 0.5}]}
    run_id = tracking.log_trial(parent, 7, "lr=0", 0, {}, summary, {"final_reward": 0.5}, own_run_id=own.run_id)
    assert run_id == own.run_id
    assert get_client().get_run(run_id).info.run_name == "lr=0 seed=0"  # not the trial program's "server"
    again = tracking.log_trial(parent, 7, "lr=0", 0, {}, summary, {"final_reward": 0.5})
    assert again == own.run_id  # found by its tag: no second run
    client = get_client()
    run = client.get_run(run_id)
    assert run.info.experiment_id == exp and run.data.tags["roost.trial_id"] == "7"
    assert len(client.get_metric_history(run_id, "reward_mean")) == 1  # not copied twice
    assert run.data.metrics["trial/final_reward"] == 0.5


def test_rules_study_brackets_the_learning_rate_after_a_supported_round(fake_program):
    cfg = config(fake_program, adaptive=Adaptive(rounds=2), parallel=4).model_copy(
        update={"defaults": PlanDefaults(steps=5)}
    )
    sid = create_study(cfg)
    assert drive(sid, poll_s=0.2).state == "done"
    hyps = sorted(rows(Hypothesis, study_id=sid), key=lambda h: h.conclusion["round"])
    assert [h.status for h in hyps] == ["SUPPORTED", "SUPPORTED"]
    second = hyps[1].conclusion
    assert [a["name"] for a in second["design"]["arms"]] == ["lr=0.0003", "lr=9.5e-05", "lr=0.00095"]
    report = rows(Study, id=sid)[0].report
    assert "*Why this round:* Round 1 supported an effect of lr" in report
    assert "brackets it with log-midpoints" in report and "Sequential look 1" in report
    assert "limit is 2 round(s)" in report and "Welch (unpaired): the study does not declare" in report
    assert len(rows(Trial, study_id=sid)) == 15


def test_an_inconclusive_comparison_gets_more_seeds_analysed_with_the_first_look(fake_program):
    topic = "Does the learning rate matter for arithmetic? Compare 3e-4 and 1e-3"  # the fake trial caps at 3e-4
    cfg = config(fake_program, adaptive=Adaptive(rounds=3), parallel=4, deterministic=True).model_copy(
        update={"defaults": PlanDefaults(steps=5), "topic": topic}
    )
    sid = create_study(cfg)
    assert drive(sid, poll_s=0.2).state == "done"
    hyps = sorted(rows(Hypothesis, study_id=sid), key=lambda h: h.conclusion["round"])
    assert len(hyps) == 2 and hyps[1].conclusion["spec"]["extends"] == 0
    result = hyps[1].conclusion["analysis"]
    assert [a["n"] for a in result["arms"].values()] == [6, 6] and result["seeds"] == [0, 1, 2, 3, 4, 5]
    assert result["sequential"]["look"] == 2 and result["sequential"]["fractions"] == [0.5, 1.0]
    assert result["comparisons"][0]["method"] == "paired"  # deterministic, every seed matched
    report = rows(Study, id=sid)[0].report
    assert "Sequential look 2" in report and "gives the same arms seeds 3–5" in report
    assert "the most this study allows (6)" in report


def test_early_stopping_cuts_an_arm_clearly_behind_and_reports_the_compute_saved(fake_program, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_STEP_SLEEP", "0.4")
    monkeypatch.setenv("ROOST_LOCAL_MAX_JOBS", "12")
    topic = "Does the learning rate matter for arithmetic? Compare 0, 3e-5, 1e-4 and 3e-4"
    cfg = config(fake_program, adaptive=Adaptive(early_stop=True), parallel=12).model_copy(
        update={"defaults": PlanDefaults(steps=9), "topic": topic}
    )
    sid = create_study(cfg)
    assert drive(sid, poll_s=0.2).state == "done"
    (hyp,) = rows(Hypothesis, study_id=sid)
    es = hyp.conclusion["early_stop"]
    assert list(es["stopped"]) == ["lr=3e-05"] and es["saved_steps"] > 0 and es["planned_steps"] == 4 * 3 * 9
    cut = [t for t in rows(Trial, study_id=sid) if t.arm == "lr=3e-05"]
    assert {t.status for t in cut} == {"CANCELLED"} and "stopped at step 3 of 9" in cut[0].config["reason"]
    result = hyp.conclusion["analysis"]
    (c,) = [c for c in result["comparisons"] if c["arm"] == "lr=3e-05"]
    assert c["verdict"] == "inconclusive" and c["p_holm"] == 1.0
    report = rows(Study, id=sid)[0].report
    assert "Compute saved:" in report and "Early stopping saved" in report


def test_a_study_killed_before_its_mlflow_run_gets_one_when_driven(fake_program, monkeypatch):
    """`researcher study` killed while MLflow loaded (the end of create_study) left an ACTIVE study without
    its parent run: its trials and its report never reached MLflow, and nothing said so. Its row and config
    are one commit, and the next drive (`researcher resume`, the daemon) starts the run."""
    import researcher.runner as runner
    from store.tracking import get_client

    def killed(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(runner.tracking, "start_study_run", killed)
        create_study(config(fake_program))
    (study,) = rows(Study)
    assert study.status == "ACTIVE" and study.mlflow_run_id is None
    assert make_context(study.id).cfg.topic == TOPIC  # its config was written with the row
    assert drive(study.id, poll_s=0.2).state == "done"
    study = rows(Study, id=study.id)[0]
    assert study.status == "COMPLETED" and study.mlflow_run_id
    client = get_client()
    assert client.get_run(study.mlflow_run_id).info.status == "FINISHED"
    assert "report/report.md" in {a.path for a in client.list_artifacts(study.mlflow_run_id, "report")}
    for t in rows(Trial, study_id=study.id):
        assert client.get_run(t.mlflow_run_id).data.tags["mlflow.parentRunId"] == study.mlflow_run_id
