"""`swarm sched ...`: the scheduler's command line (also `python -m scheduler.cli ...`).

    swarm sched daemon                                  # foreground; SIGTERM/Ctrl-C stop it
    swarm sched submit --backend slurm --time-limit 600 train python train.py --lr 3e-4
    swarm sched status                                  # recent jobs (refreshed from the backends)
    swarm sched cancel 12 13        |  swarm sched cancel --group trial-7
    swarm sched logs 12 --stderr --tail 4000 --follow

Options come before the job name: everything after the name is the job's command.
The database is `--db`, else env ROOST_DATABASE_URL, else SQLite in the data dir.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import click
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand

from scheduler.spec import JobSpec
from store.help_text import unwrap_help
from store.unreachable import run_app

app = typer.Typer(
    help="Jobs on local processes or Slurm: submit, status, cancel, logs, daemon.",
    no_args_is_help=True,
    add_completion=False,
)

DbOption = typer.Option(None, "--db", help="database URL [default: ROOST_DATABASE_URL or the data dir]")


def _manager(db: str | None):  # noqa: ANN202 - typer-facing helper
    from scheduler.manager import JobManager  # lazy: the store's SQLAlchemy (~1.5 s) only for commands, not --help
    from scheduler.records import StoreSink  # lazy: as above

    return JobManager(StoreSink(db))


def _row(r) -> dict:  # noqa: ANN001
    return {
        "id": r.id,
        "name": r.name,
        "backend": r.backend,
        "external_id": r.external_id,
        "state": r.state.value,
        "exit_code": r.exit_code,
        "reason": r.reason,
        "group_key": r.group_key,
        "started_at": r.started_at.isoformat() if r.started_at else None,
        "finished_at": r.finished_at.isoformat() if r.finished_at else None,
        "stdout": r.stdout_path,
        "stderr": r.stderr_path,
    }


def _spec_error(e: ValidationError) -> str:
    """A JobSpec's refusal as the command line names it (the name's regex is no message for a person)."""
    parts = []
    for err in e.errors():
        where = str(err["loc"][0]) if err["loc"] else "job"
        if where == "name":
            parts.append(f"NAME {err['input']!r}: 1 to 100 letters, digits, _ . or -, beginning with a letter or digit")
        else:
            parts.append(f"{'--' + where.replace('_', '-')}: {str(err['msg']).removeprefix('Value error, ')}")
    return "; ".join(parts)


def _known(mgr, job_id: int):  # noqa: ANN001, ANN202 - typer-facing helper
    """The job's record, or a usage error naming the id (a KeyError's traceback before)."""
    rec = mgr.get(job_id)
    if rec is None:
        raise typer.BadParameter(f"no job {job_id} (`swarm sched status` lists the recent ones)", param_hint="JOB_ID")
    return rec


@app.command()
def daemon(
    db: str = DbOption,
    interval: float = typer.Option(5.0, "--interval", min=0.1, help="seconds between reconciliations"),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning"),
) -> None:
    """Run the scheduler daemon in the foreground (reconcile jobs, run registered ticks)."""
    from scheduler.daemon import DaemonAlreadyRunning, run_daemon  # lazy: APScheduler + SQLAlchemy, not for --help

    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if log_level.lower() != "debug":  # one line per run every few seconds is noise
        logging.getLogger("apscheduler.executors.default").setLevel(logging.WARNING)
    try:
        run_daemon(db, interval)
    except DaemonAlreadyRunning as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


class _CommandAfterDashes(TyperCommand):
    """`submit NAME [OPTIONS] -- COMMAND...`: with `--`, options go anywhere before it and everything after
    it is the command; without `--`, the command starts at the first word after NAME (so its own
    options, like `bash -c`, stay its own)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.allow_interspersed_args = "--" in args
        return super().parse_args(ctx, args)


@app.command(cls=_CommandAfterDashes)
def submit(
    name: str = typer.Argument(..., help="job name (letters, digits, _ . -)"),
    command: list[str] = typer.Argument(
        ...,
        help="the command to run: everything after `--` (then options "
        "may go anywhere before it), else everything after NAME",
    ),
    backend: str = typer.Option("local", "--backend", "-b", help="local | slurm"),
    time_limit: int = typer.Option(3600, "--time-limit", "-t", min=1, help="seconds"),
    cpus: int = typer.Option(1, "--cpus", min=1),
    mem_mb: int = typer.Option(None, "--mem-mb", min=1),
    gpus: int = typer.Option(0, "--gpus", min=0),
    nodes: int = typer.Option(1, "--nodes", min=1),
    partition: str = typer.Option(None, "--partition", "-p"),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE (repeatable)"),
    cwd: str = typer.Option(None, "--cwd"),
    log_dir: str = typer.Option(None, "--log-dir"),
    group: str = typer.Option(None, "--group", help="group key (cancelled together)"),
    wait: bool = typer.Option(False, "--wait", help="wait until the job ends; exit with its code"),
    db: str = DbOption,
) -> None:
    """Submit a command as a job; prints its id."""
    pairs = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--env")
        pairs[key] = value
    from scheduler.manager import default_backends  # lazy: as _manager

    if backend not in default_backends():
        raise typer.BadParameter(
            f"{backend!r}: not a backend; {' or '.join(default_backends())}", param_hint="--backend"
        )
    try:
        spec = JobSpec(
            name=name,
            command=command,
            env=pairs,
            cwd=cwd,
            time_limit_s=time_limit,
            cpus=cpus,
            mem_mb=mem_mb,
            gpus=gpus,
            nodes=nodes,
            partition=partition,
            log_dir=log_dir,
        )
    except ValidationError as e:
        raise typer.BadParameter(_spec_error(e)) from None
    mgr = _manager(db)
    rec = mgr.submit(spec, backend=backend, group_key=group)
    typer.echo(rec.id)
    if wait:
        rec = mgr.wait([rec.id], timeout_s=time_limit + 600, poll_s=1.0)[0]
        typer.echo(f"{rec.state.value} exit_code={rec.exit_code}", err=True)
        raise typer.Exit(rec.exit_code if rec.exit_code is not None else (0 if rec.state == "COMPLETED" else 1))


