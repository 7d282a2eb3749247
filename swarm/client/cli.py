"""`swarm client`: run an agent fleet against a swarm server.

    swarm client --url http://127.0.0.1:8000 --token $TOKEN --task arith --n 8 --concurrency 8
    swarm client --workflow my_agent:play --dataset my_agent:problems --max-episodes 512

A built-in `--task` brings its dataset and workflow; `--workflow module:function`
brings your own (its dataset from `--dataset module:function(seed, size)`, the
task's dataset if `--task` is also given, or a `dataset` function beside the
workflow). Every option but `--config`, `--fresh` and `--quiet` is a field of
`FleetConfig` (swarm/config/fleet.py). Registered by `swarm/cli.py`.
Never imports torch.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from swarm.children import signals_interrupt
from swarm.client import FleetStats, SwarmClient, SwarmError, TeamClient, run_fleet
from swarm.client._cursor import JobCursor, default_state_path
from swarm.config.fleet import FleetConfig
from swarm.config.options import build_config, config_options
from swarm.folder_lock import FolderInUse, hold_folder
from swarm.tasks import get_task
from swarm.user_code import load


def load_object(spec: str) -> Any:
    """`package.module:attr.sub` -> the object (a usage error saying what is wrong, not a traceback)."""
    obj, problem = load(spec)
    if problem is not None:
        raise typer.BadParameter(problem)
    return obj


def _resolve(
    task: str | None, workflow: str | None, dataset: str | None, seed: int, size: int
) -> tuple[Callable, list[dict], str]:
    builtin = None
    if task:
        try:
            builtin = get_task(task)
        except KeyError as exc:
            raise typer.BadParameter(str(exc.args[0]), param_hint="--task") from None
    if workflow:
        flow = load_object(workflow)
    elif builtin is not None:
        flow = builtin.workflow
    else:
        raise typer.BadParameter("give --task NAME or --workflow module:function")
    if dataset:
        make = load_object(dataset)
    elif builtin is not None:
        make = builtin.dataset
    else:
        make = getattr(sys.modules[workflow.partition(":")[0]], "dataset", None) if workflow else None
        if make is None:
            raise typer.BadParameter("no dataset: give --dataset module:function or --task NAME")
    family = builtin.family if builtin is not None else "default"
    return flow, list(make(seed, size)), family


def _client(cfg: FleetConfig, url: str, token: str) -> SwarmClient | TeamClient:
    """One client for the fleet's policy, or with `--team` one per role, each for the policy of its name."""
    kw: dict[str, Any] = {"max_retries": cfg.retries, "max_backoff_s": 5.0, "reconnect_s": cfg.reconnect_s or None}
    if cfg.team:
        # ROLE (the policy of that name on --url) or ROLE=URL (the server of that role: `swarm train --team`)
        members = [r.strip().partition("=") for r in cfg.team.split(",") if r.strip()]
        roles = [role.strip() for role, _, _ in members]
        if len(set(roles)) != len(roles) or not roles or not all(roles):
            raise typer.BadParameter(f"name each role once: {cfg.team!r}", param_hint="--team")
        return TeamClient(
            {role.strip(): SwarmClient(at.strip() or url, token, model=role.strip(), **kw) for role, _, at in members}
        )
    return SwarmClient(url, token, model=cfg.policy, **kw)


