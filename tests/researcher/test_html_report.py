"""The study's HTML report: fast checks of its parts, then a real study's report and its MLflow run page
as headless Chromium sees them (elements, not pixels).

Chromium is optional on a developer's machine: without it the browser test skips and says why. CI
installs it (.ci/chromium.sh) and sets ROOST_REQUIRE_CHROMIUM=1, and then a missing browser fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from researcher import analysis, tracking
from researcher.cli import app
from researcher.config import StudyConfig
from researcher.experiment import Frame, HypothesisSpec
from researcher.html_report import RoundView, StudyView, arm_curves, inline, render_html
from researcher.llm_planner import LLMPlanner
from researcher.planning import PlanDefaults
from researcher.report import early_stop_savings
from researcher.report_figures import holm_intervals
from researcher.runner import create_study, drive, make_context
from researcher.scripted_model import ScriptedChatModel
from store.testing import MlflowServer

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"
BASE = {"lr=0": [0.20, 0.21, 0.19, 0.22]}
ARMS = {**BASE, "lr=1e-4": [0.30, 0.33, 0.28, 0.31], "lr=3e-4": [0.55, 0.58, 0.52, 0.57]}


def _round(result: dict, **kw: object) -> RoundView:
    design = {
        "task": "arith",
        "steps": 4,
        "seeds": [0, 1, 2, 3],
        "baseline": "lr=0",
        "arms": [{"name": a, "knobs": {"lr": float(a[3:])}} for a in result["arms"]],
    }
    curves = {a: [([0, 1, 2, 3], [0.2, 0.2 + i / 10, 0.3, v]) for i, v in enumerate(vals)] for a, vals in ARMS.items()}
    fields = dict(
        number=1,
        statement="lr=3e-4 beats lr=0",
        reason="Ablation of *lr* named in the question",
        verdict=result["verdict"],
        planner="rules",
        design=design,
        analysis={**result, "metric": "final_reward"},
        conclusions=["**lr=0 is worse than lr=3e-4**: a <b>sentence</b>"],
        methods=["*Test* (lr=3e-4 vs the baseline): Welch (unpaired): not deterministic."],
        rule=result["rule"],
        curves=curves,
    )
    return RoundView(**{**fields, **kw})  # type: ignore[arg-type]


def _view(rounds: list[RoundView], early_stop: dict | None = None) -> StudyView:
    return StudyView(
        study_id=7,
        question=TOPIC,
        frame={"question": TOPIC, "task": "arith", "metric": "final_reward", "metric_window": 1, "knobs": ["lr"]},
        planner="rules",
        facts=[("MLflow", "experiment `roost-study-7`")],
        stop_reason="",
        rounds=rounds,
        early_stop=early_stop,
        trials=[{"id": 1, "arm": "lr=0", "seed": 0, "status": "COMPLETED", "run": "abc", "note": ""}],
    )


# ---------------------------------------------------------------- fast: the pure parts


def test_the_html_is_self_contained_and_shows_every_part() -> None:
    result = analysis.analyze(ARMS, baseline="lr=0", direction="greater")
    es = early_stop_savings(
        [{"analysis": {"early_stop": {"saved_steps": 12, "planned_steps": 48, "stopped": {"a": ""}}}}]
    )
    page = render_html(_view([_round(result)], es))
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg id=") == 3
    for fig in ("round-1-reward-curves", "round-1-forest", "round-1-per-seed"):
        assert f'<svg id="{fig}" role="img" aria-label="' in page
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<link" not in page and "<script" not in page
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "element ids repeat across the inline figures"
    assert 'id="plan"' in page and "<td>baseline</td>" in page and "Why this round:" in page
    assert "Ablation of <em>lr</em>" in page and "<strong>lr=0 is worse than lr=3e-4</strong>" in page
    assert "&lt;b&gt;sentence&lt;/b&gt;" in page  # the report's text is escaped, its marks kept
    assert "Welch (unpaired)" in page and "Verdict rule.</strong> Each treatment is compared" in page
    assert "saved <strong>12 of 48 planned trial-steps (25%)" in page
    assert render_html(_view([_round(result)], es)) == page  # deterministic: no random figure ids


def test_a_round_planned_and_not_analysed_is_in_the_plan() -> None:
    """A running study's page said "No round was planned" while its trials ran."""
    design = {"arms": [{"name": "lr=0", "knobs": {"lr": 0}}], "baseline": "lr=0", "seeds": [0, 1, 2], "steps": 5}
    view = _view([])
    assert "No round was planned." in render_html(view)
    view.running = (1, design)
    assert "<td>1 (running)</td><td>lr=0</td><td>baseline</td>" in render_html(view)
    view.stop_reason = "stopped by the user"  # a study stopped mid-round: its report keeps the plan, unanalysed
    assert "<td>1 (not analysed)</td>" in render_html(view)


