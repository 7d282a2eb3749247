"""The study as a LangGraph `StateGraph`, checkpointed under thread_id = study id.

    frame → hypothesize → design → approve → launch ⇄ monitor → analyze → decide ─┬→ hypothesize
                  └────────────(nothing left to ask)─────────────────────────────└→ report → END

Nodes never sleep. `monitor` reconciles the trials once and, while any still run,
*interrupts* the graph (`{"kind": "wait"}`); whoever drives the study (the
foreground loop, or the scheduler daemon's tick) resumes it later with
`Command(resume="tick")`. `approve` interrupts with `{"kind": "approval"}` and
only a user's `researcher approve` resumes it.

A node can run twice (a crash after its side effects but before the checkpoint),
so each is idempotent: rows are looked up by (study, round) before being
created; launches go through `TrialLauncher.launch` (exactly once); MLflow
child runs are found by tag. The state holds only JSON-able data.

A planner that cannot go on (a topic it cannot express, no valid answer after
its retries, a design the trial budget cannot cover) ends the study with that
reason in the report. An unreachable LLM endpoint is raised instead: nothing is
wrong with the study, and `researcher resume` continues from the last checkpoint.
"""

from __future__ import annotations

import logging
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from sqlmodel import Session, select

from researcher import analysis as stats
from researcher import shared_base
from researcher.context import StudyContext
from researcher.early_stop import early_stop, round_early_stop
from researcher.experiment import Design, Frame, HypothesisSpec
from researcher.llm import BudgetExceeded
from researcher.plan_steps import PLANNING_STOPS, cannot_plan, check_program, plan_design
from researcher.planning import BudgetTooSmall
from researcher.report import PLAN_REJECTED, write_report
from store.models import Hypothesis, HypothesisStatus, StudyStatus, Trial, TrialStatus

log = logging.getLogger(__name__)


class StudyState(TypedDict, total=False):
    study_id: int
    topic: str
    frame: dict
    round: int
    hypothesis: dict  # HypothesisSpec + "id" (row)
    design: dict
    trial_ids: list[int]
    analysis: dict
    history: list[dict]
    follow_ups: list[dict]
    llm_tokens: int
    approved_rounds: list[int]
    design_note: str  # what fitting the design to the trial budget cut
    planner: str
    stop_reason: str
    route: str
    report_path: str
    pooled_trial_ids: list[int]  # this round's trials and those of the earlier looks it is analysed with


def build_graph(ctx: StudyContext) -> StateGraph:
    g = StateGraph(StudyState)
    g.add_node("frame", lambda s: frame(ctx, s))
    g.add_node("hypothesize", lambda s: hypothesize(ctx, s))
    g.add_node("design", lambda s: design(ctx, s))
    g.add_node("approve", lambda s: approve(ctx, s))
    g.add_node("launch", lambda s: launch(ctx, s))
    g.add_node("monitor", lambda s: monitor(ctx, s))
    g.add_node("analyze", lambda s: analyze(ctx, s))
    g.add_node("decide", lambda s: decide(ctx, s))
    g.add_node("report", lambda s: report(ctx, s))
    g.add_edge(START, "frame")
    route = lambda s: s.get("route", "report")  # noqa: E731
    g.add_conditional_edges("frame", route, ["hypothesize", "report"])
    g.add_conditional_edges("hypothesize", route, ["design", "report"])
    g.add_conditional_edges("design", route, ["approve", "report"])
    g.add_conditional_edges("approve", route, ["launch", "report"])
    g.add_edge("launch", "monitor")
    g.add_conditional_edges("monitor", route, ["launch", "monitor", "analyze"])
    g.add_edge("analyze", "decide")
    g.add_conditional_edges("decide", route, ["hypothesize", "report"])
    g.add_edge("report", END)
    return g


def _planner(ctx: StudyContext, state: StudyState) -> Any:
    p = ctx.planner
    p.tokens_used = state.get("llm_tokens", 0)
    if hasattr(p, "token_budget"):
        p.token_budget = ctx.cfg.budget.llm_tokens
    if hasattr(p, "trials_left"):  # the rules planner sizes a follow-up round to what is left
        p.trials_left = ctx.trials_left()
    return p


# ---------------------------------------------------------------- nodes


