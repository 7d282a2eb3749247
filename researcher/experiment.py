"""Typed experiment plans: the knobs a study may turn, and validated designs.

Everything a planner proposes (rules or LLM) ends up as these pydantic models, so
a design that names an unknown knob, a value out of range, fewer than 3 seeds or
a knob the trial program cannot express is refused *before* anything launches:

    design = Design(task="arith", steps=30, seeds=[0, 1, 2], baseline="lr=0",
                    arms=[Arm(name="lr=0", knobs={"lr": 0.0}),
                          Arm(name="lr=3e-4", knobs={"lr": 3e-4})])
    design.trial_configs()   # -> [ExperimentConfig(arm="lr=0", seed=0, ...), ...]

The knobs are derived from `swarm train`'s config model (`RunConfig`, with the
server's `ServerConfig` and `TrainConfig` inside): every setting a run may vary,
with its type, default, help and flag, so a new server setting is a new knob
without an edit here. A knob maps onto one `swarm train` flag (`KNOBS[name].flag`).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Literal

import typer.main
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.config.options import Leaf, cli_leaves
from swarm.config.run import ORCHESTRATED, RunConfig, parse_mix
from swarm.tasks import list_tasks

MIN_SEEDS = 3
#: a question shorter than this says nothing a planner can frame ("lr" is a knob, not a question)
MIN_QUESTION = 3

Metric = Literal["final_reward", "reward_gain", "mean_reward"]
Direction = Literal["greater", "less", "two-sided"]

METRIC_HELP = {
    "final_reward": "mean reward of the last {steps}",
    "reward_gain": "mean reward of the last {steps} minus that of the first {steps}",
    "mean_reward": "mean reward over all steps",
}


class OutOfRange(ValueError):
    """A knob's value of the right type outside the range a study may use."""