def test_holm_intervals_agree_with_the_holm_verdicts() -> None:
    result = analysis.analyze(ARMS, baseline="lr=0")
    adjusted = holm_intervals(result)
    for c in result["comparisons"]:
        lo, hi = adjusted[c["arm"]]  # type: ignore[misc]
        assert lo <= c["diff_ci_low"] and hi >= c["diff_ci_high"]  # never narrower than the 95 % interval
        assert (lo > 0 or hi < 0) == (c["p_holm"] < result["level"])  # excludes 0 exactly when Holm rejects
    paired = analysis.analyze(ARMS, baseline="lr=0", seeds={a: [0, 1, 2, 3] for a in ARMS}, deterministic=True)
    assert {c["method"] for c in paired["comparisons"]} == {"paired"}
    for c in paired["comparisons"]:
        lo, hi = holm_intervals(paired)[c["arm"]]  # type: ignore[misc]
        assert lo <= c["diff_ci_low"] and (lo > 0 or hi < 0) == (c["p_holm"] < paired["level"])
    stopped = analysis.analyze(ARMS, baseline="lr=0", stopped={"lr=1e-4": "stopped at step 1"})
    assert holm_intervals(stopped)["lr=1e-4"] is None


def test_inline_marks_and_arm_curves() -> None:
    assert inline("a *b* **c** `d<e>` x*y") == "a <em>b</em> <strong>c</strong> <code>d&lt;e&gt;</code> x*y"
    result = analysis.analyze(BASE | {"lr=3e-4": ARMS["lr=3e-4"]}, baseline="lr=0")
    curves = arm_curves(_view([_round(result)]))
    assert curves["lr=3e-4"][0] == [0.0, 1.0, 2.0, 3.0] and curves["lr=3e-4"][1][3] == pytest.approx(0.555)


def test_the_decide_prompt_names_the_test_that_gave_p() -> None:
    model = ScriptedChatModel(script=['{"stop": true, "follow_ups": [], "notes": "done"}'] * 2)
    planner = LLMPlanner(model, check_program=False)
    f = Frame(question="Does lr matter?", knobs=["lr"])
    h = HypothesisSpec(
        statement="lr 3e-4 beats lr 0",
        rationale="lr 0 cannot learn",
        knob="lr",
        baseline_value=0.0,
        treatment_values=[3e-4],
        direction="greater",
    )
    seeds = {a: [0, 1, 2, 3] for a in ARMS}
    for deterministic, test in ((True, "paired t p"), (False, "Welch p")):
        result = analysis.analyze(ARMS, baseline="lr=0", seeds=seeds, deterministic=deterministic)
        planner.decide(f, h, result, [], True)
        prompt = str(model.calls[-1][1].content)
        assert test in prompt and ("Welch p" in prompt) == (not deterministic), prompt


def test_the_study_experiment_opens_on_training_runs() -> None:
    from store.tracking import get_client

    run_id = tracking.start_study_run(41, "study-kind-test", {"topic": "x"})
    client = get_client()
    exp = client.get_experiment(client.get_run(run_id).info.experiment_id)
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    route = tracking.ui_route(exp.experiment_id)
    assert "workflowType=machine_learning" in route and "trial%2Ffinal_reward" in route
    assert tracking.ui_route("3", "r1") == "#/experiments/3/runs/r1?workflowType=machine_learning"


def test_report_of_a_missing_study_is_one_line_and_exit_1() -> None:
    r = CliRunner().invoke(app, ["report", "99", "--html"])
    assert r.exit_code == 1 and "no study 99" in r.output and "Traceback" not in r.output


