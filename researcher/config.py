"""A study's settings: budgets, backend, trial program. Stored in `Study.config` as JSON,
so a resumed study (another process, another day) runs with exactly what it started with.
"""

from __future__ import annotations

import re
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from researcher.planning import PlanDefaults

ENV_TRIAL_PROGRAM = "ROOST_TRIAL_PROGRAM"


def default_trial_program() -> list[str]:
    """`python -m swarm train` with this interpreter (the trial's flags are appended)."""
    return [sys.executable, "-m", "swarm", "train"]


def parse_duration(text: str | None) -> float | None:
    """'90' (seconds), '45m', '2h', '1d', '1h30m' → seconds; None stays None."""
    if text is None or str(text).strip() == "":
        return None
    s = str(text).strip().lower()
    try:
        return float(s)
    except ValueError:
        pass
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", s)
    if not parts or "".join(f"{a}{b}" for a, b in parts) != re.sub(r"\s+", "", s):
        raise ValueError(f"not a duration: {text!r} (use e.g. 90, 45m, 2h, 1d)")
    return sum(float(a) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[b] for a, b in parts)


class Budget(BaseModel):
    """Limits checked before every launch (and, for tokens, before every LLM call)."""

    model_config = ConfigDict(extra="forbid")

    max_trials: int | None = Field(default=None, ge=1, description="trials launched, over all rounds")
    cpu_hours: float | None = Field(default=None, gt=0, description="sum of trial wall time × CPUs")
    gpu_hours: float | None = Field(default=None, gt=0, description="sum of trial wall time × GPUs")
    wall_clock_s: float | None = Field(default=None, gt=0, description="seconds since the study started")
    llm_tokens: int | None = Field(default=None, ge=1, description="planner tokens, prompts + answers")
    deadline: datetime | None = Field(default=None, description="no launches after this time (UTC)")


class StudyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: str
    planner: Literal["llm", "rules"] = "rules"
    backend: Literal["local", "slurm"] = "local"
    defaults: PlanDefaults = Field(default_factory=PlanDefaults)
    budget: Budget = Field(default_factory=Budget)
    approve: bool = Field(default=False, description="pause for approval before the first launch")
    parallel: int = Field(default=2, ge=1, description="trials running at once")
    trial_program: list[str] = Field(default_factory=default_trial_program)
    trial_cpus: int = Field(default=1, ge=1)
    trial_gpus: int = Field(default=0, ge=0)
    trial_time_limit_s: int = Field(default=3600, ge=1)
    trial_env: dict[str, str] = Field(default_factory=dict)
    partition: str | None = None
    poll_s: float = Field(default=5.0, gt=0, description="foreground polling interval")
    study_dir: str = ""
    model_dir: str | None = Field(default=None, description="--model for every trial; None: embedded")
    workflow: str | None = Field(default=None, description="--workflow module:function for every trial (your own "
                                                           "agent); None: the built-in task's")
    dataset: str | None = Field(default=None, description="--dataset module:function for every trial")
    llm_base_url: str | None = None
    llm_model: str | None = None
    prompt_versions: dict[str, int] = Field(default_factory=dict)

    @property
    def uses_swarm_train(self) -> bool:
        return self.trial_program[-3:] == ["-m", "swarm", "train"] or \
            Path(self.trial_program[0]).name in ("swarm",) and self.trial_program[1:] == ["train"]


def program_from_env(value: str | None) -> list[str] | None:
    return shlex.split(value) if value else None