def frame(ctx: StudyContext, state: StudyState) -> dict:
    if state.get("frame"):
        return {"route": "hypothesize"}
    p = _planner(ctx, state)
    try:
        f = p.frame(state["topic"], ctx.cfg.defaults)
    except BudgetExceeded as e:
        return {"route": "report", "stop_reason": str(e), "llm_tokens": p.tokens_used, "planner": p.name}
    except PLANNING_STOPS as e:
        return {"route": "report", "stop_reason": cannot_plan(p, e), "llm_tokens": p.tokens_used, "planner": p.name}
    return {
        "frame": f.model_dump(mode="json"),
        "round": 0,
        "history": [],
        "follow_ups": [],
        "llm_tokens": p.tokens_used,
        "route": "hypothesize",
        "planner": p.name,
    }


def _hypothesis_row(s: Session, study_id: int, rnd: int) -> Hypothesis | None:
    rows = s.exec(select(Hypothesis).where(Hypothesis.study_id == study_id)).all()
    return next((h for h in rows if (h.conclusion or {}).get("round") == rnd), None)


def hypothesize(ctx: StudyContext, state: StudyState) -> dict:
    rnd = state.get("round", 0)
    if state.get("stop_reason"):
        return {"route": "report"}
    with Session(ctx.engine, expire_on_commit=False) as s:
        row = _hypothesis_row(s, ctx.study_id, rnd)
        if row is not None:  # this node already ran for this round (crash before its checkpoint)
            spec = HypothesisSpec.model_validate(row.conclusion["spec"])
            return {"hypothesis": {**spec.model_dump(mode="json"), "id": row.id}, "route": "design"}
    follow = list(state.get("follow_ups", []))
    p = _planner(ctx, state)
    updates: dict[str, Any] = {}
    if follow:
        spec = HypothesisSpec.model_validate(follow.pop(0))
        updates["follow_ups"] = follow
    else:
        try:
            got = p.hypothesize(state["topic"], Frame.model_validate(state["frame"]), state.get("history", []))
        except BudgetExceeded as e:
            return {"route": "report", "stop_reason": str(e), "llm_tokens": p.tokens_used}
        except PLANNING_STOPS as e:
            return {"route": "report", "stop_reason": cannot_plan(p, e), "llm_tokens": p.tokens_used}
        if got is None:
            return {"route": "report", "llm_tokens": p.tokens_used}
        spec = got
    with Session(ctx.engine, expire_on_commit=False) as s:
        row = Hypothesis(
            study_id=ctx.study_id,
            statement=spec.statement,
            rationale=spec.rationale,
            conclusion={"round": rnd, "spec": spec.model_dump(mode="json")},
        )
        s.add(row)
        s.commit()
        hid = row.id
    return {
        **updates,
        "hypothesis": {**spec.model_dump(mode="json"), "id": hid},
        "llm_tokens": p.tokens_used,
        "route": "design",
    }


def design(ctx: StudyContext, state: StudyState) -> dict:
    hyp = state["hypothesis"]
    rnd = state.get("round", 0)
    with Session(ctx.engine, expire_on_commit=False) as s:
        row = s.get(Hypothesis, hyp["id"])
        assert row is not None
        if "design" in (row.conclusion or {}):  # trials already created for this round
            ids = [t.id for t in s.exec(select(Trial).where(Trial.hypothesis_id == row.id).order_by(Trial.id)).all()]
            return {
                "design": row.conclusion["design"],
                "trial_ids": ids,
                "route": "approve",
                "design_note": row.conclusion.get("design_note", ""),
            }
    p = _planner(ctx, state)
    spec = HypothesisSpec.model_validate({k: v for k, v in hyp.items() if k != "id"})
    try:
        d, note = plan_design(p, ctx.cfg, Frame.model_validate(state["frame"]), spec, ctx.trials_left())
        check_program(ctx.cfg, d)
    except BudgetExceeded as e:
        return {"route": "report", "stop_reason": str(e), "llm_tokens": p.tokens_used}
    except BudgetTooSmall as e:
        return {"route": "report", "stop_reason": f"refused: {e}", "llm_tokens": p.tokens_used}
    except PLANNING_STOPS as e:
        return {"route": "report", "stop_reason": cannot_plan(p, e), "llm_tokens": p.tokens_used}
    except ValueError as e:
        return {"route": "report", "stop_reason": f"no valid design: {e}", "llm_tokens": p.tokens_used}
    with Session(ctx.engine, expire_on_commit=False) as s:  # trials and marker in one transaction
        row = s.get(Hypothesis, hyp["id"])
        assert row is not None
        trials = [
            Trial(
                study_id=ctx.study_id,
                hypothesis_id=row.id,
                arm=c.arm,
                seed=c.seed,
                config={"experiment": c.model_dump(mode="json"), "round": rnd},
            )
            for c in _launch_order(ctx, d)
        ]
        s.add_all(trials)
        row.conclusion = {**row.conclusion, "design": d.model_dump(mode="json"), "design_note": note}
        s.add(row)
        s.commit()
        ids = [t.id for t in trials]
    if note:
        log.warning("study %s: %s", ctx.study_id, note)
    return {
        "design": d.model_dump(mode="json"),
        "trial_ids": ids,
        "llm_tokens": p.tokens_used,
        "route": "approve",
        "design_note": note,
    }


