"""What a `swarm train --team ROLE=MODEL,...` names, checked before anything starts (swarm/team_run.py
runs it): the roles against the task's or workflow's, each model a directory, a preset or `embedded`,
and on `--resume` that the folder holds this very team. One line per problem, as `prepare`'s.

A team's servers are its models: roles on one model share one server (LoRA policies of that base),
every other model gets a server of its own (`members`)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from store.paths import default_model_dir
from swarm.config.policies import check_name
from swarm.config.run import RunConfig
from swarm.model.presets import PRESETS, default_preset_dir
from swarm.tasks import get_task, list_tasks
from swarm.team_resume import Member, recorded_team, resume_problems, role_steps

EMBEDDED = "embedded"


def parse_team(text: str) -> tuple[dict[str, str], list[str]]:
    """'planner=A,executor=B' -> ({role: model}, problems): each problem one line naming --team."""
    team: dict[str, str] = {}
    problems: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        role, sep, model = (x.strip() for x in part.partition("="))
        if not sep or not role or not model:
            problems.append(f"--team: expected ROLE=MODEL, got {part!r}")
            continue
        try:
            check_name(role)
        except ValueError as exc:
            problems.append(f"--team: role {role!r}: {exc}")
            continue
        if role in team:
            problems.append(f"--team: role {role!r} is named twice (one model per role)")
            continue
        team[role] = model
    return team, problems


def resolve_model(text: str) -> Path:
    """A --team model: `embedded` (the embedded model), a preset name (its default folder), or a path."""
    if text == EMBEDDED:
        return default_model_dir()
    if text in PRESETS and not Path(text).exists():
        return default_preset_dir(text)
    return Path(text).expanduser().resolve()


def known_roles(spec: RunConfig) -> tuple[tuple[str, ...] | None, str]:
    """(the roles the task or workflow plays, what names them); None when nothing declares them.

    A built-in team task names its roles (`Task.roles`); a team workflow declares them as `ROLES`
    beside it in its module (or a `roles` attribute on the function), as swarm/tasks/duet.py does."""
    if spec.workflow is not None:
        module_name, _, attr = spec.workflow.partition(":")
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
            flow = getattr(module, attr.split(".")[0], None)
        except Exception:  # noqa: BLE001 - run_checks reports an unimportable workflow on its own line
            return None, spec.workflow
        roles = getattr(flow, "roles", None) or getattr(module, "ROLES", None)
        if roles:
            return tuple(roles), f"the workflow {spec.workflow}"
    if spec.task is not None and spec.task in list_tasks():
        roles = get_task(spec.task).roles
        return (tuple(roles) if roles else ()), f"task {spec.task}"
    return None, spec.workflow or "the task"


def team_problems(spec: RunConfig, resume: bool = False) -> list[str]:
    """Everything wrong with a --team run, before anything starts: one line each."""
    assert spec.team is not None
    team, found = parse_team(spec.team)
    if spec.workflow is None and (spec.task is None or "+" in spec.task):
        found.append("--team plays one team task: give --task duet or a team --workflow (a task mix is not a team)")
    roles, source = known_roles(spec)
    if roles == ():
        teams = ", ".join(t for t in list_tasks() if get_task(t).roles)
        found.append(f"--team: {source} has no roles (team tasks: {teams})")
    elif roles is None:
        found.append(f"--team: {source} names no roles: declare ROLES = (...) beside the workflow")
    else:
        found += [
            f"--team: {source} has no role {role!r} (its roles: {', '.join(roles)})"
            for role in team
            if role not in roles
        ]
        found += [
            f"--team: role {role!r} of {source} has no model (give {role}=MODEL)" for role in roles if role not in team
        ]
    for role, model in team.items():
        path = resolve_model(model)
        if model == EMBEDDED or model in PRESETS:
            continue  # built before the run starts when missing
        if not (path / "config.json").is_file():
            found.append(
                f"--team: {role}={model}: {path} is not a model directory (no config.json), a preset or {EMBEDDED}"
            )
    if spec.server.engine == "verl" and len({resolve_model(m) for m in team.values()}) < len(team):
        found.append(
            "--team: roles on one model are LoRA policies of one server, which runs in the torch and vllm engines"
        )
    if resume and not found:
        found += _resume_problems(spec, team)
    return found


def _resume_problems(spec: RunConfig, team: dict[str, str]) -> list[str]:
    """`--resume`: the folder must hold this very team (run.yaml's: the same roles, in the same order, on
    the same models: a shared server's folder is named by its roles in order), with steps left."""
    text = recorded_team(spec.out)
    recorded, bad = parse_team(text or "")
    resolved = [(r, resolve_model(m)) for r, m in recorded.items()]
    matches = text is not None and not bad and resolved == [(r, resolve_model(m)) for r, m in team.items()]
    done = role_steps(spec.out.resolve(), members(spec)) if matches else {}
    return resume_problems(spec.out, text, matches, done, spec.steps)


def members(spec: RunConfig) -> list[Member]:
    """The team's servers: one per distinct model, its roles in --team order."""
    team, _ = parse_team(spec.team or "")
    by_model: dict[Path, list[str]] = {}
    for role, model in team.items():
        by_model.setdefault(resolve_model(model), []).append(role)
    return [Member("+".join(roles), model, tuple(roles)) for model, roles in by_model.items()]


def ensure_models(spec: RunConfig, build: Callable[[str, Path], None]) -> None:
    """Build the embedded model or a preset that a role names and this machine lacks (`build(name, dir)`)."""
    team, _ = parse_team(spec.team or "")
    for model in dict.fromkeys(team.values()):
        path = resolve_model(model)
        if (model == EMBEDDED or model in PRESETS) and not (path / "config.json").is_file():
            build(model, path)
