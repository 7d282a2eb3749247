"""Reading a research question in words: the knobs it names, their values, the counts it gives
("over 100 steps", "5 seeds") and the knobs it holds at one value. The rules planner's parser
(researcher/rules.py), pure: a topic in, names and values out.

    >>> detect_values("Does a group size of 16 beat 4 at lr 1e-4 over 40 steps?", "group_size")
    [16, 4]
    >>> topic_counts("Does lr 3e-4 beat 0 over 100 steps with 5 seeds?")
    {'steps': 100, 'seeds': 5}
"""

from __future__ import annotations

import re
from typing import Any

from researcher.experiment import KNOBS, OutOfRange, known_tasks
from researcher.planning import UnsupportedTopic, knob_list
from swarm.algorithms.choices import Advantage

# keyword patterns per knob, most specific first
KNOB_PATTERNS: list[tuple[str, str]] = [
    ("timeline_merge", r"timeline[- ]merg\w*|\bmerg(e|ing)\b"),
    ("kl_coef", r"\bkl\b|kl[- ]?(coef\w*|penalty|divergence)|kullback"),
    ("lora_rank", r"\blora\b|adapter[- ]rank|rank of the adapter|full[- ]fine[- ]?tun\w*|full[- ]parameter"),
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
    ("numeric precision", r"\bbf16\b|\bfp16\b|precision|quantiz\w*"),
    ("the dataset", r"\bdataset\w*|training data"),
]

TASK_WORDS = {"arith": r"arith\w*|addition|sums?\b", "guess": r"guess\w*|number game"}

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
# a number that counts something of the study ("over 100 steps", "3 seeds", "12 trials", "20%"): never a knob's value
COUNT = re.compile(
    r"(?<![\w.])(\d+)\s*(?:(?:training|optimi[sz]ation|rl|random|more|different)\s+)?"
    r"(steps?|seeds?|trials?|runs?|rounds?|minutes?|mins?|hours?|days?|%|percent)(?![a-z])",
    re.IGNORECASE,
)
PATH = re.compile(r"(?:^|\s)((?:/|\./|~/)[^\s,;]+)")


def knob_mentions(topic: str) -> list[tuple[int, str]]:
    """Where the topic names each knob: (position, knob), in the topic's order."""
    t = topic.lower()
    found = []
    for name, pattern in KNOB_PATTERNS:
        patterns = [pattern, rf"(?<![a-z0-9_]){name}(?![a-z0-9_])"] if "_" in name else [pattern]
        found += [(m.start(), name) for p in patterns for m in re.finditer(p, t)]
    return sorted(found)


def knob_numbers(topic: str, knob: str) -> list[str]:
    """The numbers of a topic that may be `knob`'s values: not the counts (`COUNT`), and where the topic
    names several knobs, those nearest after a mention of this one (or, before any mention, of the
    first named): in "a group size of 16 against 4 at lr 1e-4", 16 and 4 are group sizes, 1e-4 a rate."""
    return [m.group(0) for m in _knob_number_matches(topic, knob)]


def _knob_number_matches(topic: str, knob: str) -> list[re.Match[str]]:
    counted = [m.span() for m in COUNT.finditer(topic)]
    numbers = [m for m in NUMBER.finditer(topic) if not any(a <= m.start() < b for a, b in counted)]
    mentions = [(at, name) for at, name in knob_mentions(topic) if name in KNOBS]
    if len({name for _, name in mentions}) < 2:
        return numbers
    owners = [next((name for at, name in reversed(mentions) if at < m.start()), mentions[0][1]) for m in numbers]
    return [m for m, owner in zip(numbers, owners, strict=True) if owner == knob]


#: "A beats B", "is A better than B", "A outperforms B": B is what A is measured against, and the question
#: has a side (higher reward: every metric of a study is a reward); "A is worse than B" the other side
BEATS = re.compile(r"\b(?:beats?|outperforms?|better than|superior to|improves? (?:on|over|upon))\b")
WORSE = re.compile(r"\b(?:worse than|inferior to|underperforms?)\b")


