"""The deterministic planner: reads knobs and values out of the topic, designs ablations.

It needs no model and always gives the same plan for the same topic, which makes
it the default without an LLM and the reference the LLM planner is tested against:

    >>> p = RulesPlanner()
    >>> f = p.frame("Does the learning rate matter for arithmetic? Compare 0 and 3e-4", PlanDefaults())
    >>> (f.task, f.knobs, f.metric)
    ('arith', ['lr'], 'final_reward')

Values named in the topic become arms; the first value named (or the knob's
natural control: lr 0, merging on, KL 0) is the baseline. Without values, a
knob gets default arms (`DEFAULT_ARMS`). One round; no follow-ups.
"""

from __future__ import annotations

import re
from typing import Any

from researcher.experiment import KNOBS, Design, Frame, HypothesisSpec, arm_name, known_tasks
from researcher.planning import Decision, PlanDefaults, choose_direction, default_design

# keyword patterns per knob, most specific first
KNOB_PATTERNS: list[tuple[str, str]] = [
    ("timeline_merge", r"timeline[- ]merg\w*|\bmerg(e|ing)\b"),
    ("kl_coef", r"\bkl\b|kl[- ]?(coef\w*|penalty|divergence)|kullback"),
    ("lr", r"learning[- ]rates?|\blr\b|step[- ]size"),
    ("group_size", r"group[- ]size|group of|\bgroups? \d"),
    ("batch_groups", r"batch[- ](size|groups?)"),
    ("temperature", r"temperature|\btemp\b"),
    ("advantage", r"advantage|\bgrpo\b|\brloo\b|reinforce\+\+|reinforce_pp"),
    ("loss_agg", r"loss[- ]aggregat\w*|seq(uence)?[- ]mean|token[- ]mean|per[- ]sample loss"),
    ("task", r"task[- ]mix|mix(ture)? of tasks|multi[- ]task"),
    ("model", r"\bmodels?\b"),
]

TASK_WORDS = {"arith": r"arith\w*|addition|sums?\b", "guess": r"guess\w*|number game"}

DEFAULT_ARMS: dict[str, list[Any]] = {
    "lr": [0.0, 3e-4],
    "group_size": [4, 8, 16],
    "batch_groups": [2, 4],
    "kl_coef": [0.0, 0.1],
    "temperature": [1.0, 0.7],
    "timeline_merge": [True, False],
    "advantage": ["grpo", "rloo"],
    "task": ["arith", "arith+guess"],
    "loss_agg": ["token-mean", "seq-mean-token-mean"],
    "model": ["embedded"],
}

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
PATH = re.compile(r"(?:^|\s)((?:/|\./|~/)[^\s,;]+)")


def detect_knobs(topic: str) -> list[str]:
    t = topic.lower()
    found = []
    for name, pattern in KNOB_PATTERNS:
        if re.search(pattern, t) and name not in found:
            found.append(name)
    return found


def detect_task(topic: str) -> str:
    """The task named in the topic; several named with a word for mixing: their equal-share mix."""
    t = topic.lower()
    tasks = [name for name, pattern in TASK_WORDS.items() if re.search(pattern, t)]
    available = known_tasks()
    tasks = [x for x in tasks if x in available]
    if len(tasks) > 1 and re.search(r"\bmix\w*|\btogether\b|\bboth\b|\bcombin\w*", t):
        return "+".join(tasks)
    return tasks[0] if tasks else "arith"


def detect_values(topic: str, knob: str) -> list[Any]:
    """Values for `knob` named in the topic, in order of appearance."""
    t = topic.lower()
    if knob == "timeline_merge":
        vals: list[Any] = []
        for m in re.finditer(r"\b(on|off|with|without|enabled|disabled)\b", t):
            v = m.group(1) in ("on", "with", "enabled")
            if v not in vals:
                vals.append(v)
        return vals
    if knob == "advantage":
        return [c for c in ("grpo", "rloo", "reinforce_pp") if c.replace("_pp", "++") in t or c in t]
    if knob == "model":
        return [m.group(1) for m in PATH.finditer(topic)]
    if knob in ("task", "loss_agg"):
        return []  # the arms are DEFAULT_ARMS
    values: list[Any] = []
    for m in NUMBER.finditer(topic):
        try:
            v = KNOBS[knob].validate(m.group(0))
        except ValueError:
            continue
        if v not in values:
            values.append(v)
    return values


def natural_baseline(knob: str, values: list[Any]) -> Any:
    """The control arm: lr/KL 0, merging on, the embedded model; else the first value named."""
    for control in {"lr": [0.0], "kl_coef": [0.0], "timeline_merge": [True], "model": ["embedded"],
                    "advantage": ["grpo"], "task": ["arith"], "loss_agg": ["token-mean"]}.get(knob, []):
        if control in values:
            return control
    return values[0]


class RulesPlanner:
    """Topic → frame → one ablation hypothesis → arms × seeds; stop after one round."""

    name = "rules"
    tokens_used = 0

    def frame(self, topic: str, defaults: PlanDefaults) -> Frame:
        knobs = detect_knobs(topic) or ["lr"]
        t = topic.lower()
        metric = "final_reward"
        if re.search(r"\b(gain|improve\w*|learning progress)\b", t) and "final" not in t:
            metric = "reward_gain"
        elif re.search(r"\b(average|mean) reward\b", t):
            metric = "mean_reward"
        return Frame(question=topic.strip(), task=detect_task(topic), metric=metric,
                     metric_window=defaults.metric_window, knobs=knobs[:1])

    def hypothesize(self, topic: str, frame: Frame, history: list[dict]) -> HypothesisSpec | None:
        if history:  # one round: the rules planner has nothing further to ask
            return None
        knob = frame.knobs[0]
        values = detect_values(topic, knob)
        if knob == "model":
            values = ["embedded", *[v for v in values if v != "embedded"]]
        if len(values) < 2:
            values = [*values, *[v for v in DEFAULT_ARMS[knob] if v not in values]]
        if len(values) < 2:
            raise ValueError(f"name at least two values of {knob} to compare in the topic")
        base = natural_baseline(knob, values)
        treatments = [v for v in values if v != base]
        direction = choose_direction(knob, base, treatments)
        verb = {"greater": "a higher", "less": "a lower", "two-sided": "a different"}[direction]
        tv = ", ".join(arm_name(knob, v) for v in treatments)
        statement = (f"{tv} gives {verb} {frame.metric.replace('_', ' ')} than {arm_name(knob, base)} "
                     f"on {frame.task}")
        rationale = (f"Ablation of {knob} named in the question; {arm_name(knob, base)} is the control.")
        return HypothesisSpec(statement=statement, rationale=rationale, knob=knob, baseline_value=base,
                              treatment_values=treatments, direction=direction)

    def design(self, frame: Frame, hypothesis: HypothesisSpec, defaults: PlanDefaults) -> Design:
        return default_design(frame, hypothesis, defaults)

    def decide(self, frame: Frame, hypothesis: HypothesisSpec, analysis: dict, history: list[dict],
               can_continue: bool) -> Decision:
        return Decision(stop=True, follow_ups=[], notes="The rules planner tests one ablation per study.")
