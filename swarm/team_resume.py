"""`swarm train --team ... --resume`: where each role of an earlier team run stands, read from its folder.

Why a module of its own: a resume must be refused before anything starts when the folder holds no
team run, another team, or a team that already has its steps, and the run then counts each role on
from the step its server will really resume from. Both come from the folder alone: run.yaml's `team`
(what ran) and each role's latest checkpoint (`checkpoints/latest` of the server's out folder, or of
`policies/ROLE/` when roles share a base). The metrics rows are not that count: a server that
resumes moves the rows after its checkpoint to `metrics.lost.jsonl` and trains those steps again,
so the checkpoint's step is where each role's metrics go on from. swarm/team_run.py parses and
resolves the teams (it owns `--team`'s syntax) and hands them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from swarm.run_checks import RUN_FILE
from swarm.server.checkpoint import Checkpointer

#: each server's out folder, under the run's
SERVERS = "servers"


@dataclass(frozen=True)
class Member:
    """One server of the team: the roles it trains, on one base model."""

    name: str  # its folder and log name: the role, or the roles joined by "+" when they share the base
    model: Path
    roles: tuple[str, ...]

    @property
    def shared(self) -> bool:
        return len(self.roles) > 1


def role_dir(out: Path, member: Member, role: str) -> Path:
    """A role's own folder (metrics, checkpoints, buffer): its server's, or its policy's on a shared base."""
    folder = out / SERVERS / member.name
    return folder / "policies" / role if member.shared else folder


def recorded_team(out: Path) -> str | None:
    """run.yaml's `team` (the --team text the run was started with); None when the folder's run was no
    team (or run.yaml is missing or unreadable)."""
    try:
        data = yaml.safe_load((out / RUN_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return None
    team = data.get("team") if isinstance(data, dict) else None
    return team if isinstance(team, str) and team else None


def checkpoint_step(folder: Path) -> int:
    """The step of the checkpoint a server resumes `folder` from; 0 without one (it starts from its model)."""
    checkpointer = Checkpointer(folder / "checkpoints")
    latest = checkpointer.latest()
    if latest is None:
        return 0
    try:
        return int(checkpointer.read_state(latest)["step"])
    except (OSError, ValueError, KeyError):
        return 0


def role_steps(out: Path, members: list[Member]) -> dict[str, int]:
    """Each role's step in the team run in `out`: its latest checkpoint's, where its server resumes it from."""
    return {role: checkpoint_step(role_dir(out, m, role)) for m in members for role in m.roles}


def resume_problems(out: Path, recorded: str | None, matches: bool, done: dict[str, int], steps: int) -> list[str]:
    """Why `--resume` cannot continue the team run in `out`: one line each, refused as a single run's resume
    of the wrong folder is (swarm/run_checks.py: resume what is there, --fresh, or another --out).
    `recorded`: run.yaml's team (None: no team run there); `matches`: whether the team given is that one
    (the same roles, in the same order, on the same models); `done`: each role's checkpoint step."""
    if recorded is None:
        return [
            f"--resume: {out} holds no --team run (its {RUN_FILE} names no team): resume it without --team, "
            "--fresh to replace it, or choose another --out"
        ]
    if not matches:
        return [
            f"--resume: the run in {out} is the team {recorded}, not this one: resume it with that --team "
            "(or none: run.yaml's), --fresh to replace it, or choose another --out"
        ]
    if done and all(n >= steps for n in done.values()):
        at = ", ".join(f"{role} {n}" for role, n in done.items())
        return [f"--steps: the team run in {out} already has {steps} steps per role ({at}); ask for more with --steps"]
    return []


__all__ = ["SERVERS", "Member", "checkpoint_step", "recorded_team", "resume_problems", "role_dir", "role_steps"]
