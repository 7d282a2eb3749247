"""Score a team run's roles together: each role's trained model plays its part of the team task.

    swarm eval --model runs/duet                    # `swarm train --task duet --shared-base` or `--team`

A team task (`Task.roles`, e.g. duet's planner and executor) is a game of several models, so a
role's checkpoint scored alone says little: the planner's reward depends on the executor it
plans for. Here every role's last checkpoint answers the calls its role makes (`LocalOpenAI`
routes each call by the `model` it names, the role), against the same held-out problems, and each
role's reward is reported beside what the team's initial models score: a run that trained both
roles should raise both.

Where a run keeps its roles (`team_checkpoints`): the layouts of `swarm/run_layout.py`, shared with
`swarm inspect`.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import torch

from swarm.model.evaluate import (
    Loaded,
    LocalOpenAI,
    RunFolderError,
    initial_model,
    latest_checkpoint,
    run_workflows,
    score_row,
)
from swarm.run_layout import role_folders, server_of
from swarm.tasks import get_task, list_tasks

#: What a team plan is: per team task, {role: (its last checkpoint, the model it started from)}.
TeamPlan = list[tuple[str, dict[str, tuple[Path, Path | None]]]]


def is_team_run(path: Path) -> bool:
    """Whether `path` is a run folder whose roles (a policy or server per role) live in `servers/` or
    `policies/` with checkpoints; a plain run, a checkpoint or a model directory is not."""
    return any((folder / "checkpoints").is_dir() for folder in role_folders(path))


def team_checkpoints(path: Path, roles: tuple[str, ...]) -> dict[str, tuple[Path, Path | None]]:
    """{role: (its last checkpoint, the model it started from)} for a team run folder.

    Raises RunFolderError naming the roles it found none for, and what the folder holds."""
    path = Path(path)
    got: dict[str, tuple[Path, Path | None]] = {}
    for role in roles:
        for folder in role_folders(path, role):
            checkpoint = latest_checkpoint(folder / "checkpoints") if (folder / "checkpoints").is_dir() else None
            if checkpoint is not None:
                got[role] = (checkpoint, initial_model(server_of(folder)))
                break
    missing = [r for r in roles if r not in got]
    if missing:
        held = sorted({p.parent.name for p in path.glob("**/checkpoints")})
        raise RunFolderError(
            f"{path}: no checkpoint for role {', '.join(missing)} of the team ({', '.join(roles)})"
            + (f"; it holds checkpoints of {', '.join(held)}" if held else "; it holds no checkpoints yet")
        )
    return got


def team_plan(path: Path, tasks: list[str] | None) -> TeamPlan | None:
    """The team tasks (of `tasks`, default every one) whose roles all have checkpoints in the run folder
    `path`, with them; None when `path` is no team run (a plain run, a study's server of trials).

    Raises RunFolderError for a team run asked for a one-model task (a role is scored alone by its own
    folder), or for a team task named in `tasks` whose roles are not all there."""
    if not is_team_run(path):
        return None
    asked = [t for t in tasks or [] if get_task(t).roles]
    plan: TeamPlan = []
    for name in asked or [t for t in list_tasks() if get_task(t).roles]:
        try:
            plan.append((name, team_checkpoints(path, get_task(name).roles)))
        except RunFolderError:
            if asked:
                raise
    single = [t for t in tasks or [] if not get_task(t).roles]
    if plan and single:
        roles = {role: checkpoint for _, found in plan for role, (checkpoint, _) in found.items()}
        one = next(iter(roles))
        raise RunFolderError(
            f"{path} is a team run ({', '.join(roles)}), scored on its team task ({plan[0][0]}), not on "
            f"{', '.join(single)}; score a role alone with --model {checkpoint_owner(roles[one])}"
        )
    return plan or None


def team_mixes(
    trained: dict[str, Path], initial: dict[str, Path], each_role: bool
) -> list[tuple[str, dict[str, Path]]]:
    """The teams to score, labelled, in the table's order: the initial team, then with `each_role` every
    role trained beside its partners' initial models ("only ROLE trained") and, in a team of three roles or
    more, every role left initial beside its trained partners ("all but ROLE trained"), then the trained team.

    Two views of one role's share: what its training alone gives the team, and what the team loses without
    it. With two roles they are the same teams ("all but planner" is "only executor"), so only the first is
    listed. `initial` is empty where the run recorded no initial models: the trained team alone."""
    mixes: list[tuple[str, dict[str, Path]]] = []
    if initial:
        mixes.append(("initial", dict(initial)))
        if each_role:
            mixes += [(f"only {role} trained", {**initial, role: trained[role]}) for role in trained]
            if len(trained) > 2:
                mixes += [(f"all but {role} trained", {**trained, role: initial[role]}) for role in trained]
    mixes.append(("trained", dict(trained)))
    return mixes


def checkpoint_owner(checkpoint: Path) -> Path:
    """The role's folder that holds `checkpoint` (`.../ROLE/checkpoints/step_N` -> `.../ROLE`)."""
    return checkpoint.parent.parent


def evaluate_team(
    models: dict[str, Path],
    task_name: str,
    n: int = 200,
    temperature: float = 1.0,
    seed: int = 12345,
    loaded: Loaded | None = None,
) -> list[dict]:
    """One row per role (task `duet (planner)`, ...): its mean reward when each role's model plays its part.

    A model given to several roles is loaded once (`loaded` keeps them for the next call)."""
    task = get_task(task_name)
    if set(models) != set(task.roles):
        raise ValueError(f"{task_name}: roles {', '.join(task.roles)}, given {', '.join(models) or 'none'}")
    loaded = Loaded() if loaded is None else loaded
    named = {role: loaded[path] for role, path in models.items()}
    first = next(iter(named.values()))
    client = LocalOpenAI(*first, temperature=temperature, named=named)
    team = {role: SimpleNamespace(openai=client, model=role) for role in task.roles}
    torch.manual_seed(seed)
    started = time.monotonic()
    per_item = run_workflows(client, task.workflow, task.dataset(seed, n), episode=lambda: team)
    seconds = time.monotonic() - started
    rows = []
    for role in task.roles:
        row = score_row(f"{task_name} ({role})", temperature, [float(r[role]) for r in per_item], client.calls, seconds)
        rows.append({**row, "role": role, "model": str(models[role])})
    return rows


__all__ = [
    "TeamPlan",
    "checkpoint_owner",
    "evaluate_team",
    "is_team_run",
    "team_checkpoints",
    "team_mixes",
    "team_plan",
]
