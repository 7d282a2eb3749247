"""The deterministic planner: reads knobs and values out of the topic (researcher/topic.py), designs ablations.

It needs no model and always gives the same plan for the same topic, which makes
it the default without an LLM and the reference the LLM planner is tested against:

    >>> p = RulesPlanner()
    >>> f = p.frame("Does the learning rate matter for arithmetic? Compare 0 and 3e-4", PlanDefaults())
    >>> (f.task, f.knobs, f.metric)
    ('arith', ['lr'], 'final_reward')

Values named in the topic become arms; the value a topic measures the others against
("Does 1e-3 beat 3e-4?", "better than", "worse than": 3e-4, with the side it predicts), else
the first value named (or the knob's natural control: lr 0, merging on, KL 0) is the
baseline. One value named is
compared with the knob's default (what a trial runs without it); without values,
a knob gets default arms (`DEFAULT_ARMS`). Counts ("over 100 steps", "5 seeds")
are never values. A topic naming several knobs compares the one named with two
values (or not introduced as a setting: "with a group size of 8") and holds the
others at the one value it names, in every arm (`Frame.baseline`).

After a round (`next_round`, up to `Adaptive.rounds` rounds): a supported effect of a
numeric knob → a round that brackets the best value (log-midpoints for lr-like knobs,
midpoints for linear ones); an inconclusive comparison with budget left → more seeds on
the same arms, the next look of a sequential comparison (alpha spending, analysed
together with the earlier looks); else stop. Every round says why it was chosen (its
rationale) and every stop says why (the decision's notes), and both land in the report.

A topic it cannot express (no knob named, or something outside its knobs such as
an optimizer or an architecture) raises `UnsupportedTopic` listing what it can
study, instead of quietly studying the learning rate.
"""

from __future__ import annotations

import math
import re
from typing import Any

from researcher.config import Adaptive
from researcher.experiment import KNOBS, MIN_SEEDS, Design, Frame, HypothesisSpec, arm_name
from researcher.planning import Decision, PlanDefaults, UnsupportedTopic, choose_direction, default_design
from researcher.topic import (
    check_scope,
    compared_against,
    detect_task,
    detect_values,
    out_of_range,
    studied_and_fixed,
)
from swarm.algorithms.choices import Advantage, LossAgg

DEFAULT_ARMS: dict[str, list[Any]] = {
    "lr": [0.0, 3e-4],
    "group_size": [4, 8, 16],
    "batch_groups": [2, 4],
    "kl_coef": [0.0, 0.1],
    "lora_rank": [0, 8],  # full fine-tuning against a rank-8 adapter
    "temperature": [1.0, 0.7],
    "timeline_merge": [True, False],
    "advantage": [Advantage.grpo.value, Advantage.rloo.value],
    "task": ["arith", "arith+guess"],
    "loss_agg": [LossAgg.token_mean.value, LossAgg.seq_mean_token_mean.value],
    "model": ["embedded"],
}


def natural_baseline(knob: str, values: list[Any]) -> Any:
    """The control arm: lr/KL 0, merging on, full fine-tuning (LoRA rank 0), the embedded model; else the
    first value named."""
    for control in {
        "lr": [0.0],
        "kl_coef": [0.0],
        "lora_rank": [0],  # full fine-tuning
        "timeline_merge": [True],
        "model": ["embedded"],
        "advantage": [Advantage.grpo.value],
        "task": ["arith"],
        "loss_agg": [LossAgg.token_mean.value],
    }.get(knob, []):
        if control in values:
            return control
    return values[0]


