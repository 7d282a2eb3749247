"""`researcher`: the autonomous study loop (docs/design.md, "The researcher loop").

    researcher study "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"

Modules: `experiment` (knobs, typed configs, designs), `planning` (planner
interface), `rules` / `llm_planner` (the two planners), `llm` (chat models,
scripted model, request switch, structured output), `prompts` (templates in
`prompts/`), `analysis` (statistics, plots), `trials` (exactly-once launches),
`graph` (the LangGraph study), `runner` (create / drive / resume / stop),
`report`, `tracking` (MLflow), `daemon` (scheduler ticks), `cli`.
Names are imported on first use, so `import researcher` stays light; MLflow,
scipy and matplotlib load only where a study logs, analyses or plots.
"""

from __future__ import annotations

import typing as _typing

from store.lazy import lazy_attributes as _lazy_attributes

_LAZY = {
    "Arm": "researcher.experiment",
    "Budget": "researcher.config",
    "Design": "researcher.experiment",
    "ExperimentConfig": "researcher.experiment",
    "Frame": "researcher.experiment",
    "HypothesisSpec": "researcher.experiment",
    "KNOBS": "researcher.experiment",
    "LLMPlanner": "researcher.llm_planner",
    "PlanDefaults": "researcher.planning",
    "RulesPlanner": "researcher.rules",
    "ScriptedChatModel": "researcher.scripted_model",
    "StudyConfig": "researcher.config",
    "StudyEnded": "researcher.runner",
    "advance": "researcher.runner",
    "analyze": "researcher.analysis",
    "create_study": "researcher.runner",
    "drive": "researcher.runner",
    "model_requests_allowed": "researcher.llm",
    "override_model": "researcher.llm",
    "stop_study": "researcher.runner",
}

if _typing.TYPE_CHECKING:
    from researcher.analysis import analyze
    from researcher.config import Budget, StudyConfig
    from researcher.experiment import KNOBS, Arm, Design, ExperimentConfig, Frame, HypothesisSpec
    from researcher.llm import model_requests_allowed, override_model
    from researcher.llm_planner import LLMPlanner
    from researcher.planning import PlanDefaults
    from researcher.rules import RulesPlanner
    from researcher.runner import StudyEnded, advance, create_study, drive, stop_study
    from researcher.scripted_model import ScriptedChatModel


__getattr__ = _lazy_attributes(__name__, _LAZY)


__all__ = sorted(_LAZY)
