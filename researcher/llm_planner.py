"""The LLM planner: every planning step is a prompt file and a pydantic-validated JSON answer.

    planner = LLMPlanner(make_chat_model(), token_budget=200_000)
    frame = planner.frame("Does KL regularisation help on guess?", PlanDefaults())

An invalid answer (bad JSON, unknown knob, out-of-range value, fewer than 3 seeds,
a knob the trial program cannot express) is sent back with the error and asked
again (`retries` times). Token use is counted per call (`tokens_used`) and the
budget is checked before every call. After the last retry `StructuredOutputError`
says what was wrong; an unreachable endpoint raises `LLMUnreachable` (llm.py).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from researcher import prompts
from researcher.experiment import KNOBS, Design, Frame, HypothesisSpec, known_tasks, swarm_train_flags
from researcher.llm import BudgetExceeded, structured
from researcher.planning import Decision, PlanDefaults

PROMPTS = ("system", "frame", "hypothesize", "design", "decide", "retry")


def _schema(model: type) -> str:
    return json.dumps(model.model_json_schema(), indent=1)


class LLMPlanner:
    name = "llm"

    def __init__(self, model: BaseChatModel, token_budget: int | None = None, retries: int = 2,
                 max_rounds: int = 3, check_program: bool = True) -> None:
        self.model = model
        self.token_budget = token_budget
        self.tokens_used = 0
        self.retries = retries
        self.max_rounds = max_rounds
        self.check_program = check_program

    @staticmethod
    def prompt_versions() -> dict[str, int]:
        return {name: prompts.load(name)[1] for name in PROMPTS}

    # ------------------------------------------------------------ plumbing
    def _charge(self, n: int) -> None:
        self.tokens_used += n

    def _ask(self, prompt: str, schema: type, check: Any = None) -> Any:
        if self.token_budget is not None and self.tokens_used >= self.token_budget:
            raise BudgetExceeded(f"LLM token budget spent ({self.tokens_used} of {self.token_budget})")
        system = prompts.render("system", knobs="\n".join(f"- {k.name} ({k.kind}): {k.help}"
                                                          for k in KNOBS.values()),
                                tasks=", ".join(known_tasks()))
        messages: list[BaseMessage] = [SystemMessage(content=system), HumanMessage(content=prompt)]
        return structured(self.model, messages, schema, check=check, retries=self.retries,
                          retry_prompt=lambda err: prompts.render("retry", error=err),
                          on_tokens=self._charge)

    # ------------------------------------------------------------ steps
    def frame(self, topic: str, defaults: PlanDefaults) -> Frame:
        def check(f: Frame) -> None:
            if not f.knobs:
                raise ValueError("name at least one knob under study in 'knobs'")

        frame: Frame = self._ask(prompts.render("frame", topic=topic, schema=_schema(Frame)), Frame, check)
        # the metric window follows the user's trial length, like the design's steps
        return frame.model_copy(update={"metric_window": defaults.window()})

    def hypothesize(self, topic: str, frame: Frame, history: list[dict]) -> HypothesisSpec | None:
        if len(history) >= self.max_rounds:
            return None
        text = prompts.render("hypothesize", question=frame.question, task=frame.task,
                              metric=frame.metric_description(), topic=topic,
                              history=_history(history), max_treatments=3,
                              schema=_schema(HypothesisSpec))
        return self._ask(text, HypothesisSpec)

    def design(self, frame: Frame, hypothesis: HypothesisSpec, defaults: PlanDefaults) -> Design:
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

        text = prompts.render("design", question=frame.question, statement=hypothesis.statement,
                              knob=hypothesis.knob, baseline_value=hypothesis.baseline_value,
                              treatment_values=hypothesis.treatment_values, task=frame.task,
                              seeds=defaults.seeds, steps=defaults.steps, max_arms=defaults.max_arms,
                              schema=_schema(Design))
        design: Design = self._ask(text, Design, check)
        return design.model_copy(update={"steps": defaults.steps})  # the user's trial length wins

    def decide(self, frame: Frame, hypothesis: HypothesisSpec, analysis: dict, history: list[dict],
               can_continue: bool) -> Decision:
        if not can_continue:
            return Decision(stop=True, notes="Budget or round limit reached.")
        arms = "\n".join(f"- {name}: {a['mean']} [{a['ci_low']}, {a['ci_high']}] (n={a['n']})"
                         for name, a in analysis.get("arms", {}).items())
        comps = "\n".join(f"- {c['arm']} vs {c['baseline']}: diff {c['diff']} "
                          f"[{c['diff_ci_low']}, {c['diff_ci_high']}], Hedges' g {c['hedges_g']}, "
                          f"Welch p {c['p']}" for c in analysis.get("comparisons", []))
        text = prompts.render("decide", question=frame.question, statement=hypothesis.statement,
                              verdict=analysis.get("verdict"), metric=frame.metric_description(),
                              arms=arms or "(no completed trials)", comparisons=comps or "(none)",
                              history=_history(history),
                              budget_note=f"Rounds left: {self.max_rounds - len(history) - 1}.",
                              schema=_schema(Decision))
        return self._ask(text, Decision)


def _history(history: list[dict]) -> str:
    if not history:
        return "(none yet)"
    return "\n".join(f"- {h.get('statement')}: {h.get('verdict')}" for h in history)
