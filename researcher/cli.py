"""`researcher`: plan, run and report RL studies autonomously.

    researcher study "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"
    researcher study "..." --approve          # stops before launching; then: researcher approve ID
    researcher study "..." --dry-run          # print the plan, launch nothing
    researcher status [ID] | resume ID | report ID | stop ID
    researcher daemon                         # drive every active study from scheduler ticks

Planner: `llm` when ROOST_LLM_BASE_URL and ROOST_LLM_MODEL are set (key:
ROOST_LLM_API_KEY), otherwise `rules`. Everything lives under ROOST_HOME.

Expected failures (an unreachable LLM endpoint, a planner answer still invalid
after its retries, a topic the planner cannot express, a budget too small for the
design, a malformed duration) print one line and a hint and exit 1 (2 for a bad
option); `researcher --debug ...` shows the traceback instead.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlmodel import Session, select

from researcher import daemon as study_daemon
from researcher.config import Budget, StudyConfig, default_trial_program, parse_duration
from researcher.experiment import MIN_SEEDS, Design, Frame, HypothesisSpec, swarm_train_flags
from researcher.graph import build_graph
from researcher.llm import BudgetExceeded, LLMUnreachable, StructuredOutputError, llm_settings
from researcher.llm_planner import LLMPlanner
from researcher.planning import BudgetTooSmall, PlanDefaults, UnsupportedTopic, fit_to_budget
from researcher.report import planner_description, render
from researcher.runner import (Step, advance, checkpointer, create_study, drive, make_context, make_planner,
                               stop_study, store_engine)
from scheduler import daemon as scheduler_daemon
from scheduler.manager import default_backends
from store.models import Study, StudyStatus, Trial
from store.paths import default_model_dir
from swarm.client.cli import load_object

app = typer.Typer(help="Plan, run and report RL studies autonomously.", no_args_is_help=True,
                  add_completion=False)
console = Console()
err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

HINTS: dict[type[Exception], str] = {
    LLMUnreachable: "check that the endpoint is up and ROOST_LLM_BASE_URL / ROOST_LLM_MODEL / "
                    "ROOST_LLM_API_KEY are right, or use --planner rules",
    StructuredOutputError: "try a stronger model (ROOST_LLM_MODEL), or --planner rules",
    UnsupportedTopic: "name one of these knobs and the values to compare, or use the LLM planner, which "
                      "can use every knob (--planner llm; set ROOST_LLM_BASE_URL and ROOST_LLM_MODEL)",
    BudgetTooSmall: "raise --max-trials (or leave it out), or name fewer values to compare",
    BudgetExceeded: "raise --llm-tokens",
}


class _Options:
    debug = False


def fail(message: str, hint: str | None = None, code: int = 1) -> typer.Exit:
    """Print one clear error (and a hint); the caller raises what this returns."""
    first, _, rest = message.partition("\n")
    err.print(f"[bold red]error:[/] {escape(first)}")
    if rest:
        err.print(escape(rest), highlight=False)
    if hint:
        err.print(f"[yellow]hint:[/] {escape(hint)}")
    return typer.Exit(code)


def expected_errors(fn: F) -> F:
    """Known failures become `fail(...)`; anything else (or --debug) keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except tuple(HINTS) as e:
            if _Options.debug:
                raise
            raise fail(str(e), HINTS[type(e)]) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="log progress"),
          debug: bool = typer.Option(False, "--debug", help="show tracebacks of expected errors")) -> None:
    """Autonomous RL research on top of the swarm."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    _Options.debug = debug


# ---------------------------------------------------------------- option parsing


def _duration(value: str | None) -> str | None:
    """Typer callback: a malformed duration is a usage error naming the option, not a traceback."""
    try:
        parse_duration(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return value


def _deadline_param(value: str | None) -> str | None:
    if value:
        try:
            _deadline(value)
        except ValueError:
            raise typer.BadParameter(f"not a time or a duration: {value!r} (use e.g. "
                                     "2030-01-31T18:00, 90m, 6h)") from None
    return value


def _deadline(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text)
        return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    except ValueError:
        secs = parse_duration(text)
        assert secs is not None
        return datetime.now(UTC) + timedelta(seconds=secs)


# ---------------------------------------------------------------- output


def _print_plan(cfg: StudyConfig, frame: Frame, hyp: HypothesisSpec, design: Design, note: str) -> None:
    console.print(f"[bold]Planner:[/] {escape(planner_description(cfg))}")
    console.print(f"[bold]Question:[/] {escape(frame.question)}")
    console.print(f"[bold]Task:[/] {frame.task}   [bold]Metric:[/] {frame.metric} ({frame.metric_description()})")
    console.print(f"[bold]Hypothesis:[/] {escape(hyp.statement)} (direction: {hyp.direction})")
    t = Table("arm", "knobs", "seeds", "steps", title=f"Design (baseline: {escape(design.baseline)})")
    for a in design.arms:
        t.add_row(escape(a.name), escape(json.dumps({**design.common, **a.knobs})), escape(str(design.seeds)),
                  str(design.steps))
    console.print(t)
    console.print(f"{len(design.trial_configs())} trials")
    if note:
        console.print(f"[yellow]{escape(note)}[/]")


_last_shown: list[str] = []


def _on_step(step: Step) -> None:
    """Print progress when it changes (not on every poll)."""
    if step.state == "waiting" and step.detail.get("running") is not None:
        line = f"trials running {step.detail.get('running')}, pending {step.detail.get('pending')}"
        if _last_shown[-1:] != [line]:
            _last_shown.append(line)
            console.print(f"[dim]{datetime.now().strftime('%H:%M:%S')} {line}[/]")


def _finish(study_id: int, step: Step) -> None:
    if step.state == "approval":
        d = step.detail
        console.print(f"[bold yellow]Study {study_id} awaits approval[/] of round {d.get('round', 0) + 1} "
                      f"({d.get('planner', '?')} planner): {escape(str(d.get('hypothesis')))}")
        for a in d.get("design", {}).get("arms", []):
            console.print(f"  arm {escape(a['name'])}: {escape(str(a['knobs']))} × seeds {d['design']['seeds']}")
        if d.get("note"):
            console.print(f"  [yellow]{escape(d['note'])}[/]")
        console.print(f"Approve with: researcher approve {study_id}   (or: researcher stop {study_id})")
    elif step.state in ("done", "inactive"):
        _show_report_path(study_id)


def _show_report_path(study_id: int) -> None:
    ctx = make_context(study_id)
    study = ctx.study()
    console.print(f"[bold green]Study {study_id} {study.status.lower()}[/]; "
                  f"report: {ctx.cfg.study_dir}/report/report.md")
    if study.report:
        for line in study.report.splitlines():
            if line.startswith("- Round") or line.startswith("- **"):
                console.print(escape(line))


# ---------------------------------------------------------------- commands


def _plan(cfg: StudyConfig) -> tuple[Frame, HypothesisSpec, Design, str]:
    """The first round's plan as the study would make it, fitted to the trial budget.

    Asked before any study exists (a dry run, a pre-check), so an unreachable LLM fails within
    seconds here; inside a study the planner waits an endpoint out (ROOST_LLM_WAIT_S).
    """
    p = make_planner(cfg)
    policy = getattr(p, "policy", None)
    if policy is not None:
        policy.wait_s = min(policy.wait_s, 10.0)
    frame = p.frame(cfg.topic, cfg.defaults)
    hyp = p.hypothesize(cfg.topic, frame, [])
    if hyp is None:
        raise UnsupportedTopic(f"the {p.name} planner has no hypothesis for this topic")
    design, note = fit_to_budget(p.design(frame, hyp, cfg.defaults), cfg.budget.max_trials)
    return frame, hyp, design, note


@app.command()
@expected_errors
def study(
    topic: str = typer.Argument(..., help="the research question, in words"),
    max_trials: int = typer.Option(None, "--max-trials", min=1, show_default="no limit",
                                   help="launch at most this many trials (a design is shrunk to fit, or refused)"),
    cpu_hours: float = typer.Option(None, "--cpu-hours", show_default="no limit",
                                    help="CPU-hour budget (trial wall time × CPUs)"),
    gpu_hours: float = typer.Option(None, "--gpu-hours", show_default="no limit", help="GPU-hour budget"),
    wall_clock: str = typer.Option(None, "--wall-clock", callback=_duration, show_default="no limit",
                                   help="wall-clock budget, e.g. 20m, 6h, 2d"),
    llm_tokens: int = typer.Option(None, "--llm-tokens", min=1, show_default="no limit",
                                   help="planner token budget"),
    deadline: str = typer.Option(None, "--deadline", callback=_deadline_param, show_default="none",
                                 help="no launches after this (ISO time or duration)"),
    backend: str = typer.Option("local", "--backend", help="local | slurm"),
    planner: str = typer.Option(None, "--planner", show_default="llm if configured, else rules",
                                help="llm | rules"),
    seeds: int = typer.Option(MIN_SEEDS, "--seeds", min=MIN_SEEDS, help=f"seeds per arm (at least {MIN_SEEDS})"),
    steps: int = typer.Option(PlanDefaults().steps, "--steps", min=1, help="training steps per trial"),
    parallel: int = typer.Option(2, "--parallel", min=1, help="trials running at once"),
    approve: bool = typer.Option(False, "--approve", show_default="off", help="pause for approval before launching"),
    dry_run: bool = typer.Option(False, "--dry-run", show_default="off", help="print the plan; launch nothing"),
    foreground: bool = typer.Option(True, "--foreground/--background",
                                    help="drive the study here until it ends, or leave it to `researcher daemon`"),
    model: str = typer.Option(None, "--model", show_default="the embedded model",
                              help="model directory for every trial"),
    workflow: str = typer.Option(None, "--workflow", show_default="the task's built-in workflow",
                                 help="your own agent for every trial: module:function(task, episode) -> reward "
                                      "(the current directory is importable)"),
    dataset: str = typer.Option(None, "--dataset", show_default="the task's, else a `dataset` beside the workflow",
                                help="module:function(seed, size) -> tasks, with --workflow"),
    trial_time_limit: str = typer.Option("1h", "--trial-time-limit", callback=_duration,
                                         help="per-trial time limit"),
    trial_cpus: int = typer.Option(1, "--trial-cpus", min=1, help="CPUs per trial job"),
    trial_gpus: int = typer.Option(0, "--trial-gpus", min=0, help="GPUs per trial job (Slurm)"),
    partition: str = typer.Option(None, "--partition", show_default="the cluster's default",
                                  help="Slurm partition for trial jobs"),
    poll: float = typer.Option(5.0, "--poll", help="seconds between checks in the foreground"),
    trial_program: str = typer.Option(None, "--trial-program", envvar="ROOST_TRIAL_PROGRAM", hidden=True,
                                      help="command run per trial instead of `python -m swarm train`"),
) -> None:
    """Plan a study of TOPIC, run its trials, analyse them and write a report."""
    chosen = planner or ("llm" if llm_settings() else "rules")
    if chosen not in ("llm", "rules"):
        raise typer.BadParameter("llm or rules", param_hint="--planner")
    if backend not in default_backends():
        raise typer.BadParameter(" or ".join(default_backends()), param_hint="--backend")
    if chosen == "llm" and llm_settings() is None:
        raise typer.BadParameter("no LLM configured (ROOST_LLM_BASE_URL, ROOST_LLM_MODEL)", param_hint="--planner")
    llm = llm_settings() or {}
    if workflow:  # fail now, not in every trial's log; a `dataset` beside the workflow is its dataset
        load_object(workflow)
        module = workflow.partition(":")[0]
        if dataset is None and callable(getattr(sys.modules.get(module), "dataset", None)):
            dataset = f"{module}:dataset"
        if dataset:
            load_object(dataset)
    defaults = PlanDefaults(seeds=seeds, steps=steps)
    cfg = StudyConfig(
        topic=topic, planner=chosen, backend=backend, defaults=defaults, approve=approve, parallel=parallel,
        budget=Budget(max_trials=max_trials, cpu_hours=cpu_hours, gpu_hours=gpu_hours,
                      wall_clock_s=parse_duration(wall_clock), llm_tokens=llm_tokens, deadline=_deadline(deadline)),
        trial_program=shlex.split(trial_program) if trial_program else default_trial_program(),
        trial_time_limit_s=int(parse_duration(trial_time_limit) or 3600), poll_s=poll, model_dir=model,
        trial_cpus=trial_cpus, trial_gpus=trial_gpus, partition=partition, workflow=workflow, dataset=dataset,
        trial_env={"PYTHONPATH": os.pathsep.join(filter(None, (os.getcwd(), os.environ.get("PYTHONPATH"))))}
        if workflow else {},
        llm_base_url=llm.get("base_url"), llm_model=llm.get("model"))
    if cfg.planner == "llm":
        cfg.prompt_versions = LLMPlanner.prompt_versions()
    if dry_run:
        frame, hyp, design, note = _plan(cfg)
        _print_plan(cfg, frame, hyp, design, note)
        if cfg.uses_swarm_train:
            try:
                design.check_program(swarm_train_flags())
            except ValueError as e:
                console.print(f"[bold red]This design cannot run yet:[/] {escape(str(e))}")
        console.print("[dim]dry run: nothing launched[/]")
        return
    if cfg.planner == "rules":  # deterministic and free: refuse a topic or budget before creating anything
        _, _, _, note = _plan(cfg)
        if note:
            console.print(f"[yellow]{escape(note)}[/]")
    if cfg.uses_swarm_train and cfg.model_dir is None:
        from swarm.model.build import init_model  # lazy: imports torch and transformers

        console.print("[dim]checking the embedded model (built once, takes a few minutes)…[/]")
        cfg.model_dir = str(init_model(default_model_dir()))
    sid = create_study(cfg)
    console.print(f"[bold]Study {sid}[/] (planner: {escape(planner_description(cfg))}; {cfg.backend} backend): "
                  f"{cfg.study_dir or ''}")
    if not foreground:
        study_daemon.register()
        console.print(f"Left to the daemon (`researcher daemon`); follow with: researcher status {sid}")
        return
    _drive_here(sid)


def _drive_here(study_id: int, resume: object = None) -> None:
    try:
        _finish(study_id, drive(study_id, resume=resume, on_step=_on_step))
    except KeyboardInterrupt:
        console.print(f"\n[yellow]interrupted[/]: running trials go on; continue with "
                      f"`researcher resume {study_id}` or stop them with `researcher stop {study_id}`")
        raise typer.Exit(130) from None
    except LLMUnreachable as e:
        # FAILED: the daemon leaves it alone instead of retrying every tick; `resume` re-activates it
        make_context(study_id).set_study_status(StudyStatus.FAILED)
        if _Options.debug:
            raise
        raise fail(str(e), f"{HINTS[LLMUnreachable]}; then continue with: researcher resume {study_id}") from None


@app.command()
@expected_errors
def approve(study_id: int = typer.Argument(...),
            reject: bool = typer.Option(False, "--reject", help="reject the plan: the study stops"),
            foreground: bool = typer.Option(True, "--foreground/--background",
                                            help="drive the study here, or leave it to the daemon")) -> None:
    """Approve (or reject) the plan of a study waiting at --approve, and continue it."""
    answer = {"approved": not reject}
    if foreground:
        _drive_here(study_id, resume=answer)
    else:
        step = advance(study_id, resume=answer)
        console.print(f"study {study_id}: {step.state}")


@app.command()
@expected_errors
def resume(study_id: int = typer.Argument(...),
           foreground: bool = typer.Option(True, "--foreground/--background",
                                           help="drive the study here, or leave it to the daemon")) -> None:
    """Continue a study after a crash or restart: running trials are reconciled, never resubmitted."""
    ctx = make_context(study_id)
    if ctx.study().status == StudyStatus.FAILED.value:
        ctx.set_study_status(StudyStatus.ACTIVE)
    if foreground:
        _drive_here(study_id)
    else:
        console.print(f"study {study_id}: {advance(study_id, ctx=ctx).state}")


@app.command()
def status(study_id: int = typer.Argument(None, show_default="every study")) -> None:
    """List studies, or show one study's trials."""
    engine = store_engine()
    with Session(engine) as s:
        if study_id is None:
            t = Table("id", "status", "trials", "question", title="Studies")
            for st in s.exec(select(Study).order_by(Study.id)).all():  # type: ignore[arg-type]
                n = len(s.exec(select(Trial).where(Trial.study_id == st.id)).all())
                t.add_row(str(st.id), st.status, str(n), escape(st.question[:80]))
            console.print(t)
            return
        st = s.get(Study, study_id)
        if st is None:
            raise typer.BadParameter(f"no study {study_id}")
        console.print(f"[bold]Study {st.id}[/] {st.status}: {escape(st.question)}")
        t = Table("trial", "arm", "seed", "status", "job", "MLflow run")
        for tr in s.exec(select(Trial).where(Trial.study_id == study_id).order_by(Trial.id)).all():  # type: ignore[arg-type]
            t.add_row(str(tr.id), escape(tr.arm), str(tr.seed), tr.status, str(tr.config.get("job_id", "–")),
                      tr.mlflow_run_id or "–")
        console.print(t)


@app.command()
def report(study_id: int = typer.Argument(...)) -> None:
    """Print the study's report (for an unfinished study: what it has so far)."""
    ctx = make_context(study_id)
    st = ctx.study()
    if st.report:
        typer.echo(st.report)
        return
    with checkpointer(ctx.engine) as saver:
        snap = build_graph(ctx).compile(checkpointer=saver).get_state(
            {"configurable": {"thread_id": str(study_id)}})
    typer.echo(render(ctx, dict(snap.values or {}), Path(ctx.cfg.study_dir) / "report"))


@app.command()
def stop(study_id: int = typer.Argument(...)) -> None:
    """Cancel a study's running trials and write a report of what completed."""
    path = stop_study(study_id)
    console.print(f"study {study_id} stopped; report: {path}")


@app.command()
def daemon(interval: float = typer.Option(30.0, "--interval", help="seconds between study ticks")) -> None:
    """Run the scheduler daemon with the researcher's tick: every active study advances."""
    study_daemon.register(interval)
    console.print(f"researcher tick every {interval:g} s; Ctrl-C stops")
    scheduler_daemon.run_daemon()


def main() -> None:
    app()
