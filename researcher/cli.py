"""`researcher`: plan, run and report RL studies autonomously.

    researcher study "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"
    researcher study "..." --approve          # stops before launching; then: researcher approve ID
    researcher study "..." --dry-run          # print the plan, launch nothing
    researcher status [ID] | resume ID | report ID | stop ID
    researcher daemon                         # drive every active study from scheduler ticks

Planner: `llm` when ROOST_LLM_BASE_URL and ROOST_LLM_MODEL are set (key:
ROOST_LLM_API_KEY), otherwise `rules`. Everything lives under ROOST_HOME.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from datetime import UTC, datetime, timedelta

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Plan, run and report RL studies autonomously.", no_args_is_help=True,
                  add_completion=False)
console = Console()


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="log progress")) -> None:
    """Autonomous RL research on top of the swarm."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def _deadline(text: str | None) -> datetime | None:
    if not text:
        return None
    from researcher.config import parse_duration

    try:
        dt = datetime.fromisoformat(text)
        return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    except ValueError:
        secs = parse_duration(text)
        assert secs is not None
        return datetime.now(UTC) + timedelta(seconds=secs)


def _print_plan(frame: object, hyp: object, design: object) -> None:
    from researcher.experiment import Design, Frame, HypothesisSpec

    assert isinstance(frame, Frame) and isinstance(hyp, HypothesisSpec) and isinstance(design, Design)
    console.print(f"[bold]Question:[/] {frame.question}")
    console.print(f"[bold]Task:[/] {frame.task}   [bold]Metric:[/] {frame.metric} ({frame.metric_description()})")
    console.print(f"[bold]Hypothesis:[/] {hyp.statement} (direction: {hyp.direction})")
    t = Table("arm", "knobs", "seeds", "steps", title=f"Design (baseline: {design.baseline})")
    for a in design.arms:
        t.add_row(a.name, json.dumps({**design.common, **a.knobs}), str(design.seeds), str(design.steps))
    console.print(t)
    console.print(f"{len(design.trial_configs())} trials")


_last_shown: list[str] = []


def _on_step(step: object) -> None:
    """Print progress when it changes (not on every poll)."""
    from researcher.runner import Step

    assert isinstance(step, Step)
    if step.state == "waiting" and step.detail.get("running") is not None:
        line = f"trials running {step.detail.get('running')}, pending {step.detail.get('pending')}"
        if _last_shown[-1:] != [line]:
            _last_shown.append(line)
            console.print(f"[dim]{datetime.now().strftime('%H:%M:%S')} {line}[/]")


def _finish(study_id: int, step: object) -> None:
    from researcher.runner import Step

    assert isinstance(step, Step)
    if step.state == "approval":
        d = step.detail
        console.print(f"[bold yellow]Study {study_id} awaits approval[/] of round {d.get('round', 0) + 1}: "
                      f"{d.get('hypothesis')}")
        for a in d.get("design", {}).get("arms", []):
            console.print(f"  arm {a['name']}: {a['knobs']} × seeds {d['design']['seeds']}")
        console.print(f"Approve with: researcher approve {study_id}   (or: researcher stop {study_id})")
    elif step.state in ("done", "inactive"):
        _show_report_path(study_id)


def _show_report_path(study_id: int) -> None:
    from researcher.runner import make_context

    ctx = make_context(study_id)
    study = ctx.study()
    console.print(f"[bold green]Study {study_id} {study.status.lower()}[/]; "
                  f"report: {ctx.cfg.study_dir}/report/report.md")
    if study.report:
        for line in study.report.splitlines():
            if line.startswith("- Round") or line.startswith("- **"):
                console.print(line)