def _names(estimator: Advantage) -> set[str]:
    """How a topic may write an advantage estimator: `reinforce_pp` is REINFORCE++ in words."""
    return {estimator.value, estimator.value.replace("_pp", "++")}


def _value_positions(topic: str, knob: str) -> list[tuple[int, Any]]:
    """Where the topic names each value of `knob`: an estimator by its name, a number by the rules above."""
    t = topic.lower()
    if knob == "advantage":
        return [(m.start(), c.value) for c in Advantage for name in _names(c) for m in re.finditer(re.escape(name), t)]
    found = []
    for m in _knob_number_matches(topic, knob):
        try:
            found.append((m.start(), KNOBS[knob].validate(m.group(0))))
        except ValueError:
            continue
    return found


def compared_against(topic: str, knob: str, values: list[Any]) -> tuple[Any, str] | None:
    """(the value of `values` the topic measures the others against, the expected direction of the others
    minus it) when the topic says so between two values of `knob`, else None.

    >>> compared_against("Does a learning rate of 1e-3 beat 3e-4 on arith?", "lr", [1e-3, 3e-4])
    (0.0003, 'greater')
    >>> compared_against("Is a group size of 4 worse than 16?", "group_size", [4, 16])
    (16, 'less')
    >>> compared_against("Does RLOO beat GRPO with a group size of 8?", "advantage", ["grpo", "rloo"])
    ('grpo', 'greater')
    >>> compared_against("Compare lr 0 and 3e-4", "lr", [0.0, 3e-4]) is None
    True
    """
    t = topic.lower()
    beats = BEATS.search(t)
    verb = beats or WORSE.search(t)
    if verb is None or knob not in KNOBS:
        return None
    before, after = [], []
    for at, value in sorted(_value_positions(topic, knob)):
        if value in values:
            (before if at < verb.start() else after).append(value)
    if not before or not after or after[0] in before:
        return None
    return after[0], "greater" if beats else "less"


def topic_counts(topic: str) -> dict[str, int]:
    """The trial length and seeds per arm the topic names ("over 100 steps", "with 5 seeds").

    A study runs what its question says unless the command line says otherwise; two different
    counts of one thing ("40 steps ... 100 steps") are an UnsupportedTopic, not a guess.
    """
    out: dict[str, int] = {}
    for m in COUNT.finditer(topic):
        unit = m.group(2).lower()
        key = {"step": "steps", "steps": "steps", "seed": "seeds", "seeds": "seeds"}.get(unit)
        if key is None:
            continue
        n = int(m.group(1))
        if out.get(key, n) != n:
            raise UnsupportedTopic(f"the topic names {out[key]} and {n} {key}; name one number of {key}")
        out[key] = n
    return out


def detect_knobs(topic: str) -> list[str]:
    """The knobs a topic names, in words or by the names the refusal lists (`group_size`, `kl_coef`:
    the patterns' `[- ]` and word boundaries do not match an underscore; the other names, `lr` or
    `temperature`, are words the patterns have, and `task` alone is too common a word to mean the knob)."""
    t = topic.lower()
    found = []
    for name, pattern in KNOB_PATTERNS:
        by_name = "_" in name and re.search(rf"(?<![a-z0-9_]){name}(?![a-z0-9_])", t)
        if (by_name or re.search(pattern, t)) and name not in found:
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
        for m in re.finditer(r"\b(on|off|with|without|enabled|disabled|true|false)\b", t):
            v = m.group(1) in ("on", "with", "enabled", "true")
            if v not in vals:
                vals.append(v)
        return vals
    if knob == "advantage":
        return [c.value for c in Advantage if any(name in t for name in _names(c))]
    if knob == "model":
        return [m.group(1) for m in PATH.finditer(topic)]
    if knob in ("task", "loss_agg"):
        return []  # the arms are DEFAULT_ARMS
    values: list[Any] = []
    for _, v in _value_positions(topic, knob):
        if v not in values:
            values.append(v)
    return values