def _launch_order(ctx: StudyContext, d: Design) -> list:
    """The round's trials in launch order: arm by arm, or with early stopping seed by seed, so
    that every arm has trials running when a rung is judged (and a stopped arm has some left)."""
    configs = d.trial_configs()
    if ctx.cfg.adaptive.early_stop:
        configs.sort(key=lambda c: c.seed)  # stable: arms keep their order within a seed
    return configs


def approve(ctx: StudyContext, state: StudyState) -> dict:
    rnd = state.get("round", 0)
    done = list(state.get("approved_rounds", []))
    if not ctx.cfg.approve or rnd in done:
        return {"route": "launch"}
    ctx.set_study_status(StudyStatus.PAUSED)
    answer = interrupt(
        {
            "kind": "approval",
            "round": rnd,
            "design": state["design"],
            "hypothesis": state["hypothesis"]["statement"],
            "planner": ctx.planner.name,
            "note": state.get("design_note", ""),
        }
    )
    ctx.set_study_status(StudyStatus.ACTIVE)
    if isinstance(answer, dict) and answer.get("approved"):
        return {"approved_rounds": [*done, rnd], "route": "launch"}
    ctx.launcher.cancel(state.get("trial_ids", []), "plan not approved")
    return {"stop_reason": PLAN_REJECTED, "route": "report"}