@app.command()
def study(
    topic: str = typer.Argument(..., help="the research question, in words"),
    max_trials: int = typer.Option(None, "--max-trials", min=1, help="launch at most this many trials"),
    cpu_hours: float = typer.Option(None, "--cpu-hours", help="CPU-hour budget (trial wall time × CPUs)"),
    gpu_hours: float = typer.Option(None, "--gpu-hours", help="GPU-hour budget"),
    wall_clock: str = typer.Option(None, "--wall-clock", help="wall-clock budget, e.g. 20m, 6h, 2d"),
    llm_tokens: int = typer.Option(None, "--llm-tokens", min=1, help="planner token budget"),
    deadline: str = typer.Option(None, "--deadline", help="no launches after this (ISO time or duration)"),
    backend: str = typer.Option("local", "--backend", help="local | slurm"),
    planner: str = typer.Option(None, "--planner", help="llm | rules [default: llm if configured]"),
    seeds: int = typer.Option(3, "--seeds", min=3, help="seeds per arm (at least 3)"),
    steps: int = typer.Option(None, "--steps", min=1, help="training steps per trial [default: 40]"),
    parallel: int = typer.Option(2, "--parallel", min=1, help="trials running at once"),
    approve: bool = typer.Option(False, "--approve", help="pause for approval before launching"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan; launch nothing"),
    foreground: bool = typer.Option(True, "--foreground/--background",
                                    help="drive the study here until it ends [default], or leave it "
                                         "to `researcher daemon`"),
    model: str = typer.Option(None, "--model", help="model directory for every trial [default: embedded]"),
    trial_time_limit: str = typer.Option("1h", "--trial-time-limit", help="per-trial time limit"),
    trial_cpus: int = typer.Option(1, "--trial-cpus", min=1, help="CPUs per trial job"),
    trial_gpus: int = typer.Option(0, "--trial-gpus", min=0, help="GPUs per trial job (Slurm)"),
    partition: str = typer.Option(None, "--partition", help="Slurm partition for trial jobs"),
    poll: float = typer.Option(5.0, "--poll", help="seconds between checks in the foreground"),
    trial_program: str = typer.Option(None, "--trial-program", envvar="ROOST_TRIAL_PROGRAM", hidden=True,
                                      help="command run per trial instead of `python -m swarm train`"),
) -> None:
    """Plan a study of TOPIC, run its trials, analyse them and write a report."""
    from researcher.config import Budget, StudyConfig, default_trial_program, parse_duration
    from researcher.llm import llm_settings
    from researcher.planning import PlanDefaults

    chosen = planner or ("llm" if llm_settings() else "rules")
    if chosen not in ("llm", "rules"):
        raise typer.BadParameter("llm or rules", param_hint="--planner")
    if backend not in ("local", "slurm"):
        raise typer.BadParameter("local or slurm", param_hint="--backend")
    if chosen == "llm" and llm_settings() is None:
        raise typer.BadParameter("no LLM configured (ROOST_LLM_BASE_URL, ROOST_LLM_MODEL)", param_hint="--planner")
    llm = llm_settings() or {}
    defaults = PlanDefaults(seeds=seeds, **({"steps": steps} if steps else {}))
    cfg = StudyConfig(
        topic=topic, planner=chosen, backend=backend, defaults=defaults, approve=approve, parallel=parallel,
        budget=Budget(max_trials=max_trials, cpu_hours=cpu_hours, gpu_hours=gpu_hours,
                      wall_clock_s=parse_duration(wall_clock), llm_tokens=llm_tokens, deadline=_deadline(deadline)),
        trial_program=shlex.split(trial_program) if trial_program else default_trial_program(),
        trial_time_limit_s=int(parse_duration(trial_time_limit) or 3600), poll_s=poll, model_dir=model,
        trial_cpus=trial_cpus, trial_gpus=trial_gpus, partition=partition,
        llm_base_url=llm.get("base_url"), llm_model=llm.get("model"))
    if dry_run:
        from researcher.runner import make_planner

        p = make_planner(cfg)
        frame = p.frame(topic, defaults)
        hyp = p.hypothesize(topic, frame, [])
        if hyp is None:
            console.print("The planner has no hypothesis for this topic.")
            raise typer.Exit(1)
        design = p.design(frame, hyp, defaults)
        _print_plan(frame, hyp, design)
        if cfg.uses_swarm_train:
            from researcher.experiment import swarm_train_flags

            try:
                design.check_program(swarm_train_flags())
            except ValueError as e:
                console.print(f"[bold red]This design cannot run yet:[/] {e}")
        console.print("[dim]dry run: nothing launched[/]")
        return
    if cfg.uses_swarm_train and cfg.model_dir is None:
        from swarm.model.build import init_model
        from swarm.paths import default_model_dir

        console.print("[dim]checking the embedded model (built once, takes a few minutes)…[/]")
        cfg.model_dir = str(init_model(default_model_dir()))
    if cfg.planner == "llm":
        from researcher.llm_planner import LLMPlanner

        cfg.prompt_versions = LLMPlanner.prompt_versions()
    from researcher.runner import create_study

    sid = create_study(cfg)
    console.print(f"[bold]Study {sid}[/] ({cfg.planner} planner, {cfg.backend} backend): {cfg.study_dir or ''}")
    if not foreground:
        from researcher.daemon import register

        register()
        console.print(f"Left to the daemon (`researcher daemon`); follow with: researcher status {sid}")
        return
    _drive_here(sid)


def _drive_here(study_id: int, resume: object = None) -> None:
    from researcher.runner import drive

    try:
        _finish(study_id, drive(study_id, resume=resume, on_step=_on_step))
    except KeyboardInterrupt:
        console.print(f"\n[yellow]interrupted[/]: running trials go on; continue with "
                      f"`researcher resume {study_id}` or stop them with `researcher stop {study_id}`")
        raise typer.Exit(130) from None


@app.command()
def approve(study_id: int = typer.Argument(...),
            reject: bool = typer.Option(False, "--reject", help="reject the plan: the study stops"),
            foreground: bool = typer.Option(True, "--foreground/--background")) -> None:
    """Approve (or reject) the plan of a study waiting at --approve, and continue it."""
    from researcher.runner import advance

    answer = {"approved": not reject}
    if foreground:
        _drive_here(study_id, resume=answer)
    else:
        step = advance(study_id, resume=answer)
        console.print(f"study {study_id}: {step.state}")


@app.command()
def resume(study_id: int = typer.Argument(...),
           foreground: bool = typer.Option(True, "--foreground/--background")) -> None:
    """Continue a study after a crash or restart: running trials are reconciled, never resubmitted."""
    from researcher.runner import advance, make_context
    from store.models import StudyStatus

    ctx = make_context(study_id)
    if ctx.study().status == StudyStatus.FAILED.value:
        ctx.set_study_status(StudyStatus.ACTIVE)
    if foreground:
        _drive_here(study_id)
    else:
        console.print(f"study {study_id}: {advance(study_id, ctx=ctx).state}")


@app.command()
def status(study_id: int = typer.Argument(None)) -> None:
    """List studies, or show one study's trials."""
    from sqlmodel import Session, select

    from researcher.runner import store_engine
    from store.models import Study, Trial

    engine = store_engine()
    with Session(engine) as s:
        if study_id is None:
            t = Table("id", "status", "trials", "question", title="Studies")
            for st in s.exec(select(Study).order_by(Study.id)).all():  # type: ignore[arg-type]
                n = len(s.exec(select(Trial).where(Trial.study_id == st.id)).all())
                t.add_row(str(st.id), st.status, str(n), st.question[:80])
            console.print(t)
            return
        st = s.get(Study, study_id)
        if st is None:
            raise typer.BadParameter(f"no study {study_id}")
        console.print(f"[bold]Study {st.id}[/] {st.status}: {st.question}")
        t = Table("trial", "arm", "seed", "status", "job", "MLflow run")
        for tr in s.exec(select(Trial).where(Trial.study_id == study_id).order_by(Trial.id)).all():  # type: ignore[arg-type]
            t.add_row(str(tr.id), tr.arm, str(tr.seed), tr.status, str(tr.config.get("job_id", "–")),
                      tr.mlflow_run_id or "–")
        console.print(t)


@app.command()
def report(study_id: int = typer.Argument(...)) -> None:
    """Print the study's report (for an unfinished study: what it has so far)."""
    from pathlib import Path

    from researcher.report import render
    from researcher.runner import checkpointer, make_context

    ctx = make_context(study_id)
    st = ctx.study()
    if st.report:
        typer.echo(st.report)
        return
    from researcher.graph import build_graph

    with checkpointer(ctx.engine) as saver:
        snap = build_graph(ctx).compile(checkpointer=saver).get_state(
            {"configurable": {"thread_id": str(study_id)}})
    typer.echo(render(ctx, dict(snap.values or {}), Path(ctx.cfg.study_dir) / "report"))


@app.command()
def stop(study_id: int = typer.Argument(...)) -> None:
    """Cancel a study's running trials and write a report of what completed."""
    from researcher.runner import stop_study

    path = stop_study(study_id)
    console.print(f"study {study_id} stopped; report: {path}")


@app.command()
def daemon(interval: float = typer.Option(30.0, "--interval", help="seconds between study ticks")) -> None:
    """Run the scheduler daemon with the researcher's tick: every active study advances."""
    from researcher.daemon import register
    from scheduler.daemon import run_daemon

    register(interval)
    console.print(f"researcher tick every {interval:g} s; Ctrl-C stops")
    run_daemon()


def main() -> None:
    app()
