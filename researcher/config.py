"""A study's settings: budgets, backend, trial program. Stored in `Study.config` as JSON,
so a resumed study (another process, another day) runs with exactly what it started with.
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from researcher.planning import PlanDefaults


def default_trial_program() -> list[str]:
    """`python -m swarm train` with this interpreter (the trial's flags are appended)."""
    return [sys.executable, "-m", "swarm", "train"]


UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}  # largest first: format_duration


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
    return sum(float(a) * UNITS[b] for a, b in parts)


def format_duration(seconds: float) -> str:
    """3600 → '1h', 5400 → '1h30m': how a user writes it, so a default shows as `parse_duration` reads it."""
    left, out = int(seconds), ""
    for unit, size in UNITS.items():
        if left >= size:
            out += f"{left // size}{unit}"
            left %= size
    return out or "0"


class Budget(BaseModel):
    """Limits checked before every launch (and, for tokens, before every LLM call)."""

    model_config = ConfigDict(extra="forbid")

    max_trials: int | None = Field(default=None, ge=1, description="trials launched, over all rounds")
    cpu_hours: float | None = Field(default=None, gt=0, description="sum of trial wall time × CPUs")
    gpu_hours: float | None = Field(default=None, gt=0, description="sum of trial wall time × GPUs")
    wall_clock_s: float | None = Field(default=None, gt=0, description="seconds since the study started")
    llm_tokens: int | None = Field(default=None, ge=1, description="planner tokens, prompts + answers")
    deadline: datetime | None = Field(default=None, description="no launches after this time (UTC)")


class Adaptive(BaseModel):
    """How the rules planner goes on after a round, and whether trials clearly behind stop early.

    After a round: a supported effect of a numeric knob → a round bracketing the best value;
    an inconclusive comparison → more seeds on the same arms (the next look of a sequential
    comparison, α spent by `spending`); else stop. docs/researcher-statistics.md says why.
    """

    model_config = ConfigDict(extra="forbid")

    # 1 by default: a study costs what it did before adaptivity; --rounds 3 lets it bracket and add seeds
    rounds: int = Field(default=1, ge=1, description="most rounds the rules planner runs (1: one round, no follow-ups)")
    max_seeds: int | None = Field(
        default=None,
        ge=3,
        description="most seeds per arm a comparison reaches over its sequential looks; unset: twice --seeds",
    )
    spending: Literal["obrien-fleming", "pocock"] = Field(
        default="obrien-fleming", description="alpha-spending function across the looks of one comparison"
    )
    precision: float | None = Field(
        default=None,
        gt=0,
        description="no more seeds once every difference's 95 % interval is narrower than this; unset: no target",
    )
    early_stop: bool = Field(
        default=False,
        description="successive halving: stop a treatment arm's trials at a rung when it is in the bottom half and "
        "clearly behind the leader",
    )
    rungs: list[float] = Field(
        default_factory=lambda: [1 / 3, 2 / 3], description="fractions of a trial's steps where arms are compared"
    )

    def seeds_cap(self, seeds: int) -> int:
        """The most seeds per arm, given the study's seeds per round."""
        return self.max_seeds if self.max_seeds is not None else 2 * seeds


#: trials at once of a --shared-base study without --parallel: they are policies of one server, whose
#: forward passes batch their rows; a trial's own job runs only its client fleet
SHARED_BASE_PARALLEL = 12


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
    trial_cpus: int = Field(default=1, ge=1, description="CPUs per trial job")
    trial_gpus: int = Field(default=0, ge=0, description="GPUs per trial job (Slurm)")
    trial_time_limit_s: int = Field(default=3600, ge=1, description="per-trial time limit")
    trial_env: dict[str, str] = Field(default_factory=dict)
    partition: str | None = Field(default=None, description="Slurm partition for trial jobs")
    poll_s: float = Field(default=5.0, gt=0, description="seconds between checks in the foreground")
    study_dir: str = ""
    model_dir: str | None = Field(default=None, description="--model for every trial; None: embedded")
    report_out: str | None = Field(
        default=None,
        description="--out: the folder of the study's report.html, kept for `resume`; the CLI's default: "
        "./studies/study-N where the study was started",
    )
    workflow: str | None = Field(
        default=None,
        description="--workflow module:function for every trial (your own agent); None: the built-in task's",
    )
    dataset: str | None = Field(default=None, description="--dataset module:function for every trial")
    shared_base: bool = Field(
        default=False,
        description="trials as LoRA policies of one server on the study's base (researcher/shared_base.py)",
    )
    deterministic: bool | None = Field(
        default=None,
        description="the trials are reproducible (same config and seed, same run): `swarm train` trials then run "
        "--deterministic, and seed-matched arms are compared by the paired t-test. Default: on for `swarm train` "
        "trials, off for another --trial-program (it must make its own runs reproducible) and --shared-base",
    )
    adaptive: Adaptive = Field(default_factory=Adaptive)
    llm_base_url: str | None = None
    llm_model: str | None = None
    prompt_versions: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> StudyConfig:
        """Options that would be dropped or bent in silence are refused with the reason."""
        if self.dataset and not self.workflow:  # trials ran the built-in task's own dataset
            raise ValueError("--dataset feeds a --workflow of yours: give the --workflow too (a task has its own)")
        max_seeds = self.adaptive.max_seeds
        if max_seeds is not None and max_seeds < self.defaults.seeds:
            raise ValueError(
                f"--max-seeds {max_seeds} is fewer than --seeds {self.defaults.seeds}: the first look has those"
            )
        return self

    @model_validator(mode="after")
    def _deterministic(self) -> StudyConfig:
        """Resolve the default: `swarm train --deterministic` makes a trial reproducible (docs/researcher-statistics.md,
        "Reproducible trials"), so a study of such trials pairs them; trials as policies of one shared server
        interleave in its batches and never are."""
        if self.deterministic and self.shared_base:
            raise ValueError("--deterministic: trials sharing one server (--shared-base) are not reproducible")
        if self.adaptive.early_stop and self.shared_base:  # it was switched off in silence
            raise ValueError(
                "--early-stop: trials sharing one server (--shared-base) keep their metrics in its folder, "
                "which early stopping does not read yet; leave one of them out"
            )
        if self.deterministic is None:
            self.deterministic = self.uses_swarm_train and not self.shared_base
        return self

    @property
    def uses_swarm_train(self) -> bool:
        """`python -m swarm train` or `swarm train`, flags of its own after it or not (`... train --group-size 2`
        still gets the study's --model, --workflow and MLflow flags)."""
        prog = self.trial_program
        if "-m" in prog:
            i = prog.index("-m")
            return prog[i + 1 : i + 3] == ["swarm", "train"]
        return Path(prog[0]).name == "swarm" and prog[1:2] == ["train"]
