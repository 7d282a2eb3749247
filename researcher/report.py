"""The study report: markdown with tables and plots, in the study directory and in MLflow.

    <study dir>/report/report.md
    <study dir>/report/report.html   (self-contained: researcher/html_report.py)
    <study dir>/report/plots/round0_reward_curves.png, round0_final_reward.png

The same directory is uploaded as artifacts `report/` of the study's MLflow
parent run, whose metrics and tags get the study's summary (`summary_metrics`);
the markdown is kept in `Study.report`. Every report names the planner that made
each plan and spells out the verdict rule its numbers were judged by.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

from researcher import html_report, tracking
from researcher.analysis import TOO_FEW, trial_metric, verdict_rule
from researcher.config import StudyConfig
from researcher.context import StudyContext
from researcher.html_report import FINAL_REWARD_NOTE, RoundView, StudyView
from researcher.tracking import experiment_name, metric_key, ui_route
from researcher.trials import step_rewards, trial_dir
from store.models import StudyStatus, TrialStatus
from store.types import utcnow

log = logging.getLogger(__name__)


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
        if c.get("verdict") == TOO_FEW:
            n_base, n_arm = c.get("n", ["?", "?"])
            lines.append(
                f"{c['arm']} vs {c['baseline']}: too few seeds to say ({n_arm} and {n_base} completed "
                f"trials; at least {result.get('min_n', 3)} per arm needed)."
            )
            continue
        worse = c["baseline"] if c["diff"] > 0 else c["arm"]
        better = c["arm"] if c["diff"] > 0 else c["baseline"]
        p_adj = c.get("p_holm", c["p"])
        sig = p_adj is not None and p_adj < result.get("level", result.get("alpha", 0.05))
        test = "paired t" if c.get("method") == "paired" else "Welch"
        level = result.get("level", result.get("alpha", 0.05))
        at = f", judged at p < {level:.3g} at this look" if result.get("sequential") else ""
        if c.get("stopped"):
            lines.append(f"{c['arm']} vs {c['baseline']}: {c['stopped']}; not called supported.")
            continue
        overlap = "overlap" if c["ci_overlap"] else "do not overlap"
        if sig:
            lines.append(
                f"**{worse} is worse than {better}**: {result.get('metric', 'metric')} of {c['arm']} minus "
                f"{c['baseline']} is {_num(c['diff'])} (95 % CI [{_num(c['diff_ci_low'])}, "
                f"{_num(c['diff_ci_high'])}], Hedges' g {_num(c['hedges_g'], 2)}, "
                f"{test} p {_p(c['p'])}, Holm-adjusted {_p(p_adj)}); the arms' 95 % CIs {overlap}."
            )
        else:
            lines.append(
                f"No significant difference between {c['arm']} and {c['baseline']} "
                f"(diff {_num(c['diff'])}, {test} p {_p(c['p'])}, Holm-adjusted {_p(p_adj)}{at}); "
                f"the arms' 95 % CIs {overlap}."
            )
    return "\n".join(f"- {x}" for x in lines)


def _rounds(rounds: list[int]) -> str:
    if len(rounds) <= 1:
        return f"round {rounds[0] + 1}" if rounds else "this round"
    return f"rounds {', '.join(str(r + 1) for r in rounds)} analysed together"


def method_lines(result: dict) -> list[str]:
    """Which test each comparison used and why (paired or Welch), the sequential look, early stops."""
    out = []
    reasons: dict[str, list[str]] = {}
    for c in result.get("comparisons", []):
        if c.get("method_reason"):
            reasons.setdefault(c["method_reason"], []).append(c["arm"])
    for why, arms in reasons.items():
        out.append(f"*Test* ({', '.join(arms)} vs the baseline): {why}.")
    seq = result.get("sequential")
    if seq:
        out.append(
            f"*Sequential look {seq['look']}* of this comparison ({_rounds(result.get('pooled_rounds', []))}, "
            f"seeds {result.get('seeds')}): {seq['spending']} alpha spending; judged at adjusted p < "
            f"{seq['nominal_alpha']:.4g} (α spent so far {seq['alpha_spent']:.4g} of {result.get('alpha', 0.05)})."
        )
    es = result.get("early_stop")
    if es:
        stopped = "; ".join(f"{arm} {why}" for arm, why in (es.get("stopped") or {}).items()) or "no arm stopped"
        planned = es.get("planned_steps") or 0
        share = f" ({es['saved_steps'] / planned:.0%})" if planned else ""
        out.append(
            f"*Early stopping* (successive halving, rungs judged: {len(es.get('rungs', []))}): {stopped}. "
            f"Compute saved: {es.get('saved_steps', 0)} of {planned} trial-steps{share}."
        )
    return [x for line in out for x in (line, "")]


def render_round(h: dict, report_dir: Path, planner: str = "?") -> str:
    result = h["analysis"]
    d = h["design"]
    out = [
        f"## Round {h['round'] + 1}: {h['statement']}",
        "",
        *([f"*Why this round:* {h['reason']}", ""] if h.get("reason") else []),
        f"**Verdict: {h['verdict'].upper()}** (α = {result.get('alpha', 0.05)}, "
        f"expected direction of treatment − baseline: {result.get('direction')})",
        "",
        conclusion_sentence(result),
        "",
        *method_lines(result),
        f"Planned by the {h.get('planner') or planner} planner. "
        f"Design: task `{d['task']}`, {d['steps']} steps per trial, seeds {d['seeds']}, "
        f"baseline arm `{d['baseline']}`" + (f", shared knobs `{d['common']}`" if d.get("common") else "") + ".",
        *([f"**{h['design_note']}**"] if h.get("design_note") else []),
        "",
        f"### Per arm: {result.get('metric_description', result.get('metric'))}",
        "",
        "| arm | knobs | n | mean | 95 % t-interval | SD | per-seed values |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    knobs = {a["name"]: a["knobs"] for a in d["arms"]}
    for name, a in result["arms"].items():
        vals = ", ".join(_num(v) for v in a["values"])
        out.append(
            f"| {name} | `{knobs.get(name, {})}` | {a['n']} | {_num(a['mean'])} | "
            f"[{_num(a['ci_low'])}, {_num(a['ci_high'])}] | {_num(a['std'])} | {vals} |"
        )
    out += [
        "",
        "### Comparisons with the baseline",
        "",
        "| arm | vs | test | diff | 95 % CI of diff | Hedges' g | t | p | Holm p | Welch p (Holm) beside "
        "| CIs overlap | verdict |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---|---|---|",
    ]
    for c in result["comparisons"]:
        overlap = {True: "yes", False: "no", None: "–"}[c["ci_overlap"]]
        w = c.get("welch") or {}
        beside = f"{_p(w.get('p'))} ({_p(c.get('p_holm_welch'))})" if c.get("method") == "paired" else "(this is Welch)"
        out.append(
            f"| {c['arm']} | {c['baseline']} | {c.get('method', 'welch')} | {_num(c['diff'])} | "
            f"[{_num(c['diff_ci_low'])}, {_num(c['diff_ci_high'])}] | {_num(c['hedges_g'], 2)} | {_num(c['t'], 2)} | "
            f"{_p(c['p'])} | {_p(c.get('p_holm'))} | {beside} | {overlap} | "
            f"{c['verdict'] + (' (stopped early)' if c.get('stopped') else '')} |"
        )
    out += ["", f"*Verdict rule.* {round_rule(result)}", ""]
    for p in result.get("plots", []):
        rel = os.path.relpath(p, report_dir)
        out += [f"![{Path(p).stem}]({rel})", ""]
    if h.get("notes"):
        out += [f"Planner's notes: {h['notes']}", ""]
    return "\n".join(out)


def _counts(by_status: dict[str, int]) -> str:
    """ " (completed 4, running 2)", or nothing for a study without trials (it printed "0 ()")."""
    return f" ({', '.join(f'{k.lower()} {v}' for k, v in sorted(by_status.items()))})" if by_status else ""


def render(ctx: StudyContext, state: dict, report_dir: Path) -> str:
    study = ctx.study()
    frame = state.get("frame") or {}
    trials = ctx.trials()
    by_status: dict[str, int] = {}
    for t in trials:
        by_status[t.status] = by_status.get(t.status, 0) + 1
    usage = ctx.launcher.usage([t.id for t in trials if t.id is not None])
    lines = [
        f"# Study {study.id}: {study.question}",
        "",
        f"- Question: {frame.get('question', study.question)}",
        f"- Task: `{frame['task']}`; metric: {frame.get('metric', '?')} (window {frame.get('metric_window', '?')})"
        if frame
        else "- Task and metric: not framed yet (the planner has not run)",
        f"- Planner: {planner_description(ctx.cfg)}; backend: {ctx.cfg.backend}; parallel trials: {ctx.cfg.parallel}"
        + (SHARED_BASE_NOTE if ctx.cfg.shared_base else ""),
        f"- Trials: {len(trials)}{_counts(by_status)}; "
        f"CPU-hours {usage['cpu_hours']:.3f}; wall {_duration(study_wall_s(study))}; "
        f"LLM tokens {state.get('llm_tokens', 0)}",
        f"- MLflow: experiment `{experiment_name(study.id, study.name)}` "  # type: ignore[arg-type]
        f"(id {study.mlflow_experiment_id}), parent run `{study.mlflow_run_id}`"
        if study.mlflow_run_id
        else "- MLflow: no parent run yet (started when the study is next driven)",
        f"- Generated {utcnow().strftime('%Y-%m-%d %H:%M UTC')}",
    ]
    if state.get("stop_reason"):
        lines.append(f"- **Stopped early:** {state['stop_reason']} (the report covers what completed)")
    lines.append("")
    history = state.get("history", [])
    if history:
        lines += ["## Summary", ""]
        lines += [f"- Round {h['round'] + 1}: {h['statement']} → **{h['verdict']}**" for h in history]
        if history[-1].get("notes"):
            lines.append(f"- Why the study ended there: {history[-1]['notes']}")
        saved = early_stop_savings(history)
        if saved is not None:
            total, planned = saved["saved_steps"], saved["planned_steps"]
            lines.append(f"- Early stopping saved {total:g} of {planned:g} planned trial-steps")
        lines.append("")
    else:
        lines += ["No round was analysed.", ""]
    for h in history:
        lines.append(render_round(h, report_dir, ctx.cfg.planner))
    lines += [
        "## Trials",
        "",
        "| trial | arm | seed | status | final reward | MLflow run | note |",
        "|---:|---|---:|---|---:|---|---|",
    ]
    for t in trials:
        lines.append(
            f"| {t.id} | {t.arm} | {t.seed} | {t.status} | {trial_final(ctx, t)} | {t.mlflow_run_id or '–'} | "
            f"{trial_note(ctx, t).replace('|', '/')} |"
        )
    return "\n".join([*lines, "", FINAL_REWARD_NOTE]) + "\n"


def trial_final(ctx: StudyContext, trial: Any) -> str:
    """A finished trial's final reward as the analysis scores it (the table of a stopped or unfinished
    study showed statuses alone: "what it has so far" had no number)."""
    summary = ctx.summary(trial) if trial.status == TrialStatus.COMPLETED.value else None
    value = trial_metric(step_rewards(summary)[1], "final_reward") if summary else None
    return "–" if value is None else f"{value:.3f}"


def trial_note(ctx: StudyContext, trial: Any) -> str:
    """The trials table's note (Markdown and HTML): why it ended as it did, and its workflow's failures."""
    return "; ".join(x for x in (trial.config.get("reason", "") or "", workflow_note(ctx, trial)) if x)


def workflow_note(ctx: StudyContext, trial: Any) -> str:
    """ "the workflow failed: KeyError: 'x' (+1 more kind; see ...)" for a trial whose run lost episodes to its
    workflow (its summary's `workflow_failures`): its reward is then of the episodes that did not fail."""
    try:
        summary = json.loads((trial_dir(ctx.cfg, trial.id) / "out" / "summary.json").read_text())
        failures = [str(f) for f in summary.get("workflow_failures") or []]
    except (OSError, ValueError, AttributeError):
        return ""
    if not failures:
        return ""
    said = re.search(r"\): (.*?)(?: \(the traceback: .*\))?$", failures[0])
    more = f" (+{len(failures) - 1} more kind{'s' * (len(failures) > 2)})" if len(failures) > 1 else ""
    return f"the workflow failed: {said.group(1) if said else failures[0]}{more}; its logs hold the tracebacks"


def early_stop_savings(history: list[dict]) -> dict[str, float] | None:
    """The compute early stopping saved over the study's rounds (trial-steps not run, of those
    planned, and their share); None when no round judged a rung. One sum for the markdown, the
    HTML report and the parent run's metrics, so the three never disagree."""
    saved = [h["analysis"]["early_stop"] for h in history if (h.get("analysis") or {}).get("early_stop")]
    if not saved:
        return None
    total = float(sum(e.get("saved_steps", 0) for e in saved))
    planned = float(sum(e.get("planned_steps", 0) for e in saved))
    stopped = float(sum(len(e.get("stopped") or {}) for e in saved))
    return {
        "saved_steps": total,
        "planned_steps": planned,
        "saved_fraction": total / planned if planned else 0.0,
        "arms_stopped": stopped,
    }


def planner_description(cfg: StudyConfig) -> str:
    """Which planner made the plans: `rules`, or `llm` with its model and prompt versions."""
    if cfg.planner != "llm":
        return cfg.planner
    prompts = ", ".join(f"{k} v{v}" for k, v in sorted(cfg.prompt_versions.items()))
    return f"llm (model `{cfg.llm_model}` at {cfg.llm_base_url}" + (f"; prompts {prompts})" if prompts else ")")


def study_wall_s(study: Any) -> float:
    """Seconds from the study's creation to its end (to now while it runs): with CPU-hours, what a study
    cost; the two differ by how many trials ran at once (parallel trials, trials as policies of one server)."""
    end = study.finished_at or utcnow()
    return max(0.0, (end - study.created_at).total_seconds())


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


_VERDICT_CODE = {"supported": 1.0, "refuted": -1.0, "inconclusive": 0.0}


def summary_metrics(ctx: StudyContext, state: dict) -> tuple[dict[str, float | None], dict[str, str]]:
    """What the study's parent run carries: trial counts, cost, and per round the arms'
    means and intervals, each comparison's difference and p-values; verdicts as tags
    (and as metrics: 1 supported, 0 inconclusive, -1 refuted)."""
    trials = ctx.trials()
    usage = ctx.launcher.usage([t.id for t in trials if t.id is not None])
    metrics: dict[str, float | None] = {
        "trials": float(len(trials)),
        "cpu_hours": usage["cpu_hours"],
        "wall_s": study_wall_s(ctx.study()),
        "gpu_hours": usage.get("gpu_hours"),
        "llm_tokens": float(state.get("llm_tokens", 0)),
        "rounds": float(len(state.get("history", []))),
    }
    for st in ("COMPLETED", "FAILED", "CANCELLED"):
        metrics[f"trials_{st.lower()}"] = float(sum(1 for t in trials if t.status == st))
    tags = {"roost.planner": ctx.cfg.planner, "roost.stop_reason": state.get("stop_reason", "")[:5000]}
    for k, v in (early_stop_savings(state.get("history", [])) or {}).items():
        metrics[metric_key("early_stop", k)] = v
    for h in state.get("history", []):
        r = f"round{h['round'] + 1}"
        res = h["analysis"]
        es = res.get("early_stop") or {}
        if es:
            metrics[metric_key(r, "early_stop", "saved_steps")] = float(es.get("saved_steps", 0))
            metrics[metric_key(r, "early_stop", "planned_steps")] = float(es.get("planned_steps", 0))
        tags[f"roost.verdict.{r}"] = h["verdict"]
        metrics[metric_key(r, "verdict")] = _VERDICT_CODE.get(h["verdict"])
        for arm, a in res.get("arms", {}).items():
            for k in ("mean", "ci_low", "ci_high", "n"):
                metrics[metric_key(r, arm, k)] = a.get(k)
        for c in res.get("comparisons", []):
            for k in ("diff", "diff_ci_low", "diff_ci_high", "p", "p_holm"):
                metrics[metric_key(r, f"{c['arm']} vs {c['baseline']}", k)] = c.get(k)
    return metrics, tags


def round_rule(result: dict) -> str:
    """The verdict rule a round was judged by, as its analysis recorded it."""
    tested = sum(1 for c in result["comparisons"] if c.get("p_holm") is not None)
    return result.get("rule") or verdict_rule(tested, result.get("alpha", 0.05))


def study_view(ctx: StudyContext, state: dict) -> StudyView:
    """What the HTML report shows, from the same sentences and numbers as the markdown: the
    renderer (researcher/html_report.py) judges and recomputes nothing."""
    study = ctx.study()
    trials = ctx.trials()
    usage = ctx.launcher.usage([t.id for t in trials if t.id is not None])
    by_id = {t.id: t for t in trials}
    history = state.get("history", [])
    rounds = []
    for h in history:
        curves: dict[str, list] = {}
        for tid in h.get("pooled_trial_ids") or h.get("trial_ids") or []:
            t = by_id.get(tid)
            summary = ctx.summary(t) if t is not None and t.status == TrialStatus.COMPLETED.value else None
            if t is not None and summary:
                curves.setdefault(t.arm, []).append(step_rewards(summary))
        res = h["analysis"]
        rounds.append(
            RoundView(
                number=h["round"] + 1,
                statement=h["statement"],
                reason=h.get("reason") or "",
                verdict=h["verdict"],
                planner=h.get("planner") or ctx.cfg.planner,
                design=h["design"],
                analysis=res,
                conclusions=[x[2:] for x in conclusion_sentence(res).splitlines() if x],
                methods=[x for x in method_lines(res) if x],
                rule=round_rule(res),
                notes=h.get("notes") or "",
                design_note=h.get("design_note") or "",
                curves=curves,
            )
        )
    eid, rid = study.mlflow_experiment_id, study.mlflow_run_id
    current = state.get("round", 0)
    analysed = {h.get("round") for h in history}
    running = (current + 1, state["design"]) if state.get("design") and current not in analysed else None
    return StudyView(
        study_id=int(study.id or ctx.study_id),
        question=study.question,
        frame=state.get("frame") or {},
        planner=planner_description(ctx.cfg),
        facts=[
            (
                "Backend",
                f"{ctx.cfg.backend}; parallel trials {ctx.cfg.parallel}"
                + (SHARED_BASE_NOTE if ctx.cfg.shared_base else ""),
            ),
            (
                "Cost",
                f"CPU-hours {usage['cpu_hours']:.3f}; wall {_duration(study_wall_s(study))}; "
                f"LLM tokens {state.get('llm_tokens', 0)}",
            ),
            ("MLflow", f"experiment `{experiment_name(study.id, study.name)}` (id {eid}), parent run `{rid}`"),  # type: ignore[arg-type]
            ("MLflow UI", f"`{ui_route(eid, rid)}` after the UI's address" if eid and rid else "–"),
            ("Generated", utcnow().strftime("%Y-%m-%d %H:%M UTC")),
        ],
        stop_reason=state.get("stop_reason") or "",
        rounds=rounds,
        early_stop=early_stop_savings(history),
        trials=[
            {
                "id": t.id,
                "arm": t.arm,
                "seed": t.seed,
                "status": t.status,
                "final": trial_final(ctx, t),
                "run": t.mlflow_run_id or "–",
                "note": trial_note(ctx, t),
            }
            for t in trials
        ],
        running=running,
    )


#: what a --shared-base study's trials were, said where its report names how they ran
SHARED_BASE_NOTE = (
    "; --shared-base: each trial a LoRA adapter (a policy) of one server's base model, every trial of a round "
    "at once unless --parallel says otherwise, its lr scaled by --lora-lr-scale"
)


#: the stop reason of a study whose plan `researcher approve --reject` turned down: it ends CANCELLED
PLAN_REJECTED = "the plan was not approved"


def copy_report(src: Path, out: Path) -> Path:
    """report.html copied into the folder `out` (made if missing), unless it is the file itself; OSError
    when it cannot be written."""
    dest = out / html_report.FILE_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.resolve() != dest.resolve():
        shutil.copyfile(src, dest)
    return dest


def copy_html(src: Path, out: str | None) -> None:
    """The user's copy of report.html (`--out`, else ./studies/study-N where the study was started), written
    by whoever ends the study: the daemon and `researcher stop` end studies too, and a copy made mid-run
    (`researcher report N --html`) must not stay behind stale. A folder that cannot be written is said, not
    fatal: the study's own report stands."""
    if not out:
        return
    try:
        copy_report(src, Path(out))
    except OSError as exc:
        log.warning("could not copy the report to %s: %s (it is in %s)", Path(out) / html_report.FILE_NAME, exc, src)


def write_report(ctx: StudyContext, state: dict) -> Path:
    """Write the markdown, upload it with its plots and summary, close the study (idempotent)."""
    report_dir = Path(ctx.cfg.study_dir) / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    ctx.ingest([t.id for t in ctx.trials() if t.id is not None])
    text = render(ctx, state, report_dir)
    path = report_dir / "report.md"
    path.write_text(text)
    view = study_view(ctx, state)
    html_report.write(view, report_dir / html_report.FILE_NAME)
    copy_html(report_dir / html_report.FILE_NAME, ctx.cfg.report_out)
    study = ctx.study()
    if study.mlflow_run_id:
        tracking.log_report(study.mlflow_run_id, report_dir)
        # the reward first: MLflow's run page lists a run's metrics in the order they were first logged
        tracking.log_reward_curves(study.mlflow_run_id, html_report.arm_curves(view))
        tracking.log_summary(study.mlflow_run_id, *summary_metrics(ctx, state))
    cancelled = study.status == StudyStatus.CANCELLED.value or state.get("stop_reason") == PLAN_REJECTED
    status = StudyStatus.CANCELLED if cancelled else StudyStatus.COMPLETED  # a rejected plan studied nothing
    ended = {t.status for t in ctx.trials()}
    all_failed = TrialStatus.FAILED.value in ended and TrialStatus.COMPLETED.value not in ended
    if status == StudyStatus.COMPLETED and all_failed:
        status = StudyStatus.FAILED  # every trial that ran failed: it "completed", the cause unseen
    if study.mlflow_run_id:
        tracking.finish_study_run(study.mlflow_run_id, tracking.run_status(status))
    ctx.set_study_status(status, report=text, finished_at=utcnow())
    return path
