"""The LLM planner: every planning step is a prompt file and a structured, validated answer.

    planner = LLMPlanner(make_chat_model(), token_budget=200_000)
    frame = planner.frame("Does KL regularisation help on guess?", PlanDefaults())

Each step asks for one JSON object through LangChain's structured output
(`researcher.llm.structured`). The JSON schema sent to the server is *tighter* than
the pydantic model's own: it is built from what the step already knows (knob names
and value ranges, the known tasks, the frame's knobs, the hypothesis' baseline
value, the user's seeds and steps), so a server with structured outputs (vLLM's
guided JSON, OpenAI's json_schema) rules out most answers validation would refuse.
What a schema cannot say (distinct values, the program's flags) is still checked,
and an invalid answer goes back with the error (`retries` times); after the last
one `StructuredOutputError` says what was wrong. Tokens are counted from every
response's usage and the budget is checked before every call; an unreachable
endpoint is waited out with backoff (`policy`), then `LLMUnreachable` (llm.py).
Nothing is asked that the trial budget could not run: with fewer trials left
(`trials_left`, set by the study graph) than the smallest design, `decide` is
asked with no room for follow-ups and `design` refuses before asking.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from researcher import prompts
from researcher.experiment import (
    KNOBS,
    MIN_SEEDS,
    STEPS_RANGE,
    Design,
    Frame,
    HypothesisSpec,
    Knob,
    arm_name,
    known_tasks,
    swarm_train_flags,
)
from researcher.llm import BudgetExceeded, CallPolicy, structured
from researcher.planning import BudgetTooSmall, Decision, PlanDefaults

PROMPTS = ("system", "frame", "hypothesize", "design", "decide", "retry")
# lengths as patterns too: vLLM's guided decoding honours `pattern` where it skips minLength/maxLength
TEXT = {"type": "string", "minLength": 3, "maxLength": 200, "pattern": "^[A-Za-z0-9][^\\n]{2,199}$"}
NOTE = {"type": "string", "maxLength": 300, "pattern": "^[^\\n]{0,300}$"}
SMALLEST_DESIGN = 2 * MIN_SEEDS  # trials: what fitting any design to a trial budget can shrink it to


# ---------------------------------------------------------------- answer schemas


def plannable_knobs() -> list[str]:
    """Knobs an LLM may choose: all but free-form strings (a model path cannot be guessed)."""
    return [k.name for k in KNOBS.values() if k.kind != "str" or k.name == "task"]


def value_schema(knob: Knob) -> dict:
    """JSON schema of one knob's values: its type, range or choices."""
    if knob.kind == "bool":
        return {"type": "boolean"}
    if knob.kind == "choice":
        return {"type": "string", "enum": list(knob.choices)}
    if knob.kind == "str":
        return (
            {"type": "string", "enum": known_tasks()}
            if knob.name == "task"
            else {"type": "string", "minLength": 1, "maxLength": 200}
        )
    out: dict[str, Any] = {"type": "integer" if knob.kind == "int" else "number"}
    if knob.low is not None:
        out["minimum"] = knob.low
    if knob.high is not None:
        out["maximum"] = knob.high
    return out


def _settings(names: list[str]) -> dict:
    return {"type": "object", "properties": {n: value_schema(KNOBS[n]) for n in names}, "additionalProperties": False}


