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

A topic it cannot express (no knob named, or something outside its knobs such as
an optimizer or an architecture) raises `UnsupportedTopic` listing what it can
study, instead of quietly studying the learning rate.
"""

from __future__ import annotations

import re
from typing import Any

from researcher.experiment import KNOBS, Design, Frame, HypothesisSpec, arm_name, known_tasks
from researcher.planning import Decision, PlanDefaults, UnsupportedTopic, choose_direction, default_design, knob_list
from swarm.algorithms.choices import Advantage, LossAgg

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

# things people ask about that no knob expresses: refused by name, never mapped onto a knob
OUT_OF_SCOPE: list[tuple[str, str]] = [
    ("the optimizer", r"\boptimi[sz]er\w*|\badam\w*|\bsgd\b|\bmomentum\b|\brmsprop\b|\blion\b"),
    ("a learning-rate schedule", r"\bschedul\w*|warm[- ]?up|cosine|(?<!weight.)\bdecay\b"),
    ("the architecture", r"architecture|\blayers?\b|\bheads?\b|hidden size|\bwidth\b|\bdepth\b|dropout"),
    ("precision or adapters", r"\bbf16\b|\bfp16\b|precision|\blora\b|quantiz\w*"),
    ("the dataset", r"\bdataset\w*|training data"),
]

TASK_WORDS = {"arith": r"arith\w*|addition|sums?\b", "guess": r"guess\w*|number game"}

DEFAULT_ARMS: dict[str, list[Any]] = {
    "lr": [0.0, 3e-4],
    "group_size": [4, 8, 16],
    "batch_groups": [2, 4],
    "kl_coef": [0.0, 0.1],
    "temperature": [1.0, 0.7],
    "timeline_merge": [True, False],
    "advantage": [Advantage.grpo.value, Advantage.rloo.value],
    "task": ["arith", "arith+guess"],
    "loss_agg": [LossAgg.token_mean.value, LossAgg.seq_mean_token_mean.value],
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
        return [c.value for c in Advantage if c.value.replace("_pp", "++") in t or c.value in t]
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


def studied_knobs() -> list[str]:
    """The knobs this planner recognises in words (an LLM planner can use every knob)."""
    return [name for name, _ in KNOB_PATTERNS if name in KNOBS]


def check_scope(topic: str) -> list[str]:
    """The knobs the topic names; UnsupportedTopic when none, or when it asks about something else."""
    t = topic.lower()
    can = f"It can vary:\n{knob_list(studied_knobs())}"
    for what, pattern in OUT_OF_SCOPE:
        m = re.search(pattern, t)
        if m:
            raise UnsupportedTopic(f"the rules planner cannot study {what} (the topic says {m.group(0)!r}). {can}")
    knobs = [k for k in detect_knobs(topic) if k in KNOBS]
    if not knobs:
        raise UnsupportedTopic(f"the rules planner found no knob it can vary in the topic. {can}")
    return knobs


def natural_baseline(knob: str, values: list[Any]) -> Any:
    """The control arm: lr/KL 0, merging on, the embedded model; else the first value named."""
    for control in {
        "lr": [0.0],
        "kl_coef": [0.0],
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
    """Topic → frame → one ablation hypothesis → arms × seeds; stop after one round."""

    name = "rules"
    tokens_used = 0

    def frame(self, topic: str, defaults: PlanDefaults) -> Frame:
        knobs = check_scope(topic)
        t = topic.lower()
        metric = "final_reward"
        if re.search(r"\b(gain|improve\w*|learning progress)\b", t) and "final" not in t:
            metric = "reward_gain"
        elif re.search(r"\b(average|mean) reward\b", t):
            metric = "mean_reward"
        return Frame(
            question=topic.strip(),
            task=detect_task(topic),
            metric=metric,
            metric_window=defaults.window(),
            knobs=knobs[:1],
        )

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
            hint = " (model directories, e.g. /models/a)" if knob == "model" else ""
            raise UnsupportedTopic(f"name at least two values of {knob} to compare in the topic{hint}")
        base = natural_baseline(knob, values)
        treatments = [v for v in values if v != base]
        direction = choose_direction(knob, base, treatments)
        verb = {"greater": "a higher", "less": "a lower", "two-sided": "a different"}[direction]
        tv = ", ".join(arm_name(knob, v) for v in treatments)
        statement = f"{tv} gives {verb} {frame.metric.replace('_', ' ')} than {arm_name(knob, base)} on {frame.task}"
        rationale = f"Ablation of {knob} named in the question; {arm_name(knob, base)} is the control."
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
        return Decision(stop=True, follow_ups=[], notes="The rules planner tests one ablation per study.")
