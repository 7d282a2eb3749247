"""The planner interface both planners implement, and the small types they share.

A planner turns a topic into a `Frame`, proposes `HypothesisSpec`s, designs each
as a `Design` (arms × seeds), and after analysis says whether to go on
(`Decision`). Verdicts themselves are computed from the statistics
(`researcher.analysis.analyze`), never by the planner: an LLM may choose what to
test next, not what the numbers say.

Plans are honest about their limits: a topic a planner cannot express raises
`UnsupportedTopic` (naming what it can study), and `fit_to_budget` shrinks a design
to a trial budget (treatment arms first, then seeds) or raises `BudgetTooSmall`.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from researcher.analysis import metric_window
from researcher.experiment import KNOBS, MIN_SEEDS, Arm, Design, Frame, HypothesisSpec, arm_name


class UnsupportedTopic(ValueError):
    """The planner cannot express the topic with its knobs (the message lists them)."""


class BudgetTooSmall(ValueError):
    """Even the smallest design (baseline + one treatment, MIN_SEEDS seeds each) exceeds the budget."""


def knob_list(names: list[str] | None = None) -> str:
    """What a study can vary (`names`, or every knob), one knob a line (for refusals and help)."""
    return "\n".join(f"  {k.name}: {k.help}" for k in KNOBS.values() if names is None or k.name in names)


class PlanDefaults(BaseModel):
    """What the user fixed on the command line; planners design within it."""

    model_config = ConfigDict(extra="forbid")

    seeds: int = Field(default=MIN_SEEDS, ge=MIN_SEEDS, description="seeds per arm")
    # 40 steps: six trials, two at a time, take ~10 min on 2 CPU cores with the embedded model
    steps: int = Field(default=40, ge=1, description="optimisation steps per trial")
    metric_window: int | None = Field(
        default=None,
        ge=1,
        description="steps averaged by the final-reward "
        "metric; None: scaled with the trial length (analysis.metric_window)",
    )
    max_arms: int = Field(default=4, ge=2, description="most arms one hypothesis may have")

    def window(self) -> int:
        return self.metric_window or metric_window(self.steps)


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

    def decide(
        self, frame: Frame, hypothesis: HypothesisSpec, analysis: dict, history: list[dict], can_continue: bool
    ) -> Decision: ...


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
    """Baseline + treatment arms of the hypothesis' knob, `defaults.seeds` seeds each (or the
    hypothesis' own seeds: a sequential look's new seeds, researcher/rules.py)."""
    arms = [
        Arm(name=arm_name(hypothesis.knob, v), knobs={hypothesis.knob: v})
        for v in [hypothesis.baseline_value, *hypothesis.treatment_values]
    ]
    return Design(
        task=frame.task,
        steps=defaults.steps,
        seeds=list(hypothesis.seeds) if hypothesis.seeds else list(range(defaults.seeds)),
        baseline=arms[0].name,
        arms=arms[: defaults.max_arms],
        common=dict(frame.baseline),
    )


def fit_to_budget(design: Design, max_trials: int | None) -> tuple[Design, str]:
    """The design cut to at most `max_trials` trials, and a note saying what was cut ("" if nothing).

    Treatment arms go first (the last named first; the baseline always stays), then
    seeds, down to MIN_SEEDS: fewer arms still answer a question, fewer seeds answer
    none. Raises BudgetTooSmall when baseline + one treatment × MIN_SEEDS does not fit.
    """
    arms, seeds = len(design.arms), len(design.seeds)
    if max_trials is None or arms * seeds <= max_trials:
        return design, ""
    smallest = 2 * MIN_SEEDS
    if max_trials < smallest:
        raise BudgetTooSmall(
            f"a trial budget of {max_trials} cannot cover even the smallest design "
            f"(2 arms × {MIN_SEEDS} seeds = {smallest} trials"
            + (
                ""
                if (arms, seeds) == (2, MIN_SEEDS)
                else f"; {arms} arms × {seeds} seeds = {arms * seeds} were planned"
            )
            + ")"
        )
    keep_arms = max(2, min(arms, max_trials // seeds))
    keep_seeds = min(seeds, max_trials // keep_arms)
    base = next(a for a in design.arms if a.name == design.baseline)
    kept = [base, *[a for a in design.arms if a.name != design.baseline][: keep_arms - 1]]
    fitted = design.model_copy(update={"arms": kept, "seeds": design.seeds[:keep_seeds]})
    Design.model_validate(fitted.model_dump())  # still a valid design
    cut = []
    if keep_arms < arms:
        cut.append(f"dropped arm(s) {', '.join(a.name for a in design.arms if a not in kept)}")
    if keep_seeds < seeds:
        cut.append(f"{keep_seeds} seeds instead of {seeds}")
    note = (
        f"Shrunk to fit the trial budget of {max_trials}: {'; '.join(cut)} "
        f"({keep_arms} arms × {keep_seeds} seeds = {keep_arms * keep_seeds} of {arms * seeds} planned trials)."
    )
    return fitted, note