@config_options(FleetConfig)
def client_command(
    overrides: dict[str, Any],
    config_file: Path = typer.Option(
        None,
        "--config",
        help="YAML/JSON file of FleetConfig fields; flags given on the command line (or by envvar) override it",
    ),
    fresh: bool = typer.Option(False, "--fresh", help="ignore (and overwrite) the saved cursor: start over"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Run a workflow over a dataset against a swarm server, each task n times."""
    cfg: FleetConfig = build_config(FleetConfig, overrides, config_file)
    url, token, workflow, task, dataset, n = cfg.url, cfg.token, cfg.workflow, cfg.task, cfg.dataset, cfg.n
    seed, epochs, max_episodes, state = cfg.seed, cfg.epochs, cfg.max_episodes, cfg.state
    if not token:
        raise typer.BadParameter("a worker token is required (--token or ROOST_TOKEN)", param_hint="--token")
    flow, items, family = _resolve(task, workflow, dataset, seed, cfg.dataset_size)
    console = Console(stderr=True)
    state = state or default_state_path(url, workflow or f"task:{task}", seed, dataset or task, cfg.policy)
    with _hold_cursor(state):  # one fleet per cursor; released at the end, or at an exception's exit
        if fresh:
            state.unlink(missing_ok=True)
        cursor = JobCursor(len(items), n, epochs, state, meta={"url": url, "workflow": workflow or task, "seed": seed})
        if cursor.next or cursor.replay:
            console.print(
                f"resuming at job {cursor.next} ({len(cursor.replay)} unfinished job(s) re-played first); "
                f"cursor {state}"
            )
        with (
            signals_interrupt(),  # SIGTERM and SIGHUP as Ctrl-C: the fleet stops and gives its open episodes back
            _client(cfg, url, token) as client,
        ):
            try:
                status = client.status()  # fail fast on a wrong URL or token
            except SwarmError as exc:
                console.print(f"[red]cannot use {url}[/red]: {exc}")
                raise typer.Exit(1) from None
            if cfg.choices > 1 and status.group_size != 1:  # its groups were k choices x group-size episodes
                console.print(
                    f"[red]--choices {cfg.choices}[/red] samples a task's group in one call, so the server's "
                    f"group size must be 1; this one's is {status.group_size} (swarm serve --group-size 1, or "
                    "leave --choices out)"
                )
                raise typer.Exit(2)
            if status.group_size != n:
                console.print(
                    f"[yellow]note[/yellow]: the server's group size is {status.group_size}; "
                    f"this fleet sends each task {n} times"
                )
            total = max_episodes or (len(items) * n * epochs if epochs else None)
            with _progress(console, total, quiet) as progress:
                stats = run_fleet(
                    client,
                    flow,
                    items,
                    n=n,
                    concurrency=cfg.concurrency,
                    epochs=epochs,
                    progress=progress,
                    max_episodes=max_episodes,
                    max_attempts=cfg.max_attempts,
                    task_family=family,
                    cursor=cursor,
                    choices=cfg.choices,
                    ordered=cfg.deterministic,
                    failure_streak=cfg.failure_streak,
                )
        console.print(
            f"{stats.finished} finished, {stats.failed} failed, {stats.aborted} aborted, "
            f"{stats.lost} lost and re-played, "
            f"reward mean {stats.reward_mean:.3f}, {stats.elapsed:.1f}s, stopped by {stats.stopped_by}"
        )
        for err in stats.errors[-3:]:
            console.print(f"  [red]error[/red] {err}")
        if stats.stopped_by in ("unreachable", "unauthorized", "refused"):
            raise typer.Exit(1)
        if stats.stopped_by == "failing":
            console.print(
                f"[red]stopped[/red]: the workflow failed {stats.failing_streak} times in a row, no episode "
                "finished between them (its first failure of each kind is above, with its traceback); "
                "--failure-streak 0 never stops"
            )
            raise typer.Exit(3)


def _hold_cursor(state: Path) -> IO[str]:
    """The cursor file for this fleet alone: two fleets on one would hand out the same jobs (the same
    tasks, twice) and write over each other's pending set. Exit 2, naming the other one, when in use."""
    try:
        return hold_folder(state.parent, state.name + ".lock", "swarm client")
    except FolderInUse as exc:
        typer.echo(
            f"swarm client: the cursor {state} is in use by {exc.holder}, which plays the same tasks from "
            "it: give this fleet another --seed (other tasks) or --state PATH",
            err=True,
        )
        raise typer.Exit(2) from None


@contextmanager
def _progress(console: Any, total: int | None, quiet: bool) -> Iterator[Callable[[FleetStats], None]]:
    """A rich progress bar, and the `progress` callback that updates it (from fleet threads)."""
    columns = [
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}" if total else "{task.completed}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, disable=quiet) as bar:
        tid = bar.add_task("starting", total=total)
        shown = 0  # of stats.first_of_kind
        printing = threading.Lock()  # fleet threads call update side by side

        def update(s: FleetStats) -> None:
            nonlocal shown
            bar.update(
                tid,
                completed=s.finished + s.given_up,
                description=f"v{s.policy_version} ok {s.finished} failed {s.failed} reward {s.reward_mean:.3f}",
            )
            with printing:
                new = s.first_of_kind[shown:]  # counted as printed, not as listed: one may be added meanwhile
                for text in new:  # at once, above the bar (with --quiet too: it is no progress)
                    console.print(f"[yellow]{escape(text)}[/yellow]", soft_wrap=True)
                shown += len(new)

        yield update