# ---------------------------------------------------------------- a real study, in Chromium


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("ROOST_REQUIRE_CHROMIUM") == "1":
        pytest.fail("ROOST_REQUIRE_CHROMIUM=1 but no chromium on PATH (.ci/chromium.sh installs it)")
    pytest.skip("chromium is not installed (apt-get install chromium); CI sets ROOST_REQUIRE_CHROMIUM=1")


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    """`mlflow server` on the tests' tracking store, on loopback, launched now (the test waits for it once
    the study has run); its process group killed by id after."""
    server = MlflowServer(tmp_path / "mlflow-server", backend_uri=os.environ["MLFLOW_TRACKING_URI"]).launch()
    try:
        yield server
    finally:
        server.stop()


def _dom(chromium: str, url: str, profile: Path) -> str:
    r = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.timeout(120)
def test_report_and_mlflow_run_page_in_headless_chromium(fake_program, mlflow_server, tmp_path, monkeypatch) -> None:
    chromium = _chromium()
    cfg = StudyConfig(topic=TOPIC, trial_program=fake_program, defaults=PlanDefaults(steps=6), poll_s=0.2)
    sid = create_study(cfg)  # the server starts meanwhile
    assert drive(sid, poll_s=0.2).state == "done"
    study = make_context(sid).study()
    report = Path(make_context(sid).cfg.study_dir) / "report" / "report.html"
    from store.tracking import get_client

    arts = {a.path for a in get_client().list_artifacts(study.mlflow_run_id, "report")}
    assert "report/report.html" in arts
    monkeypatch.chdir(tmp_path)
    import webbrowser

    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or False)  # no browser here
    r = CliRunner().invoke(app, ["report", str(sid), "--open"])
    assert r.exit_code == 0 and f"no browser to open it; the report: studies/study-{sid}/report.html" in r.output
    assert opened == [(tmp_path / "studies" / f"study-{sid}" / "report.html").resolve().as_uri()]
    assert (tmp_path / "studies" / f"study-{sid}" / "report.html").read_text() == report.read_text()

    dom = _dom(chromium, report.as_uri(), tmp_path / "profile-report")
    for fig in ("round-1-reward-curves", "round-1-forest", "round-1-per-seed"):
        assert re.search(rf'<svg id="{fig}" role="img" aria-label="[^"]+"', dom), fig
    assert "Holm-adjusted" in dom and 'id="plan"' in dom and "Why this round:" in dom

    uri = mlflow_server.wait(timeout_s=40)
    page = f"{uri}/{tracking.ui_route(study.mlflow_experiment_id, study.mlflow_run_id)}"
    dom = _dom(chromium, page, tmp_path / "profile-mlflow")
    assert study.name in dom or "Overview" in dom, dom[:2000]
    first = dom.find(">reward_mean/lr_0<")
    assert first != -1, "the run page lists no reward metric"
    assert first < dom.find(">cpu_hours<") and first < dom.find(">trials<")  # the reward first


def test_early_stopping_savings_are_parent_run_metrics() -> None:
    from types import SimpleNamespace

    from researcher.report import summary_metrics

    ctx = SimpleNamespace(
        trials=lambda: [],
        launcher=SimpleNamespace(usage=lambda ids: {"cpu_hours": 0.0}),
        cfg=SimpleNamespace(planner="rules"),
        study=lambda: SimpleNamespace(
            created_at=datetime(2026, 1, 1, tzinfo=UTC), finished_at=datetime(2026, 1, 1, 0, 2, 5, tzinfo=UTC)
        ),
    )
    result = analysis.analyze(ARMS, baseline="lr=0")
    result["early_stop"] = {"rungs": [0], "stopped": {"lr=1e-4": "behind"}, "saved_steps": 8, "planned_steps": 40}
    state = {"history": [{"round": 0, "verdict": result["verdict"], "analysis": result}]}
    metrics, _ = summary_metrics(ctx, state)  # type: ignore[arg-type]
    assert metrics["wall_s"] == 125.0  # the study's wall time, beside its CPU-hours
    assert metrics["early_stop/saved_steps"] == 8 and metrics["early_stop/planned_steps"] == 40
    assert metrics["early_stop/saved_fraction"] == pytest.approx(0.2) and metrics["round1/early_stop/saved_steps"] == 8