def out_of_range(topic: str, knob: str) -> list[str]:
    """The numbers in the topic that are `knob`'s type but outside its study range (`detect_values` drops them)."""
    if KNOBS[knob].kind not in ("float", "int"):
        return []
    found = []
    for number in knob_numbers(topic, knob):
        try:
            KNOBS[knob].validate(number)
        except OutOfRange:
            if number not in found:
                found.append(number)
        except ValueError:
            pass  # not the knob's type (an integer knob's 1.5): not a value it could take at all
    return found


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
    tasks = [name for name, pattern in TASK_WORDS.items() if re.search(pattern, t)]
    if not knobs and len(tasks) > 1:  # "Does arith learn faster than guess?" read as no knob at all
        raise UnsupportedTopic(
            f"the topic names the tasks {' and '.join(tasks)}: the rules planner's task knob compares one task "
            f'against a task mix ("Does a task mix of {"+".join(tasks)} beat {tasks[0]} alone?"), not tasks '
            f"against each other (their rewards are on different scales). {can}"
        )
    if not knobs:
        raise UnsupportedTopic(f"the rules planner found no knob it can vary in the topic. {can}")
    return knobs


# "with a group size of 8", "at lr 1e-4", "using GRPO": the words that make a knob a setting, not the question
SETTING_WORDS = re.compile(r"\b(?:with|at|using|under|given)\s+(?:(?:a|an|the)\s+)?$")


def studied_and_fixed(topic: str, knobs: list[str]) -> tuple[str, dict[str, Any]]:
    """The knob the topic compares, and the knobs it holds at one value in every arm.

    The compared knob is the first named with two values or more; without one, the first named that
    is not introduced as a setting ("with a group size of 8", "at lr 1e-4"), else the first named. Another
    knob named with one value is a setting every arm shares, where that value is unambiguous (a number
    near its mention, an advantage estimator's name, a model path): "Does RLOO beat GRPO with a group
    size of 8?" compares advantage estimators, each with groups of 8.
    """
    mentions = [(at, name) for at, name in knob_mentions(topic) if name in knobs]
    order = sorted(knobs, key=lambda k: next((at for at, name in mentions if name == k), len(topic)))
    values = {k: detect_values(topic, k) for k in order}
    t = topic.lower()
    setting = {name for at, name in mentions if SETTING_WORDS.search(t[:at])}
    studied = next((k for k in order if len(values[k]) >= 2), next((k for k in order if k not in setting), order[0]))
    _refuse_a_second_comparison(studied, values)
    _refuse_one_value_twice(topic, studied, values[studied])
    fixed = {
        k: v[0]
        for k, v in values.items()
        if k != studied and len(v) == 1 and (KNOBS[k].kind in ("float", "int") or k in ("advantage", "model"))
    }
    return studied, fixed


def _refuse_a_second_comparison(studied: str, values: dict[str, list[Any]]) -> None:
    """A second knob named with several values was dropped without a word ("Compare lr 0 and 3e-4 and group
    size 4 and 16" planned lr alone). A study varies one knob; the user says which, or fixes the other.
    (Only the knobs whose values are read unambiguously: `timeline_merge` reads "on" and "without" anywhere.)"""
    other = [
        k
        for k, v in values.items()
        if k != studied and len(v) >= 2 and (KNOBS[k].kind in ("float", "int") or k == "advantage")
    ]
    if other:
        named = "; ".join(f"{k}: {', '.join(map(str, values[k]))}" for k in (studied, *other))
        raise UnsupportedTopic(
            f"the topic compares more than one knob ({named}); a study varies one: ask about one, and hold "
            f'the others at one value ("with a group size of 4"), or run a study per knob'
        )


def _refuse_one_value_twice(topic: str, knob: str, values: list[Any]) -> None:
    """ "Compare lr 3e-4 and 3e-4" became lr 0 against 3e-4 (one value named: its natural baseline) in silence."""
    named = [v for _, v in _value_positions(topic, knob)] if knob in KNOBS else []
    if len(values) == 1 and len(named) > 1:
        raise UnsupportedTopic(
            f"the topic names {knob} {values[0]} {len(named)} times and no other value: nothing to compare; "
            f"name two values, or one to test against the planner's baseline"
        )
