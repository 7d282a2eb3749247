"""Successive halving inside a round: arms clearly behind at a rung have their trials cancelled
(`Adaptive.early_stop`), the record kept on the round's hypothesis row. Called by the graph's
`monitor` (to cut) and `analyze` (to say what was cut).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from sqlmodel import Session

from researcher import analysis as stats
from researcher.context import StudyContext
from researcher.experiment import Frame
from researcher.sequential import halving_stops
from store.models import Hypothesis, TrialStatus

log = logging.getLogger(__name__)


def round_early_stop(ctx: StudyContext, hypothesis_id: int) -> dict[str, Any]:
    """A round's early-stopping record, kept on its hypothesis row (not in the graph state: `monitor`
    may be re-run after its interrupt, and a rung must be judged once, not again on the arms left)."""
    with Session(ctx.engine) as s:
        row = s.get(Hypothesis, hypothesis_id)
        got = dict((row.conclusion or {}).get("early_stop") or {}) if row is not None else {}
    return {"rungs": [], "stopped": {}, "saved_steps": 0, "planned_steps": 0, **got}


def early_stop(ctx: StudyContext, state: Mapping[str, Any]) -> bool:
    """Successive halving at the rungs this round's trials have all reached (`Adaptive.early_stop`).

    A rung is judged once, when every live trial of every live arm has reported that many
    steps (trials that ended early aside): arms in the bottom half *and* clearly behind the
    leader (`sequential.halving_stops`) have their trials cancelled, and the record (rungs
    judged, arms stopped and why, trial-steps saved) goes on the hypothesis row. True when
    an arm was stopped. Off with --shared-base, whose trials' metrics live in the study
    server's folder.
    """
    a = ctx.cfg.adaptive
    if not a.early_stop or ctx.cfg.shared_base or not state.get("design") or not state.get("hypothesis"):
        return False
    d, hid = state["design"], state["hypothesis"]["id"]
    f = Frame.model_validate(state["frame"])
    es = round_early_stop(ctx, hid)
    trials = ctx.trials(state.get("trial_ids", []))
    steps = int(d["steps"])
    es["planned_steps"] = steps * len(trials)
    changed = cut = False
    dead = (TrialStatus.FAILED.value, TrialStatus.CANCELLED.value)
    for i, rung in enumerate(a.rungs):
        at = max(1, math.ceil(rung * steps))
        if i in es["rungs"] or at >= steps:
            continue
        live = [t for t in trials if t.arm not in es["stopped"] and t.status not in dead]
        rewards = {t.id: ctx.interim_rewards(t) for t in live}
        if any(len(r) < at for r in rewards.values()):
            break  # rungs are judged in order, each on every live trial
        interim: dict[str, list[float]] = {}
        for t in live:
            v = stats.trial_metric(rewards[t.id][:at], f.metric, stats.metric_window(at))
            if v is not None:
                interim.setdefault(t.arm, []).append(v)
        es["rungs"] = [*es["rungs"], i]
        changed = True
        for arm, why in halving_stops(interim, d["baseline"]).items():
            es["stopped"] = {**es["stopped"], arm: f"stopped at step {at} of {steps}: {why}"}
            going = (TrialStatus.PENDING.value, TrialStatus.RUNNING.value)
            victims = [t for t in live if t.arm == arm and t.status in going]
            es["saved_steps"] += sum(max(0, steps - len(rewards[t.id])) for t in victims)
            ctx.launcher.cancel([t.id for t in victims if t.id is not None], es["stopped"][arm])
            log.info("study %s: arm %s %s", ctx.study_id, arm, es["stopped"][arm])
            cut = True
    if changed:
        with Session(ctx.engine, expire_on_commit=False) as s:
            row = s.get(Hypothesis, hid)
            if row is not None:
                row.conclusion = {**(row.conclusion or {}), "early_stop": es}
                s.add(row)
                s.commit()
    return cut
