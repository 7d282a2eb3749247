"""The planner interface both planners implement, and the small types they share.

A planner turns a topic into a `Frame`, proposes `HypothesisSpec`s, designs each
as a `Design` (arms × seeds), and after analysis says whether to go on
(`Decision`). Verdicts themselves are computed from the statistics
(`researcher.analysis.verdict`), never by the planner: an LLM may choose what to
test next, not what the numbers say.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from researcher.experiment import MIN_SEEDS, Design, Frame, HypothesisSpec


class PlanDefaults(BaseModel):
    """What the user fixed on the command line; planners design within it."""

    model_config = ConfigDict(extra="forbid")

    seeds: int = Field(default=MIN_SEEDS, ge=MIN_SEEDS, description="seeds per arm")
    # 40 steps: six trials, two at a time, take ~10 min on 2 CPU cores with the embedded model
    steps: int = Field(default=40, ge=1, description="optimisation steps per trial")
    metric_window: int = Field(default=5, ge=1, description="steps averaged by the final-reward metric")
    max_arms: int = Field(default=4, ge=2, description="most arms one hypothesis may have")


class Decision(BaseModel):
    """After a round: stop, or follow-up hypotheses to test next."""

    model_config = ConfigDict(extra="forbid")

    stop: bool = True
    follow_ups: list[HypothesisSpec] = Field(default_factory=list)
    notes: str = ""


class Planner(Protocol):
    name: str
    tokens_used: int

    def frame(self, topic: str, defaults: PlanDefaults) -> Frame: ...

    def hypothesize(self, topic: str, frame: Frame, history: list[dict]) -> HypothesisSpec | None:
        """The next hypothesis, or None when there is nothing more to ask."""
        ...

    def design(self, frame: Frame, hypothesis: HypothesisSpec, defaults: PlanDefaults) -> Design: ...

    def decide(self, frame: Frame, hypothesis: HypothesisSpec, analysis: dict, history: list[dict],
               can_continue: bool) -> Decision: ...


def choose_direction(knob: str, baseline: Any, treatments: list[Any]) -> str:
    """Expected sign of (treatment − baseline) where the knob's physics tells it.

    A learning rate of 0 does not learn at all, so any positive rate should beat it;
    everything else is a two-sided question ("does it matter?").
    """
    if knob == "lr" and baseline == 0.0 and all(float(t) > 0 for t in treatments):
        return "greater"
    if knob == "lr" and all(float(t) == 0.0 for t in treatments):
        return "less"
    return "two-sided"


def default_design(frame: Frame, hypothesis: HypothesisSpec, defaults: PlanDefaults) -> Design:
    """Baseline + treatment arms of the hypothesis' knob, `defaults.seeds` seeds each."""
    from researcher.experiment import Arm, arm_name

    arms = [Arm(name=arm_name(hypothesis.knob, v), knobs={hypothesis.knob: v})
            for v in [hypothesis.baseline_value, *hypothesis.treatment_values]]
    return Design(task=frame.task, steps=defaults.steps, seeds=list(range(defaults.seeds)),
                  baseline=arms[0].name, arms=arms[: defaults.max_arms], common=dict(frame.baseline))
