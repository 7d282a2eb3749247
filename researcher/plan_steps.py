"""What the study graph's planning nodes ask the planner, without the rows they write.

Shared by the nodes (`researcher.graph`) and `first_round`, so a dry run or a pre-check plans exactly
as the study would, not by a copy of the path that could drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from researcher import shared_base
from researcher.config import StudyConfig
from researcher.experiment import Design, Frame, HypothesisSpec, swarm_train_flags
from researcher.llm import StructuredOutputError
from researcher.planning import UnsupportedTopic, fit_to_budget


def cannot_plan(p: Any, e: Exception) -> str:
    """The stop reason when the planner cannot go on (one line in the report)."""
    what = " ".join(str(e).split())
    if isinstance(e, StructuredOutputError):
        return (
            f"the {p.name} planner gave no valid answer: {what} (hint: a stronger model via "
            f"ROOST_LLM_MODEL, or --planner rules)"
        )
    return f"the {p.name} planner cannot plan this: {what}"


PLANNING_STOPS = (StructuredOutputError, UnsupportedTopic)


def plan_design(
    p: Any, cfg: StudyConfig, frame: Frame, hyp: HypothesisSpec, trials_left: int | None
) -> tuple[Design, str]:
    """The planner's design fitted to the trials left, and what fitting cut ("" if nothing).

    BudgetTooSmall when not even the smallest design fits.
    """
    return fit_to_budget(p.design(frame, hyp, cfg.defaults), trials_left)


def check_program(cfg: StudyConfig, d: Design) -> None:
    """ValueError when the trial program lacks a flag the design sets (only `swarm train`'s are known),
    or, with --shared-base, when the design varies what policies of one server cannot."""
    if cfg.uses_swarm_train:
        d.check_program(swarm_train_flags())
    if cfg.shared_base:
        shared_base.check_design({*d.common, *(k for arm in d.arms for k in arm.knobs)})
        shared_base.check_full_parameter([d.common, *(arm.knobs for arm in d.arms)])


@dataclass(frozen=True)
class FirstRound:
    """What a dry run shows and a pre-check refuses on; a study keeps the same in its state."""

    frame: Frame
    hypothesis: HypothesisSpec
    design: Design
    note: str  # what fitting the design to the trial budget cut


def first_round(p: Any, cfg: StudyConfig) -> FirstRound:
    """The first round as frame → hypothesize → design would plan it, before any study exists.

    Nothing is stored, and a planner that cannot go on raises (UnsupportedTopic,
    StructuredOutputError, BudgetTooSmall, LLMUnreachable) where the nodes would end
    the study, so the caller can refuse the topic up front. The trial program is not
    checked: a dry run still shows a plan the program cannot run (`check_program`).
    """
    f = p.frame(cfg.topic, cfg.defaults)
    hyp = p.hypothesize(cfg.topic, f, [])
    if hyp is None:
        raise UnsupportedTopic(f"the {p.name} planner has no hypothesis for this topic")
    d, note = plan_design(p, cfg, f, hyp, cfg.budget.max_trials)
    return FirstRound(f, hyp, d, note)
