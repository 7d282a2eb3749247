"""Sub-CLIs mounted under `swarm` from entry points, so `swarm` imports none of them by name.

    # pyproject.toml
    [project.entry-points."roost.cli"]
    sched = "scheduler.cli:app"      # -> swarm sched ...
    db = "store.cli:app"             # -> swarm db ...

    mount_plugins(app)               # swarm/cli.py's full_app(), after the built-in commands

Each entry point names a `typer.Typer`; it is mounted under the entry point's
name with the help text the sub-app declares itself. The dependency points from
the installed distribution's metadata to the packages, not from `swarm` to
`scheduler`/`store`, and another package can add a command the same way.

A plugin that fails to load (a missing dependency on a client-only machine, say)
does not take `swarm` down: it is mounted as a command that reports the error
when run. A plugin whose name a built-in command already uses is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points

import typer
from typer.main import get_command_name

GROUP = "roost.cli"
log = logging.getLogger("swarm.plugins")


def _taken(app: typer.Typer) -> set[str]:
    """Names of the commands and groups already on `app`."""
    names = {info.name for info in app.registered_groups if info.name}
    for info in app.registered_commands:
        if info.name:
            names.add(info.name)
        elif info.callback is not None:
            names.add(get_command_name(info.callback.__name__))
    return names


def _unavailable(app: typer.Typer, name: str, error: str) -> None:
    """Mount `name` as a command that explains why the plugin is missing and exits 1."""

    def report() -> None:
        typer.echo(f"swarm {name}: unavailable ({error})", err=True)
        raise typer.Exit(1)

    app.command(
        name,
        help=f"(unavailable: {error})",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    )(report)


def mount_plugins(app: typer.Typer, plugins: Iterable[EntryPoint] | None = None) -> list[str]:
    """Mount every `roost.cli` entry point (or `plugins`) on `app`, by name; returns the names mounted.

    Mounted in name order so `swarm --help` lists them the same way on every install.
    """
    found = entry_points(group=GROUP) if plugins is None else plugins
    taken = _taken(app)
    mounted: list[str] = []
    for ep in sorted(found, key=lambda e: e.name):
        if ep.name in taken:
            log.warning("plugin %r (%s) skipped: swarm already has a command of that name", ep.name, ep.value)
            continue
        try:
            sub = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available here"
            _unavailable(app, ep.name, f"{type(exc).__name__}: {exc}")
        else:
            if not isinstance(sub, typer.Typer):
                _unavailable(app, ep.name, f"{ep.value} is not a typer.Typer")
            else:
                app.add_typer(sub, name=ep.name)  # help: the sub-app's own (callback or Typer(help=...))
        taken.add(ep.name)
        mounted.append(ep.name)
    return mounted


def needs_plugins(app: typer.Typer, argv: list[str]) -> bool:
    """Whether `argv` may reach a plugin: not when its command is a built-in one.

    `swarm serve|client|train ...` then skip importing every plugin (the store's alone pulls in
    SQLAlchemy and Alembic: ~0.4 s of each server's and client's start).
    """
    command = next((a for a in argv if not a.startswith("-")), None)
    return command is None or command not in _taken(app)