def _counts(statuses: dict[int, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for st in statuses.values():
        out[st] = out.get(st, 0) + 1
    return out


def launch(ctx: StudyContext, state: StudyState) -> dict:
    ids = state.get("trial_ids", [])
    statuses = ctx.launcher.refresh(ids)
    running = ctx.running_trials()
    updates: dict[str, Any] = {}
    if ctx.cfg.shared_base and any(statuses.get(t) == TrialStatus.PENDING.value for t in ids):
        shared_base.ensure(ctx.launcher.manager, ctx.cfg, ctx.study_id)  # trials wait for it to answer
    for tid in ids:
        if statuses.get(tid) != TrialStatus.PENDING.value or running >= ctx.cfg.parallel:
            continue
        over = ctx.over_budget(state, launching=True)
        if over:
            log.warning("study %s: %s; no more launches", ctx.study_id, over)
            ctx.launcher.cancel(
                [t for t in ids if statuses.get(t) == TrialStatus.PENDING.value], f"not launched: {over}"
            )
            updates["stop_reason"] = over
            break
        if ctx.launcher.launch(tid) in ("submitted", "adopted"):
            running += 1
    return updates


def monitor(ctx: StudyContext, state: StudyState) -> dict:
    ids = state.get("trial_ids", [])
    statuses = ctx.launcher.refresh(ids)
    ctx.ingest(ids)
    counts = _counts(statuses)
    updates: dict[str, Any] = {}
    hard = ctx.over_budget(state, launching=False)
    if hard and counts.get(TrialStatus.RUNNING.value, 0) + counts.get(TrialStatus.PENDING.value, 0):
        ctx.launcher.cancel(ids, f"stopped: {hard}")
        updates["stop_reason"] = hard
        statuses = ctx.launcher.refresh(ids)
        counts = _counts(statuses)
    if early_stop(ctx, state):  # arms cut at a rung: their trials are cancelled, count again
        counts = _counts(ctx.launcher.refresh(ids))
    pending = counts.get(TrialStatus.PENDING.value, 0)
    running = counts.get(TrialStatus.RUNNING.value, 0)
    if pending and not state.get("stop_reason") and ctx.running_trials() < ctx.cfg.parallel:
        return {**updates, "route": "launch"}
    if pending or running:
        interrupt({"kind": "wait", "running": running, "pending": pending})
        return {**updates, "route": "monitor"}
    return {**updates, "route": "analyze"}


def _earlier_look(state: StudyState) -> dict | None:
    """The history entry of the round this one gives more seeds (its earlier look), if any."""
    ext = state["hypothesis"].get("extends")
    if ext is None:
        return None
    return next((h for h in state.get("history", []) if h.get("round") == ext), None)


def analyze(ctx: StudyContext, state: StudyState) -> dict:
    ids = list(state.get("trial_ids", []))
    ctx.ingest(ids)
    f = Frame.model_validate(state["frame"])
    d = state["design"]
    prior = _earlier_look(state)
    prior_result = prior["analysis"] if prior else {}
    pooled = [*(prior.get("pooled_trial_ids", prior.get("trial_ids", [])) if prior else []), *ids]
    values = ctx.arm_values(pooled, f)
    names = [a["name"] for a in d["arms"]]
    metrics = {n: [v for _, v in values.get(n, [])] for n in names}
    seeds = {n: [s for s, _ in values.get(n, [])] for n in names}
    es = round_early_stop(ctx, state["hypothesis"]["id"])
    stopped = {**(prior_result.get("stopped") or {}), **es["stopped"]}
    planned = sorted({*(prior_result.get("seeds") or []), *d["seeds"]})
    sequential = None
    a = ctx.cfg.adaptive
    if ctx.cfg.planner == "rules" and a.rounds > 1:  # more seeds may follow: this is one look of several
        cap = max(a.seeds_cap(ctx.cfg.defaults.seeds), len(planned))
        earlier = list((prior_result.get("sequential") or {}).get("fractions", []))
        fractions = [*earlier, len(planned) / cap]
        if fractions[0] < 1:
            sequential = stats.sequential_look(fractions, spending=a.spending, max_seeds=cap)
    result = stats.analyze(
        metrics,
        baseline=d["baseline"],
        direction=state["hypothesis"]["direction"],
        seeds=seeds,
        deterministic=ctx.cfg.deterministic,
        sequential=sequential,
        stopped=stopped,
    )
    result["seeds"] = planned
    result["early_stop"] = es if es["rungs"] else None
    result["pooled_rounds"] = [*(prior_result.get("pooled_rounds") or []), state.get("round", 0)]
    result["metric"] = f.metric
    result["metric_description"] = f.metric_description()
    result["metric_window"] = f.metric_window
    result["plots"] = ctx.round_plots(state.get("round", 0), pooled, result, f)
    return {"analysis": result, "pooled_trial_ids": pooled}


def decide(ctx: StudyContext, state: StudyState) -> dict:
    result = state["analysis"]
    hyp = state["hypothesis"]
    rnd = state.get("round", 0)
    verdict = result["verdict"]
    status = {"supported": HypothesisStatus.SUPPORTED, "refuted": HypothesisStatus.REFUTED}.get(
        verdict, HypothesisStatus.INCONCLUSIVE
    )
    with Session(ctx.engine, expire_on_commit=False) as s:
        row = s.get(Hypothesis, hyp["id"])
        if row is not None:
            row.status = status.value
            row.conclusion = {**(row.conclusion or {}), "verdict": verdict, "analysis": result}
            s.add(row)
            s.commit()
    history = [h for h in state.get("history", []) if h.get("round") != rnd]
    history.append(
        {
            "round": rnd,
            "statement": hyp["statement"],
            "verdict": verdict,
            "hypothesis_id": hyp["id"],
            "design": state["design"],
            "analysis": result,
            "trial_ids": state.get("trial_ids", []),
            "planner": ctx.planner.name,
            "design_note": state.get("design_note", ""),
            "reason": hyp.get("rationale", ""),
            "extends": hyp.get("extends"),
            "pooled_trial_ids": state.get("pooled_trial_ids", state.get("trial_ids", [])),
        }
    )
    p = _planner(ctx, state)
    can_continue = not state.get("stop_reason") and not ctx.over_budget(state, launching=True)
    updates: dict[str, Any] = {"history": history, "round": rnd + 1}
    try:
        decision = p.decide(
            Frame.model_validate(state["frame"]),
            HypothesisSpec.model_validate({k: v for k, v in hyp.items() if k != "id"}),
            result,
            history[:-1],
            can_continue,
        )
    except BudgetExceeded as e:
        return {**updates, "stop_reason": str(e), "llm_tokens": p.tokens_used, "route": "report"}
    except PLANNING_STOPS as e:
        return {**updates, "stop_reason": cannot_plan(p, e), "llm_tokens": p.tokens_used, "route": "report"}
    history[-1]["notes"] = decision.notes
    updates["llm_tokens"] = p.tokens_used
    if decision.stop or not can_continue:
        return {**updates, "route": "report"}
    follow = [*state.get("follow_ups", []), *[h.model_dump(mode="json") for h in decision.follow_ups]]
    return {**updates, "follow_ups": follow, "route": "hypothesize"}


def report(ctx: StudyContext, state: StudyState) -> dict:
    if ctx.cfg.shared_base:  # every trial has ended: the study's server has nothing left to serve
        shared_base.stop(ctx.launcher.manager, ctx.study_id)
    path = write_report(ctx, dict(state))
    return {"report_path": str(path)}