class RulesPlanner:
    """Topic → frame → an ablation hypothesis → arms × seeds; then `next_round` decides what follows."""

    name = "rules"
    tokens_used = 0

    def __init__(self, adaptive: Adaptive | None = None) -> None:
        self.adaptive = adaptive or Adaptive()
        self.trials_left: int | None = None  # set by the study graph before `decide` (None: no trial budget)

    def frame(self, topic: str, defaults: PlanDefaults) -> Frame:
        knobs = check_scope(topic)
        t = topic.lower()
        metric = "final_reward"
        if re.search(r"\b(gain|improve\w*|learning progress)\b", t) and "final" not in t:
            metric = "reward_gain"
        elif re.search(r"\b(average|mean) reward\b", t):
            metric = "mean_reward"
        studied, fixed = studied_and_fixed(topic, knobs)
        return Frame(
            question=topic.strip(),
            task=detect_task(topic),
            metric=metric,
            metric_window=defaults.window(),
            knobs=[studied],
            baseline=fixed,
        )

    def hypothesize(self, topic: str, frame: Frame, history: list[dict]) -> HypothesisSpec | None:
        if history:  # one round: the rules planner has nothing further to ask
            return None
        knob = frame.knobs[0]
        values = detect_values(topic, knob)
        if len(values) <= 1 and (outside := out_of_range(topic, knob)):
            # a value dropped: the study would compare the one kept (or the defaults) instead of what was asked
            raise UnsupportedTopic(
                f"the topic names {', '.join(outside)} for {knob}, outside the range a study may use "
                f"({KNOBS[knob].range_text()}); name values within it"
            )
        if knob == "model":
            values = ["embedded", *[v for v in values if v != "embedded"]]
        default = KNOBS[knob].default
        if len(values) == 1 and default is not None and default != values[0]:
            values = [default, *values]  # "Does a group size of 32 help?": against what a trial runs otherwise
        if len(values) < 2:
            values = [*values, *[v for v in DEFAULT_ARMS[knob] if v not in values]]
        if len(values) < 2:
            hint = " (model directories, e.g. /models/a)" if knob == "model" else ""
            raise UnsupportedTopic(f"name at least two values of {knob} to compare in the topic{hint}")
        against = compared_against(topic, knob, values)  # "Does 1e-3 beat 3e-4?": 3e-4 is the control
        base = against[0] if against else natural_baseline(knob, values)
        treatments = [v for v in values if v != base]
        direction = against[1] if against else choose_direction(knob, base, treatments)
        verb = {"greater": "a higher", "less": "a lower", "two-sided": "a different"}[direction]
        tv = ", ".join(arm_name(knob, v) for v in treatments)
        gives = "gives" if len(treatments) == 1 else "each give"
        statement = f"{tv} {gives} {verb} {frame.metric.replace('_', ' ')} than {arm_name(knob, base)} on {frame.task}"
        rationale = f"Ablation of {knob} named in the question; {arm_name(knob, base)} is the control."
        if frame.baseline:
            held = ", ".join(arm_name(k, v) for k, v in frame.baseline.items())
            rationale += f" Every arm runs with {held}, as the question says."
        return HypothesisSpec(
            statement=statement,
            rationale=rationale,
            knob=knob,
            baseline_value=base,
            treatment_values=treatments,
            direction=direction,
        )

    def design(self, frame: Frame, hypothesis: HypothesisSpec, defaults: PlanDefaults) -> Design:
        return default_design(frame, hypothesis, defaults)

    def decide(
        self, frame: Frame, hypothesis: HypothesisSpec, analysis: dict, history: list[dict], can_continue: bool
    ) -> Decision:
        return next_round(frame, hypothesis, analysis, history, can_continue, self.adaptive, self.trials_left)


# ---------------------------------------------------------------- adaptive rounds

LOG_KNOBS = frozenset({"lr", "kl_coef", "lora_rank"})  # searched on a log scale: their useful values span decades


def log_scaled(knob: str) -> bool:
    """lr-like knobs (rates, coefficients spanning decades) are bracketed by log-midpoints."""
    return knob in LOG_KNOBS or knob.endswith("_lr") or knob.startswith("lr_")


def _round_sig(x: float, digits: int = 2) -> float:
    return float(f"{x:.{digits}g}") if x else 0.0