def _object(title: str, properties: dict, description: str = "") -> dict:
    return {
        "title": title,
        "description": description or title,
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def frame_schema(knobs: list[str]) -> dict:
    return _object(
        "Frame",
        {
            "question": TEXT,
            "task": {"type": "string", "enum": known_tasks()},
            "metric": {"type": "string", "enum": ["final_reward", "reward_gain", "mean_reward"]},
            "metric_window": {"type": "integer", "minimum": 1, "maximum": 100},
            "knobs": {"type": "array", "items": {"type": "string", "enum": knobs}, "minItems": 1, "maxItems": 3},
            "baseline": _settings(knobs),
        },
        "What the study asks and how it is measured.",
    )


def _one_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def other_values(knob: Knob, baseline: Any) -> dict:
    """JSON schema of the knob's values other than `baseline` (a treatment must differ from it)."""
    value = value_schema(knob)
    if knob.kind == "bool":
        return {"type": "boolean", "enum": [not baseline]}
    if "enum" in value:
        return {**value, "enum": [v for v in value["enum"] if v != baseline]}
    if knob.kind in ("int", "float"):
        below = {k: v for k, v in value.items() if k != "maximum"} | {"exclusiveMaximum": baseline}
        above = {k: v for k, v in value.items() if k != "minimum"} | {"exclusiveMinimum": baseline}
        return _one_of(
            [
                s
                for s, ok in (
                    (below, knob.low is None or baseline > knob.low),
                    (above, knob.high is None or baseline < knob.high),
                )
                if ok
            ]
        )
    return value


def hypothesis_schema(knobs: list[str], baseline: dict[str, Any] | None = None) -> dict:
    """The knob is one of the study's; values have that knob's type and range (exactly so
    for one knob; for several, any of theirs: validation catches a value of another knob).
    With one knob, the baseline is the frame's value for it (else the knob's default, what
    a run without the change uses) and every treatment differs from it."""
    value = _one_of([value_schema(KNOBS[k]) for k in knobs])
    base, treat = value, value
    fixed = (baseline or {}).get(knobs[0], KNOBS[knobs[0]].default) if len(knobs) == 1 else None
    if fixed is not None:
        b = KNOBS[knobs[0]].validate(fixed)
        base, treat = {"enum": [b]}, other_values(KNOBS[knobs[0]], b)
    return _object(
        "HypothesisSpec",
        {
            "statement": TEXT,
            "rationale": NOTE,
            "knob": {"type": "string", "enum": knobs},
            "baseline_value": base,
            "treatment_values": {"type": "array", "items": treat, "minItems": 1, "maxItems": 3},
            "direction": {"type": "string", "enum": ["greater", "less", "two-sided"]},
        },
        "A falsifiable claim: the treatment values beat, trail or differ from the baseline value.",
    )


def design_schema(task: str, hypothesis: HypothesisSpec, defaults: PlanDefaults, common: list[str]) -> dict:
    """The baseline arm is fixed by the hypothesis; the model names and sets the treatments."""
    knob = hypothesis.knob
    base_name = arm_name(knob, hypothesis.baseline_value)
    base_arm = _object(
        "BaselineArm",
        {
            "name": {"type": "string", "enum": [base_name]},
            "knobs": _object("BaselineKnobs", {knob: {"enum": [hypothesis.baseline_value]}}),
        },
    )
    arm = _object(
        "Arm",
        {
            "name": {"type": "string", "minLength": 1, "maxLength": 40, "pattern": "^[A-Za-z0-9=._-]{1,40}$"},
            "knobs": _object("ArmKnobs", {knob: other_values(KNOBS[knob], hypothesis.baseline_value)}),
        },
    )
    n = max(defaults.seeds, MIN_SEEDS)
    return _object(
        "Design",
        {
            "task": {"type": "string", "enum": [task]},
            "steps": {"type": "integer", "minimum": STEPS_RANGE[0], "maximum": STEPS_RANGE[1]},
            # seeds 0..n-1: which integers carry no meaning, and guided decoding cannot say "distinct"
            "seeds": {
                "type": "array",
                "prefixItems": [{"type": "integer", "enum": [i]} for i in range(n)],
                "items": {"type": "integer", "minimum": 0, "maximum": 999},
                "minItems": n,
                "maxItems": n,
            },
            "baseline": {"type": "string", "enum": [base_name]},
            "arms": {
                "type": "array",
                "prefixItems": [base_arm],
                "items": arm,
                "minItems": 2,
                "maxItems": defaults.max_arms,
            },
            "common": _settings([k for k in common if k != knob]),
        },
        "Arms x seeds for one hypothesis.",
    )


def decision_schema(knobs: list[str], baseline: dict[str, Any] | None = None, max_follow_ups: int = 2) -> dict:
    """`max_follow_ups` 0 when no trials are left for another round: follow-ups nobody could run
    are the longest part of an answer (the model writes them out in full)."""
    return _object(
        "Decision",
        {
            "stop": {"type": "boolean"},
            "notes": NOTE,
            "follow_ups": {"type": "array", "items": hypothesis_schema(knobs, baseline), "maxItems": max_follow_ups},
        },
        "After a round: stop, or follow-up hypotheses to test next.",
    )


# ---------------------------------------------------------------- the planner


class LLMPlanner:
    name = "llm"

    def __init__(
        self,
        model: BaseChatModel,
        token_budget: int | None = None,
        retries: int = 2,
        max_rounds: int = 3,
        check_program: bool = True,
        knobs: list[str] | None = None,
        policy: CallPolicy | None = None,
    ) -> None:
        self.model = model
        self.token_budget = token_budget
        self.tokens_used = 0
        self.retries = retries
        self.max_rounds = max_rounds
        self.check_program = check_program
        self.knobs = knobs or plannable_knobs()
        unknown = [k for k in self.knobs if k not in KNOBS]
        if unknown:
            raise ValueError(f"unknown knob(s) {unknown}; known knobs: {', '.join(KNOBS)}")
        self.policy = policy or CallPolicy()
        self.trials_left: int | None = None  # set by the study graph before each step (None: no trial budget)

    @staticmethod
    def prompt_versions() -> dict[str, int]:
        return {name: prompts.load(name)[1] for name in PROMPTS}

    # ------------------------------------------------------------ plumbing
    def _charge(self, n: int) -> None:
        self.tokens_used += n

    def _ask(self, prompt: str, schema: type, json_schema: dict, check: Any = None) -> Any:
        if self.token_budget is not None and self.tokens_used >= self.token_budget:
            raise BudgetExceeded(f"LLM token budget spent ({self.tokens_used} of {self.token_budget})")
        system = prompts.render(
            "system",
            knobs="\n".join(f"- {KNOBS[k].name} ({KNOBS[k].kind}): {KNOBS[k].help}" for k in self.knobs),
            tasks=", ".join(known_tasks()),
        )
        messages: list[BaseMessage] = [SystemMessage(content=system), HumanMessage(content=prompt)]
        return structured(
            self.model,
            messages,
            schema,
            json_schema=json_schema,
            check=check,
            retries=self.retries,
            retry_prompt=lambda err: prompts.render("retry", error=err),
            on_tokens=self._charge,
            policy=self.policy,
        )

    def _room_for_a_round(self) -> bool:
        """Whether the trials left (as the study graph last said) could run the smallest design."""
        return self.trials_left is None or self.trials_left >= SMALLEST_DESIGN

    def _study_knobs(self, frame: Frame) -> list[str]:
        """The frame's knobs the planner may vary (all it may vary if none of them)."""
        return [k for k in frame.knobs if k in self.knobs] or self.knobs

    # ------------------------------------------------------------ steps
    def frame(self, topic: str, defaults: PlanDefaults) -> Frame:
        def check(f: Frame) -> None:
            if not f.knobs:
                raise ValueError("name at least one knob under study in 'knobs'")

        js = frame_schema(self.knobs)
        frame: Frame = self._ask(prompts.render("frame", topic=topic, schema=json.dumps(js)), Frame, js, check)
        # the metric window follows the user's trial length, like the design's steps
        return frame.model_copy(update={"metric_window": defaults.window()})

    def hypothesize(self, topic: str, frame: Frame, history: list[dict]) -> HypothesisSpec | None:
        if len(history) >= self.max_rounds:
            return None
        knobs = self._study_knobs(frame)  # one knob a round, in the frame's order: exact value schemas
        js = hypothesis_schema([knobs[len(history) % len(knobs)]], frame.baseline)
        text = prompts.render(
            "hypothesize",
            question=frame.question,
            task=frame.task,
            metric=frame.metric_description(),
            topic=topic,
            history=_history(history),
            max_treatments=3,
            schema=json.dumps(js),
        )
        return self._ask(text, HypothesisSpec, js)

    def design(self, frame: Frame, hypothesis: HypothesisSpec, defaults: PlanDefaults) -> Design:
        if not self._room_for_a_round():  # ask for no design that cannot run
            raise BudgetTooSmall(
                f"a trial budget of {self.trials_left} cannot cover even the smallest design "
                f"(2 arms × {MIN_SEEDS} seeds = {SMALLEST_DESIGN} trials)"
            )
        flags = swarm_train_flags() if self.check_program else None

        def check(d: Design) -> None:
            if len(d.seeds) < defaults.seeds:
                raise ValueError(f"use at least {defaults.seeds} seeds per arm")
            if len(d.arms) > defaults.max_arms:
                raise ValueError(f"use at most {defaults.max_arms} arms")
            base = next(a for a in d.arms if a.name == d.baseline)
            got = {**d.common, **base.knobs}.get(hypothesis.knob)
            if got is not None and got != hypothesis.baseline_value:
                raise ValueError(f"the baseline arm must set {hypothesis.knob}={hypothesis.baseline_value!r}")
            d.check_program(flags)

        js = design_schema(frame.task, hypothesis, defaults, list(frame.baseline))
        text = prompts.render(
            "design",
            question=frame.question,
            statement=hypothesis.statement,
            knob=hypothesis.knob,
            baseline_value=hypothesis.baseline_value,
            treatment_values=hypothesis.treatment_values,
            task=frame.task,
            seeds=defaults.seeds,
            steps=defaults.steps,
            max_arms=defaults.max_arms,
            schema=json.dumps(js),
        )
        design: Design = self._ask(text, Design, js, check)
        return design.model_copy(update={"steps": defaults.steps})  # the user's trial length wins

    def decide(
        self, frame: Frame, hypothesis: HypothesisSpec, analysis: dict, history: list[dict], can_continue: bool
    ) -> Decision:
        if not can_continue:
            return Decision(stop=True, notes="Budget or round limit reached.")
        arms = "\n".join(
            f"- {name}: {a['mean']} [{a['ci_low']}, {a['ci_high']}] (n={a['n']})"
            for name, a in analysis.get("arms", {}).items()
        )
        comps = "\n".join(
            f"- {c['arm']} vs {c['baseline']}: diff {c['diff']} "
            f"[{c['diff_ci_low']}, {c['diff_ci_high']}], Hedges' g {c['hedges_g']}, "
            f"{'paired t' if c.get('method') == 'paired' else 'Welch'} p {c['p']}"
            for c in analysis.get("comparisons", [])
        )
        room = self._room_for_a_round()
        js = decision_schema(self._study_knobs(frame), frame.baseline, 2 if room else 0)
        budget_note = f"Rounds left: {self.max_rounds - len(history) - 1}."
        if not room:
            budget_note += (
                f" Trials left: {self.trials_left}, fewer than the smallest design ({SMALLEST_DESIGN}): "
                "no follow-up can run."
            )
        text = prompts.render(
            "decide",
            question=frame.question,
            statement=hypothesis.statement,
            verdict=analysis.get("verdict"),
            metric=frame.metric_description(),
            arms=arms or "(no completed trials)",
            comparisons=comps or "(none)",
            history=_history(history),
            budget_note=budget_note,
            schema=json.dumps(js),
        )
        return self._ask(text, Decision, js)


def _history(history: list[dict]) -> str:
    if not history:
        return "(none yet)"
    return "\n".join(f"- {h.get('statement')}: {h.get('verdict')}" for h in history)
