"""What `researcher study`, `resume` and `approve` say when interrupted before they drive a study.

Ctrl-C, a SIGTERM (a scheduler's cancel, `kill`) or a SIGHUP (the terminal closed) in the seconds a
study takes to import, plan and create itself ended the process mute (-15 for SIGTERM), and the user
could not tell whether a study had been made that a `researcher resume` should go on with. Each is said
now, with exit 130, naming what exists: nothing yet, perhaps a study (interrupted inside its creation),
or study N, not yet driven. `resume` and `approve`, interrupted while they load (Ctrl-C printed a
traceback), say that the study is as it was (`Again`). Once driven (`DRIVING`),
`researcher.cli._drive_here` says its own line; a `--background` command's one step in place, this
module's.

An interrupt is not always let through at once: during the LLM planner's request LangChain waits, as
it unwinds, for its worker thread's HTTP read (up to `ROOST_LLM_TIMEOUT_S`, two minutes). Before the
study is driven nothing is half done that an exit could spoil (the study's creation is one commit,
and the next drive starts its MLflow run if it has none), so after `GRACE_S` the line is said and the
process ends there.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import typer

from researcher.cli_output import console
from swarm.children import signals_interrupt

F = TypeVar("F", bound=Callable[..., Any])

#: the key of `ctx.meta` under which the command notes how far it got
STAGE = "researcher.study.stage"
#: the stage while `create_study` runs: its commit may or may not have happened
CREATING = "creating"
#: the study is being driven: `_drive_here` handles an interrupt (and waits for what it must)
DRIVING = "driving"
#: seconds an interrupt before the drive is given to unwind before the process ends
GRACE_S = 5.0


class Again(NamedTuple):
    """`resume` or `approve` of an existing study, before they drive it."""

    study_id: int
    approving: bool = False


Stage = str | int | Again | None


def mark(ctx: typer.Context, stage: Stage) -> None:
    """Note how far the command got: `CREATING`, the id of the study it created, `Again(id)`, `DRIVING`."""
    ctx.meta[STAGE] = stage


def interrupted_line(stage: Stage) -> str:
    """The line said for an interrupt at `stage` (None: before the study was being created)."""
    if isinstance(stage, Again):
        sid = stage.study_id
        if stage.approving:
            return f"[yellow]interrupted[/]: study {sid} still waits for approval (`researcher approve {sid}`)"
        return (
            f"[yellow]interrupted[/] before study {sid} was driven: it is as it was (running trials go on); "
            f"`researcher resume {sid}` drives it"
        )
    if stage == DRIVING:  # a foreground drive says its own line; this is the daemon's step run in place
        return (
            "[yellow]interrupted[/]: `researcher status ID` shows where the study stands, "
            "`researcher resume ID` goes on"
        )
    if stage is None:
        return "[yellow]interrupted[/] before the study was created: nothing was started"
    if stage == CREATING:
        return (
            "[yellow]interrupted[/] while the study was being created: `researcher status` lists it if it was; "
            "`researcher resume ID` then runs it, `researcher stop ID` ends it"
        )
    return (
        f"[yellow]interrupted[/]: study {stage} was created and nothing of it started yet; "
        f"run it with `researcher resume {stage}` or end it with `researcher stop {stage}`"
    )


class _Said:
    """The line, said once: by the unwound command, or by the grace timer if unwinding takes longer."""

    def __init__(self, ctx: typer.Context | None) -> None:
        self.ctx, self.lock, self.done = ctx, threading.Lock(), False

    def stage(self) -> Stage:
        return self.ctx.meta.get(STAGE) if self.ctx is not None else None

    def say(self) -> None:
        with self.lock:
            if not self.done:
                self.done = True
                console.print("\n" + interrupted_line(self.stage()))

    def arm(self) -> None:
        """An interrupt came: unless the drive handles it, end the process if it has not in `GRACE_S`."""
        if self.stage() != DRIVING:
            timer = threading.Timer(GRACE_S, self.force)
            timer.daemon = True
            timer.start()

    def force(self) -> None:
        self.say()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)


def said_when_interrupted(fn: F) -> F:
    """Run the command with SIGTERM and SIGHUP taken as Ctrl-C; an interrupt before the study is driven
    is said (`interrupted_line`) and ends the process with 130, as a shell's Ctrl-C does.

    The command takes the invocation's `ctx: typer.Context` (typer passes parameters by name) and marks
    its stage as it goes (`mark`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        said = _Said(kwargs.get("ctx"))
        try:
            with signals_interrupt(first=said.arm):
                return fn(*args, **kwargs)
        except KeyboardInterrupt:
            said.say()
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


__all__ = ["CREATING", "DRIVING", "Again", "Stage", "GRACE_S", "interrupted_line", "mark", "said_when_interrupted"]