def bracket_values(knob: str, best: Any, tested: list[Any]) -> list[Any]:
    """New values either side of `best`, between it and its tested neighbours.

    Log-scaled knobs (`log_scaled`): the geometric midpoint √(a·b) with a neighbour, or half
    a decade out (×/÷ √10) where there is none or it is 0; linear knobs: the arithmetic
    midpoint, or half the distance to the other neighbour out. Rounded (2 significant
    digits on a log scale, 3 on a linear one; integers for int knobs), kept within the knob's study range, never a value
    already tested.
    """
    k = KNOBS[knob]
    if k.kind not in ("float", "int"):
        return []
    b = float(best)
    vals = sorted({float(v) for v in tested})
    lower = [v for v in vals if v < b]
    upper = [v for v in vals if v > b]
    lo_n, hi_n = (lower[-1] if lower else None), (upper[0] if upper else None)
    out: list[float] = []
    if log_scaled(knob) and b > 0:
        out.append(math.sqrt(lo_n * b) if lo_n and lo_n > 0 else b / math.sqrt(10))
        out.append(math.sqrt(hi_n * b) if hi_n is not None else b * math.sqrt(10))
    else:
        span = (hi_n - b) if hi_n is not None else (b - lo_n) if lo_n is not None else (abs(b) or 1.0)
        out.append((lo_n + b) / 2 if lo_n is not None else b - span / 2)
        span = (b - lo_n) if lo_n is not None else span
        out.append((hi_n + b) / 2 if hi_n is not None else b + span / 2)
    got: list[Any] = []
    for v in out:
        v = round(v) if k.kind == "int" else _round_sig(v, 2 if log_scaled(knob) else 3)
        if k.low is not None:
            v = max(v, k.low)
        if k.high is not None:
            v = min(v, k.high)
        v = k.validate(v)
        if float(v) not in vals and float(v) != b and v not in got:
            got.append(v)
    return got


def _arm_value(spec: HypothesisSpec, arm: str) -> Any:
    for v in [spec.baseline_value, *spec.treatment_values]:
        if arm_name(spec.knob, v) == arm:
            return v
    return None


def best_arm(analysis: dict) -> str:
    """The arm a bracket centres on: the best-scoring treatment significantly above the
    baseline, else the baseline (a supported two-sided effect where the baseline won)."""
    level = analysis.get("level", analysis.get("alpha", 0.05))
    winners = [
        c["arm"]
        for c in analysis.get("comparisons", [])
        if c.get("p_holm") is not None and c["p_holm"] < level and (c.get("diff") or 0) > 0 and not c.get("stopped")
    ]
    arms = analysis.get("arms", {})
    if winners:
        return max(winners, key=lambda a: arms[a]["mean"])
    return analysis["baseline"]


def _tested_values(knob: str, spec: HypothesisSpec, history: list[dict]) -> list[Any]:
    vals = [spec.baseline_value, *spec.treatment_values]
    for h in history:
        for arm in h.get("design", {}).get("arms", []):
            if knob in arm.get("knobs", {}):
                vals.append(arm["knobs"][knob])
    return vals


def _fmt_ci(c: dict) -> str:
    lo, hi = c.get("diff_ci_low"), c.get("diff_ci_high")
    if lo is None or hi is None or c.get("diff") is None:
        return "no interval"
    return f"difference {c['diff']:.3f} [{lo:.3f}, {hi:.3f}]"