@dataclass(frozen=True)
class Knob:
    """One configuration knob a study can vary."""

    name: str
    kind: Literal["float", "int", "bool", "choice", "str"]
    flag: str | None  # `swarm train` option; None: not a command-line flag
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    false_flag: str | None = None  # for bools: the flag that turns it off
    default: Any = None  # what a trial that does not set it runs with

    def range_text(self) -> str:
        """`[0, 64]`: the values a study may give this knob."""
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"[{low}, {high}]"

    def validate(self, value: Any) -> Any:
        """The value coerced to the knob's type; ValueError when wrong or out of range."""
        if self.kind == "bool":
            if isinstance(value, str) and value.lower() in ("on", "true", "yes", "1"):
                return True
            if isinstance(value, str) and value.lower() in ("off", "false", "no", "0"):
                return False
            if not isinstance(value, bool):
                raise ValueError(f"{self.name} must be true/false (on/off), got {value!r}")
            return value
        if self.kind in ("float", "int"):
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ValueError(f"{self.name} must be a number, got {value!r}")
            try:
                num = float(value)
            except ValueError:
                raise ValueError(f"{self.name} must be a number, got {value!r}") from None
            if self.kind == "int":
                if num != int(num):
                    raise ValueError(f"{self.name} must be an integer, got {value!r}")
                num = int(num)
            if self.low is not None and num < self.low or self.high is not None and num > self.high:
                raise OutOfRange(f"{self.name}={value!r} is outside the allowed range {self.range_text()}")
            return num
        if self.kind == "choice":
            if str(value) not in self.choices:
                raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}")
            return str(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{self.name} must be a non-empty string, got {value!r}")
        return value.strip()

    def argv(self, value: Any) -> list[str]:
        if self.kind == "bool":
            flag = self.flag if value else self.false_flag
            return [flag] if flag else []
        return [self.flag, _fmt(value)] if self.flag else []


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _kind(leaf: Leaf) -> str:
    if leaf.annotation is bool:
        return "bool"
    if leaf.annotation in (int, float):
        return leaf.annotation.__name__
    if isinstance(leaf.annotation, type) and issubclass(leaf.annotation, enum.Enum):
        return "choice"
    return "str"


def _knob(leaf: Leaf) -> Knob:
    low, high = leaf.flag.study or leaf.bounds
    kind = _kind(leaf)
    choices = tuple(str(c.value) for c in leaf.annotation) if kind == "choice" else ()
    default = leaf.default.value if isinstance(leaf.default, enum.Enum) else leaf.default
    if leaf.knob == "model":
        default = "embedded"
    false_flag = (leaf.flag.off or "--no-" + leaf.option[2:]) if kind == "bool" else None
    return Knob(
        leaf.knob,
        kind,
        leaf.option,
        leaf.description,
        low,
        high,
        choices,  # type: ignore[arg-type]
        false_flag,
        default,
    )


def derive_knobs() -> dict[str, Knob]:
    """Every setting of a `swarm train` run a study may vary, from `RunConfig`'s fields.

    Names, types, choices, help, defaults and flags come from the config model;
    a field's `Flag(study=(low, high))` narrows the range a study may explore.
    Settings `swarm train` orchestrates itself and those marked `studied=False`
    (paths, ports, secrets, logging) are left out.
    """
    out: dict[str, Knob] = {}
    for leaf in cli_leaves(RunConfig, RunConfig(), exclude=ORCHESTRATED):
        if leaf.flag.studied:
            out[leaf.knob] = _knob(leaf)
    return out


KNOBS: dict[str, Knob] = derive_knobs()

STEPS_RANGE = (1, 100_000)


@functools.lru_cache(maxsize=1)
def swarm_train_flags() -> frozenset[str] | None:
    """Option names `swarm train` accepts, read from its typer command (None if unknown)."""
    try:
        from swarm.cli import app  # lazy: the whole swarm CLI (server, engines' config) only when checked

        group = typer.main.get_command(app)
        cmd = group.commands["train"]  # type: ignore[attr-defined]
        return frozenset(o for p in cmd.params for o in (*p.opts, *p.secondary_opts))
    except Exception:  # pragma: no cover - swarm not importable: no check
        return None


def known_tasks() -> list[str]:
    return list(list_tasks())


def check_supported(knobs: dict[str, Any], flags: frozenset[str] | None) -> None:
    """ValueError when a knob needs a flag the trial program does not have."""
    if flags is None:
        return
    for name, value in knobs.items():
        knob = KNOBS[name]
        needed = [f for f in knob.argv(value) if f.startswith("--")]
        missing = [f for f in needed if f not in flags]
        if missing:
            raise ValueError(f"knob {name!r} is not supported by `swarm train` yet (no {missing[0]} option)")
        if name == "task":
            parse_mix(str(value))  # ValueError naming an unknown task or a bad share


class ExperimentConfig(BaseModel):
    """One trial: an arm's knobs plus the seed, fully validated; renders its argv."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arm: str
    seed: int = Field(ge=0)
    task: str = "arith"
    steps: int = Field(ge=STEPS_RANGE[0], le=STEPS_RANGE[1])
    knobs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("knobs")
    @classmethod
    def _known(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        return validate_knobs(knobs)

    @field_validator("task")
    @classmethod
    def _task(cls, task: str) -> str:
        tasks = known_tasks()
        for t in (part.partition("=")[0] for part in task.split("+")):  # a mix: name[=share]+...
            if t not in tasks:
                raise ValueError(f"unknown task {t!r}; built-in tasks: {', '.join(tasks)}")
        return task

    def argv(self, out_dir: str) -> list[str]:
        """Flags for `swarm train` (the program itself is prepended by the launcher)."""
        args = ["--task", self.task, "--steps", str(self.steps), "--seed", str(self.seed), "--out", out_dir]
        for name, value in sorted(self.knobs.items()):
            if name == "task" or (name == "model" and value == "embedded"):
                continue
            args += KNOBS[name].argv(value)
        return args


def validate_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in knobs.items():
        if name not in KNOBS:
            raise ValueError(f"unknown knob {name!r}; known knobs: {', '.join(KNOBS)}")
        out[name] = KNOBS[name].validate(value)
    return out


class Frame(BaseModel):
    """What the study asks and how it is measured."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=MIN_QUESTION, description="the research question in one sentence")
    task: str = Field(default="arith", description="built-in task the trials train on")
    metric: Metric = Field(default="final_reward", description="what one trial is scored by")
    metric_window: int = Field(default=5, ge=1, le=100, description="steps averaged by the metric")
    knobs: list[str] = Field(default_factory=list, description="knobs under study")
    baseline: dict[str, Any] = Field(default_factory=dict, description="knob values of the baseline arm")

    @field_validator("knobs")
    @classmethod
    def _knobs(cls, knobs: list[str]) -> list[str]:
        for k in knobs:
            if k not in KNOBS:
                raise ValueError(f"unknown knob {k!r}; known knobs: {', '.join(KNOBS)}")
        return knobs

    @field_validator("baseline")
    @classmethod
    def _baseline(cls, baseline: dict[str, Any]) -> dict[str, Any]:
        return validate_knobs(baseline)

    @field_validator("task")
    @classmethod
    def _task(cls, task: str) -> str:
        return ExperimentConfig._task(task)

    def metric_description(self) -> str:
        w = self.metric_window
        return METRIC_HELP[self.metric].format(steps="step" if w == 1 else f"{w} steps")


class HypothesisSpec(BaseModel):
    """A falsifiable claim: the treatment arm beats / trails / differs from the baseline."""

    model_config = ConfigDict(extra="forbid")

    statement: str = Field(min_length=3)
    rationale: str = ""
    knob: str
    baseline_value: Any
    treatment_values: list[Any] = Field(min_length=1)
    direction: Direction = Field(default="two-sided", description="expected sign of treatment minus baseline")
    # set by the rules planner's adaptive rounds (researcher/rules.py: next_round); an LLM planner leaves them
    seeds: list[int] | None = Field(default=None, description="this round's seeds; None: the study's 0..seeds-1")
    extends: int | None = Field(
        default=None,
        ge=0,
        description="the round (0-based) whose arms this round gives more seeds: analysed together with it, "
        "as the next look of one sequential comparison",
    )

    @model_validator(mode="after")
    def _check(self) -> HypothesisSpec:
        if self.knob not in KNOBS:
            raise ValueError(f"unknown knob {self.knob!r}; known knobs: {', '.join(KNOBS)}")
        knob = KNOBS[self.knob]
        self.baseline_value = knob.validate(self.baseline_value)
        self.treatment_values = [knob.validate(v) for v in self.treatment_values]
        if self.baseline_value in self.treatment_values:
            raise ValueError("the baseline value must not also be a treatment value")
        return self


class Arm(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=80)
    knobs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("knobs")
    @classmethod
    def _known(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        return validate_knobs(knobs)


class Design(BaseModel):
    """Arms × seeds for one hypothesis; every arm shares task, steps and seeds."""

    model_config = ConfigDict(extra="forbid")

    task: str = "arith"
    steps: int = Field(ge=STEPS_RANGE[0], le=STEPS_RANGE[1])
    seeds: list[int] = Field(min_length=MIN_SEEDS)
    baseline: str = Field(description="name of the baseline arm")
    arms: list[Arm] = Field(min_length=2)
    common: dict[str, Any] = Field(default_factory=dict, description="knobs every arm shares")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
            raise ValueError(f"seeds must be distinct non-negative integers, got {seeds}")
        if len(seeds) < MIN_SEEDS:
            raise ValueError(f"at least {MIN_SEEDS} seeds per arm are required")
        return seeds

    @field_validator("common")
    @classmethod
    def _common(cls, knobs: dict[str, Any]) -> dict[str, Any]:
        return validate_knobs(knobs)

    @model_validator(mode="after")
    def _check(self) -> Design:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique, got {names}")
        if self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not one of the arms {names}")
        merged = [{**self.common, **a.knobs} for a in self.arms]
        if len({repr(sorted(m.items())) for m in merged}) != len(merged):
            raise ValueError("two arms have identical knobs: nothing would be compared")
        self.trial_configs()  # every trial must validate
        return self

    def trial_configs(self) -> list[ExperimentConfig]:
        out = []
        for a in self.arms:
            knobs = {**self.common, **a.knobs}
            task = str(knobs.get("task", self.task))
            out += [ExperimentConfig(arm=a.name, seed=s, task=task, steps=self.steps, knobs=knobs) for s in self.seeds]
        return out

    def check_program(self, flags: frozenset[str] | None) -> None:
        for cfg in self.trial_configs():
            check_supported(cfg.knobs, flags)


def arm_name(knob: str, value: Any) -> str:
    """A short, stable arm name such as `lr=3e-04` or `timeline_merge=off`."""
    if isinstance(value, bool):
        return f"{knob}={'on' if value else 'off'}"
    if isinstance(value, float):
        return f"{knob}={value:g}"
    if knob == "model":
        return f"model={str(value).rstrip('/').rsplit('/', 1)[-1]}"
    return f"{knob}={value}"
