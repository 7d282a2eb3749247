"""The study report: markdown with tables and plots, in the study directory and in MLflow.

    <study dir>/report/report.md
    <study dir>/report/plots/round0_reward_curves.png, round0_final_reward.png

The same directory is uploaded as artifacts `report/` of the study's MLflow
parent run, and the markdown is kept in `Study.report`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from researcher.context import StudyContext
from researcher.tracking import experiment_name
from store.models import StudyStatus
from store.types import utcnow


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _p(p: Any) -> str:
    if p is None:
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def conclusion_sentence(result: dict) -> str:
    """A one-line verdict a reader can quote, naming the better arm and CI overlap."""
    lines = []
    for c in result.get("comparisons", []):
        if c["diff"] is None:
            lines.append(f"{c['arm']} vs {c['baseline']}: not enough completed trials to compare.")
            continue
        worse = c["baseline"] if c["diff"] > 0 else c["arm"]
        better = c["arm"] if c["diff"] > 0 else c["baseline"]
        sig = c["p"] is not None and c["p"] < result.get("alpha", 0.05)
        overlap = "overlap" if c["ci_overlap"] else "do not overlap"
        if sig:
            lines.append(f"**{worse} is worse than {better}**: {result.get('metric', 'metric')} differs by "
                         f"{_num(abs(c['diff']))} (95 % CI of the difference [{_num(c['diff_ci_low'])}, "
                         f"{_num(c['diff_ci_high'])}], Hedges' g {_num(c['hedges_g'], 2)}, "
                         f"Welch p {_p(c['p'])}); the arms' 95 % CIs {overlap}.")
        else:
            lines.append(f"No significant difference between {c['arm']} and {c['baseline']} "
                         f"(diff {_num(c['diff'])}, Welch p {_p(c['p'])}); the arms' 95 % CIs {overlap}.")
    return "\n".join(f"- {x}" for x in lines)


def render_round(h: dict, report_dir: Path) -> str:
    result = h["analysis"]
    d = h["design"]
    out = [f"## Round {h['round'] + 1}: {h['statement']}", "",
           f"**Verdict: {h['verdict'].upper()}** (α = {result.get('alpha', 0.05)}, "
           f"expected direction of treatment − baseline: {result.get('direction')})", "",
           conclusion_sentence(result), "",
           f"Design: task `{d['task']}`, {d['steps']} steps per trial, seeds {d['seeds']}, "
           f"baseline arm `{d['baseline']}`" + (f", shared knobs `{d['common']}`" if d.get("common") else "") + ".",
           "", f"### Per arm: {result.get('metric_description', result.get('metric'))}", "",
           "| arm | knobs | n | mean | 95 % bootstrap CI | SD | per-seed values |",
           "|---|---|---:|---:|---|---:|---|"]
    knobs = {a["name"]: a["knobs"] for a in d["arms"]}
    for name, a in result["arms"].items():
        vals = ", ".join(_num(v) for v in a["values"])
        out.append(f"| {name} | `{knobs.get(name, {})}` | {a['n']} | {_num(a['mean'])} | "
                   f"[{_num(a['ci_low'])}, {_num(a['ci_high'])}] | {_num(a['std'])} | {vals} |")
    out += ["", "### Comparisons with the baseline", "",
            "| arm | vs | diff | 95 % CI of diff | Hedges' g | Welch t | p | CIs overlap | verdict |",
            "|---|---|---:|---|---:|---:|---:|---|---|"]
    for c in result["comparisons"]:
        overlap = {True: "yes", False: "no", None: "–"}[c["ci_overlap"]]
        out.append(f"| {c['arm']} | {c['baseline']} | {_num(c['diff'])} | [{_num(c['diff_ci_low'])}, "
                   f"{_num(c['diff_ci_high'])}] | {_num(c['hedges_g'], 2)} | {_num(c['t'], 2)} | {_p(c['p'])} | "
                   f"{overlap} | {c['verdict']} |")
    out.append("")
    for p in result.get("plots", []):
        rel = os.path.relpath(p, report_dir)
        out += [f"![{Path(p).stem}]({rel})", ""]
    if h.get("notes"):
        out += [f"Planner's notes: {h['notes']}", ""]
    return "\n".join(out)


def render(ctx: StudyContext, state: dict, report_dir: Path) -> str:
    study = ctx.study()
    frame = state.get("frame") or {}
    trials = ctx.trials()
    by_status: dict[str, int] = {}
    for t in trials:
        by_status[t.status] = by_status.get(t.status, 0) + 1
    usage = ctx.launcher.usage([t.id for t in trials if t.id is not None])
    lines = [f"# Study {study.id}: {study.question}", "",
             f"- Question: {frame.get('question', study.question)}",
             f"- Task: `{frame.get('task', '?')}`; metric: {frame.get('metric', '?')} "
             f"(window {frame.get('metric_window', '?')})",
             f"- Planner: {ctx.cfg.planner}; backend: {ctx.cfg.backend}; "
             f"parallel trials: {ctx.cfg.parallel}",
             f"- Trials: {len(trials)} ({', '.join(f'{k.lower()} {v}' for k, v in sorted(by_status.items()))}); "
             f"CPU-hours {usage['cpu_hours']:.3f}; LLM tokens {state.get('llm_tokens', 0)}",
             f"- MLflow: experiment `{experiment_name(study.id, study.name)}` "  # type: ignore[arg-type]
             f"(id {study.mlflow_experiment_id}), parent run `{study.mlflow_run_id}`",
             f"- Generated {utcnow().strftime('%Y-%m-%d %H:%M UTC')}"]
    if state.get("stop_reason"):
        lines.append(f"- **Stopped early:** {state['stop_reason']} (the report covers what completed)")
    lines.append("")
    history = state.get("history", [])
    if history:
        lines += ["## Summary", ""]
        lines += [f"- Round {h['round'] + 1}: {h['statement']} → **{h['verdict']}**" for h in history]
        lines.append("")
    else:
        lines += ["No round was analysed.", ""]
    for h in history:
        lines.append(render_round(h, report_dir))
    lines += ["## Trials", "", "| trial | arm | seed | status | MLflow run | note |", "|---:|---|---:|---|---|---|"]
    for t in trials:
        lines.append(f"| {t.id} | {t.arm} | {t.seed} | {t.status} | {t.mlflow_run_id or '–'} | "
                     f"{t.config.get('reason', '') or ''} |")
    return "\n".join(lines) + "\n"


def write_report(ctx: StudyContext, state: dict) -> Path:
    """Write the markdown, upload it with its plots, close the study (idempotent)."""
    from researcher import tracking

    report_dir = Path(ctx.cfg.study_dir) / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    ctx.ingest([t.id for t in ctx.trials() if t.id is not None])
    text = render(ctx, state, report_dir)
    path = report_dir / "report.md"
    path.write_text(text)
    study = ctx.study()
    if study.mlflow_run_id:
        tracking.log_report(study.mlflow_run_id, report_dir)
        tracking.finish_study_run(study.mlflow_run_id, "FINISHED")
    status = StudyStatus.CANCELLED if study.status == StudyStatus.CANCELLED.value else StudyStatus.COMPLETED
    ctx.set_study_status(status, report=text, finished_at=utcnow())
    return path