def next_round(
    frame: Frame,
    spec: HypothesisSpec,
    analysis: dict,
    history: list[dict],
    can_continue: bool,
    adaptive: Adaptive,
    trials_left: int | None = None,
) -> Decision:
    """What follows a round: a bracket, more seeds, or a stop, each with its reason (pure).

    `analysis` is this round's result (pooled with the earlier looks of its comparison,
    with `sequential` and `seeds` set by the study graph); `history` the earlier rounds.
    Rules, in order: the budget or the round limit ends the study; a supported effect of a
    numeric knob brackets the best value; an inconclusive comparison gets more seeds while
    the comparison has seeds to go (`Adaptive.max_seeds`), the budget covers them and the
    intervals are wider than `Adaptive.precision`; anything else stops.
    """
    rnd = len(history)  # this round, 0-based
    here = f"Round {rnd + 1}"
    if not can_continue:
        return Decision(stop=True, notes=f"{here} is the last: the study's budget is spent.")
    if rnd + 1 >= adaptive.rounds:
        return Decision(stop=True, notes=f"{here} is the last: the study's limit is {adaptive.rounds} round(s).")
    verdict = analysis.get("verdict")
    knob = KNOBS[spec.knob]
    if verdict == "supported":
        if knob.kind not in ("float", "int"):
            return Decision(stop=True, notes=f"{here} supported an effect of {spec.knob}, which has no values between.")
        best = best_arm(analysis)
        best_value = _arm_value(spec, best)
        if best_value is None:
            return Decision(stop=True, notes=f"{here}: the best arm {best} is not a value of {spec.knob}.")
        new = bracket_values(spec.knob, best_value, _tested_values(spec.knob, spec, history))
        if not new:
            return Decision(stop=True, notes=f"{here}: every value around {best} was tested; nothing left to bracket.")
        if trials_left is not None and trials_left < 2 * MIN_SEEDS:
            return Decision(stop=True, notes=f"{here} supported an effect, but {trials_left} trial(s) are left.")
        scale = "log-midpoints (lr-like knobs are searched on a log scale)" if log_scaled(spec.knob) else "midpoints"
        means = analysis.get("arms", {})
        score = ", ".join(f"{a} {means[a]['mean']:.3f}" for a in means if means[a].get("mean") is not None)
        new_names = ", ".join(arm_name(spec.knob, v) for v in new)
        rationale = (
            f"{here} supported an effect of {spec.knob} ({frame.metric.replace('_', ' ')}: {score}); {best} was best, "
            f"so this round brackets it with {scale} {new_names} against {best} to see whether a nearby value "
            "does better."
        )
        follow = HypothesisSpec(
            statement=f"{new_names} {'gives' if len(new) == 1 else 'each give'} a different "
            f"{frame.metric.replace('_', ' ')} than {best} on {frame.task}",
            rationale=rationale,
            knob=spec.knob,
            baseline_value=best_value,
            treatment_values=new,
            direction="two-sided",
        )
        return Decision(stop=False, follow_ups=[follow], notes=f"{here} supported: next, a bracket around {best}.")
    if verdict != "inconclusive":
        why = {
            "refuted": "the effect goes against the prediction",
            "too few seeds to say": "too few trials completed to compare (failed trials are not retried)",
        }.get(str(verdict), f"the verdict is {verdict}")
        return Decision(stop=True, notes=f"{here} ends the study: {why}.")
    seq = analysis.get("sequential")
    if not seq:
        return Decision(stop=True, notes=f"{here} was inconclusive, and the study allows no further look at it.")
    so_far = sorted(int(x) for x in analysis.get("seeds") or [])
    cap = int(seq.get("max_seeds") or len(so_far))
    per_look = len(spec.seeds) if spec.seeds else len(so_far)  # the first look's seeds set the step
    add = min(per_look, cap - len(so_far))
    if add < MIN_SEEDS:
        return Decision(
            stop=True,
            notes=f"{here} was inconclusive with {len(so_far)} seeds per arm, the most this study allows ({cap}).",
        )
    live = [c for c in analysis.get("comparisons", []) if not c.get("stopped")]
    if not live:
        return Decision(stop=True, notes=f"{here} was inconclusive and every treatment arm was stopped early.")
    if adaptive.precision is not None:
        widths = [
            c["diff_ci_high"] - c["diff_ci_low"]
            for c in live
            if c.get("diff_ci_low") is not None and c.get("diff_ci_high") is not None
        ]
        if widths and max(widths) < adaptive.precision:
            return Decision(
                stop=True,
                notes=f"{here} was inconclusive, but every difference's interval is narrower than the precision "
                f"target {adaptive.precision:g} (widest {max(widths):.3g}): any effect is smaller than that.",
            )
    arms_needed = 1 + len(live)
    if trials_left is not None and trials_left < arms_needed * add:
        return Decision(
            stop=True,
            notes=f"{here} was inconclusive; {add} more seeds on {arms_needed} arms need {arms_needed * add} trials, "
            f"{trials_left} are left.",
        )
    start = (max(so_far) + 1) if so_far else 0
    seeds = list(range(start, start + add))
    detail = "; ".join(
        f"{c['arm']}: {_fmt_ci(c)}, adjusted p {c['p_holm']:.3g}"
        if c.get("p_holm") is not None
        else f"{c['arm']}: untested"
        for c in live
    )
    rationale = (
        f"{here} was inconclusive ({detail}; judged at p < {seq['nominal_alpha']:.3g}, look {seq['look']}). "
        f"Budget is left, so this round gives the same arms seeds {seeds[0]}–{seeds[-1]} "
        f"({len(so_far) + add} of at most {cap} per arm): look {seq['look'] + 1}, analysed with the earlier "
        f"seeds under {seq['spending']} alpha spending, so the false-positive rate holds across looks."
    )
    follow = HypothesisSpec(
        statement=spec.statement,
        rationale=rationale,
        knob=spec.knob,
        baseline_value=spec.baseline_value,
        treatment_values=[v for v in spec.treatment_values if arm_name(spec.knob, v) in {c["arm"] for c in live}],
        direction=spec.direction,
        seeds=seeds,
        extends=rnd,
    )
    return Decision(stop=False, follow_ups=[follow], notes=f"{here} was inconclusive: next, {add} more seeds per arm.")