@app.command()
def status(
    job_ids: list[int] = typer.Argument(None, help="job ids [default: recent jobs]"),
    limit: int = typer.Option(20, "--limit", "-n", help="how many recent jobs"),
    refresh: bool = typer.Option(True, "--refresh/--no-refresh", help="ask the backends first"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per line"),
    db: str = DbOption,
) -> None:
    """Show jobs and their states."""
    mgr = _manager(db)
    for i in job_ids or []:
        _known(mgr, i)
    if refresh:
        mgr.reconcile(job_ids or None)
    recs = [mgr.get(i) for i in job_ids] if job_ids else mgr.sink.recent(limit)
    recs = [r for r in recs if r is not None]
    if as_json:
        for r in recs:
            typer.echo(json.dumps(_row(r)))
        return
    if not recs:  # an empty table says less than this
        typer.echo("No jobs yet; submit one with: swarm sched submit NAME -- COMMAND...")
        return
    table = Table("id", "name", "backend", "ext id", "state", "exit", "group", "reason")
    colours = {
        "COMPLETED": "green",
        "RUNNING": "cyan",
        "PENDING": "yellow",
        "FAILED": "red",
        "TIMEOUT": "red",
        "CANCELLED": "magenta",
    }
    for r in recs:
        st = r.state.value
        table.add_row(
            str(r.id),
            r.name,
            r.backend,
            r.external_id or "-",
            f"[{colours.get(st, 'white')}]{st}[/]",
            "" if r.exit_code is None else str(r.exit_code),
            r.group_key or "",
            (r.reason or "")[:60],
        )
    Console().print(table)


@app.command()
def cancel(
    job_ids: list[int] = typer.Argument(None, help="job ids"),
    group: str = typer.Option(None, "--group", help="cancel every job of this group"),
    force: bool = typer.Option(False, "--force", help="kill at once (no grace period)"),
    db: str = DbOption,
) -> None:
    """Cancel jobs (SIGTERM, SIGKILL after a grace; Slurm: scancel)."""
    if not job_ids and not group:
        raise typer.BadParameter("give job ids or --group")
    mgr = _manager(db)
    for i in job_ids or []:
        _known(mgr, i)  # every id checked before any job is cancelled
    recs = [mgr.cancel(i, force=force) for i in job_ids or []]
    if group:
        recs += mgr.cancel_group(group, force=force)
    for r in recs:
        typer.echo(f"{r.id} {r.state.value}")


@app.command()
def logs(
    job_id: int = typer.Argument(...),
    stderr: bool = typer.Option(False, "--stderr", help="stderr instead of stdout"),
    tail: int = typer.Option(None, "--tail", help="only the last N bytes"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends"),
    db: str = DbOption,
) -> None:
    """Print a job's output."""
    mgr = _manager(db)
    _known(mgr, job_id)
    stream = "stderr" if stderr else "stdout"
    text = mgr.logs(job_id, stream, tail)
    sys.stdout.write(text)
    if not follow:
        return
    shown = len(mgr.logs(job_id, stream).encode())
    while True:
        mgr.reconcile([job_id])
        done = mgr.get(job_id).terminal  # type: ignore[union-attr]
        full = mgr.logs(job_id, stream).encode()
        sys.stdout.write(full[shown:].decode(errors="replace"))
        sys.stdout.flush()
        shown = len(full)
        if done:
            return
        time.sleep(1.0)


@app.command()
def ticks(db: str = DbOption) -> None:
    """List the periodic ticks registered with the daemon."""
    from scheduler.daemon import list_ticks  # lazy: APScheduler + SQLAlchemy, not for --help

    for t in list_ticks(db_url=db):
        typer.echo(f"{t['name']}\t{t['func']}\tevery {t['interval_s']:g} s\tnext {t['next_run_time']}")


unwrap_help(app)  # every command's help wraps to the terminal (store/help_text.py)


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
