"""`researcher`: plan, run and report RL studies autonomously.

    researcher study "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"
    researcher study "..." --approve          # stops before launching; then: researcher approve ID
    researcher study "..." --dry-run          # print the plan, launch nothing
    researcher status [ID] | resume ID | report ID [--html | --open] | stop ID
    researcher daemon                         # drive every active study from scheduler ticks

Planner: `llm` when ROOST_LLM_BASE_URL and ROOST_LLM_MODEL are set (key:
ROOST_LLM_API_KEY), otherwise `rules`. Everything lives under ROOST_HOME.

Expected failures (an unreachable LLM endpoint, a planner answer still invalid
after its retries, a topic the planner cannot express, a budget too small for the
design, a malformed duration) print one line and a hint and exit 1 (2 for a bad
option); `researcher --debug ...` shows the traceback instead.

The commands need the `research` extra (LangGraph, LangChain, APScheduler, SciPy), which
`pip install 'roost[server]'` does not bring. So this module imports only what the
options need (the StudyConfig fields): `researcher --help` and `researcher study --help`
work without the extra, and each command first checks for it (`cli_errors.require_research`) and
says in one line what to install, exit 1, before importing the study machinery inside.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import ValidationError
from rich.markup import escape

try:  # the options' models need numpy (researcher.analysis), which a client-only install lacks
    from researcher.cli_options import (
        CliOptions,
        config_field,
        deadline_param,
        duration,
        options_of,
        parse_deadline,
        setting,
        usage_error,
    )
    from researcher.config import (
        SHARED_BASE_PARALLEL,
        Adaptive,
        Budget,
        StudyConfig,
        default_trial_program,
        format_duration,
        parse_duration,
    )
    from researcher.experiment import MIN_QUESTION, MIN_SEEDS
    from researcher.planning import PlanDefaults
except ModuleNotFoundError as exc:  # `pip install roost` alone: one line naming the extra, as `swarm serve` does
    if exc.name is None or exc.name.partition(".")[0] in ("researcher", "swarm", "store", "scheduler"):
        raise  # one of ours missing is a bug, not an install without the extra
    raise SystemExit(f"researcher needs {exc.name}: pip install 'roost[research]'") from None
from researcher.cli_errors import expected_errors, fail, hints, require_research
from researcher.cli_inspect import daemon, known_study, report, status, stop
from researcher.cli_output import Progress, console, finish, print_plan
from researcher.interrupted import CREATING, DRIVING, Again, mark, said_when_interrupted
from store.help_text import unwrap_help
from store.options_anywhere import ParameterSource, options_anywhere
from store.paths import default_model_dir
from store.unreachable import run_app
from swarm.children import signals_interrupt
from swarm.client.cli import load_object

if TYPE_CHECKING:
    from researcher.plan_steps import FirstRound

app = typer.Typer(
    cls=options_anywhere(flags=("--verbose", "-v", "--debug")),  # `researcher status 3 --debug` too
    help="Plan, run and report RL studies autonomously. --verbose and --debug go before or after the command.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log progress"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks of expected errors"),
) -> None:
    """Autonomous RL research on top of the swarm."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if not debug:  # alembic's plugin and context lines, ~15 per command; store.schema says a migration itself
        logging.getLogger("alembic").setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    ctx.obj = CliOptions(debug=debug)


# ---------------------------------------------------------------- commands


def _plan(cfg: StudyConfig) -> FirstRound:
    """The first round's plan, by the graph's own planning steps, fitted to the trial budget.

    Asked before any study exists (a dry run, a pre-check), so an unreachable LLM fails within
    seconds here; inside a study the planner waits an endpoint out (ROOST_LLM_WAIT_S).
    """
    from researcher.plan_steps import first_round  # lazy: research extra (checked by require_research)
    from researcher.runner import make_planner  # lazy: research extra (checked by require_research)

    p = make_planner(cfg)
    policy = getattr(p, "policy", None)
    if policy is not None:
        policy.wait_s = min(policy.wait_s, 10.0)
    return first_round(p, cfg)


@app.command()
@said_when_interrupted
@expected_errors
def study(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="the research question, in words"),
    max_trials: int = setting(
        "budget.max_trials",
        "--max-trials",
        rich_help_panel="budget",
        show_default="no limit",
        help="launch at most this many trials (a design is shrunk to fit, or refused)",
    ),
    cpu_hours: float = setting(
        "budget.cpu_hours",
        "--cpu-hours",
        rich_help_panel="budget",
        show_default="no limit",
        help="CPU-hour budget (trial wall time × CPUs)",
    ),
    gpu_hours: float = setting(
        "budget.gpu_hours", "--gpu-hours", rich_help_panel="budget", show_default="no limit", help="GPU-hour budget"
    ),
    wall_clock: str = setting(
        "budget.wall_clock_s",
        "--wall-clock",
        rich_help_panel="budget",
        text=format_duration,
        callback=duration,
        show_default="no limit",
        help="wall-clock budget, e.g. 20m, 6h, 2d",
    ),
    llm_tokens: int = setting(
        "budget.llm_tokens",
        "--llm-tokens",
        rich_help_panel="budget",
        show_default="no limit",
        help="planner token budget",
    ),
    deadline: str = typer.Option(
        None,
        "--deadline",
        rich_help_panel="budget",
        callback=deadline_param,
        show_default="none",
        help="no launches after this (ISO time or duration)",
    ),
    planner: str = typer.Option(
        None, "--planner", rich_help_panel="design", show_default="llm if configured, else rules", help="llm | rules"
    ),
    seeds: int = setting(
        "defaults.seeds", "--seeds", rich_help_panel="design", help=f"seeds per arm (at least {MIN_SEEDS})"
    ),
    steps: int = setting("defaults.steps", "--steps", rich_help_panel="design"),
    shared_base: bool = setting("shared_base", "--shared-base", rich_help_panel="design", show_default="off"),
    rounds: int = setting("adaptive.rounds", "--rounds", rich_help_panel="design"),
    max_seeds: int = setting(
        "adaptive.max_seeds", "--max-seeds", rich_help_panel="design", show_default="twice --seeds"
    ),
    spending: str = setting(
        "adaptive.spending", "--spending", rich_help_panel="design", help="obrien-fleming | pocock: alpha spending"
    ),
    precision: float = setting("adaptive.precision", "--precision", rich_help_panel="design", show_default="none"),
    early_stop: bool = setting("adaptive.early_stop", "--early-stop", rich_help_panel="design", show_default="off"),
    deterministic: bool = setting(
        "deterministic",
        "--deterministic/--no-deterministic",
        rich_help_panel="design",
        show_default="on for swarm train trials",
        help="reproducible trials (same config and seed, same run): seed-matched arms get the paired t-test",
    ),
    backend: str = setting("backend", "--backend", rich_help_panel="running", help="local | slurm"),
    parallel: int = setting("parallel", "--parallel", rich_help_panel="running"),
    approve: bool = setting("approve", "--approve", rich_help_panel="running", show_default="off"),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        rich_help_panel="running",
        show_default="off",
        help="print the plan; launch nothing",
    ),
    foreground: bool = typer.Option(
        True,
        "--foreground/--background",
        rich_help_panel="running",
        help="drive the study here until it ends, or leave it to `researcher daemon`",
    ),
    model: str = typer.Option(
        None,
        "--model",
        rich_help_panel="design",
        show_default="the embedded model",
        help="model directory for every trial",
    ),
    workflow: str = typer.Option(
        None,
        "--workflow",
        rich_help_panel="design",
        show_default="the task's built-in workflow",
        help="your own agent for every trial: module:function(task, episode) -> reward "
        "(the current directory is importable)",
    ),
    dataset: str = typer.Option(
        None,
        "--dataset",
        rich_help_panel="design",
        show_default="the task's, else a `dataset` beside the workflow",
        help="module:function(seed, size) -> tasks, with --workflow",
    ),
    trial_time_limit: str = setting(
        "trial_time_limit_s", "--trial-time-limit", rich_help_panel="running", text=format_duration, callback=duration
    ),
    trial_cpus: int = setting("trial_cpus", "--trial-cpus", rich_help_panel="running"),
    trial_gpus: int = setting("trial_gpus", "--trial-gpus", rich_help_panel="running"),
    partition: str = setting(
        "partition", "--partition", rich_help_panel="running", show_default="the cluster's default"
    ),
    poll: float = setting("poll_s", "--poll", rich_help_panel="running"),
    out: Path = typer.Option(
        None,
        "--out",
        rich_help_panel="running",
        show_default="./studies/study-N",
        file_okay=False,
        help="folder for the study's HTML report (report.html), beside ROOST_HOME's copy; `resume` keeps it",
    ),
    trial_program: str = typer.Option(
        None,
        "--trial-program",
        envvar="ROOST_TRIAL_PROGRAM",
        hidden=True,
        help="command run per trial instead of `python -m swarm train`",
    ),
) -> None:
    """Plan a study of TOPIC, run its trials, analyse them and write a report."""
    require_research()
    from researcher import daemon as study_daemon  # lazy: research extra (checked above)
    from researcher.llm import llm_settings  # lazy: research extra (checked above)
    from researcher.llm_planner import LLMPlanner  # lazy: research extra (checked above)
    from researcher.plan_steps import check_program  # lazy: research extra (checked above)
    from researcher.report import planner_description  # lazy: research extra (checked above)
    from researcher.runner import create_study, load_config  # lazy: research extra (checked above)
    from scheduler.daemon import running_daemon  # lazy: as below
    from scheduler.manager import default_backends  # lazy: the store's SQLAlchemy models, on use only
    from store.schema import init_db  # lazy: as above

    if len(topic.strip()) < MIN_QUESTION:  # the rules planner's "no knob in the topic" (a page) says too little
        raise typer.BadParameter(
            f"{'it is empty' if not topic.strip() else f'{topic.strip()!r} is not a question'}: say what to study, "
            'e.g. "Does lr 3e-4 beat 1e-4 on arith?"',
            param_hint="TOPIC",
        )
    chosen = planner or ("llm" if llm_settings() else "rules")
    if chosen not in ("llm", "rules"):
        raise typer.BadParameter("llm or rules", param_hint="--planner")
    if backend not in default_backends():
        raise typer.BadParameter(" or ".join(default_backends()), param_hint="--backend")
    if chosen == "llm" and llm_settings() is None:
        raise typer.BadParameter("no LLM configured (ROOST_LLM_BASE_URL, ROOST_LLM_MODEL)", param_hint="--planner")
    llm = llm_settings() or {}
    if chosen == "llm" and not llm.get("base_url", "https://").startswith(("http://", "https://")):
        # said now, not after three retries of a connection that cannot be made
        raise typer.BadParameter(f"{llm['base_url']!r} is not an http(s) URL", param_hint="ROOST_LLM_BASE_URL")
    if workflow:  # fail now, not in every trial's log; a `dataset` beside the workflow is its dataset
        load_object(workflow)
        module = workflow.partition(":")[0]
        if dataset is None and callable(getattr(sys.modules.get(module), "dataset", None)):
            dataset = f"{module}:dataset"
        if dataset:
            load_object(dataset)
    time_limit = parse_duration(trial_time_limit)
    named = _topic_counts(topic)
    steps = _topic_or_flag(ctx, "steps", steps, named)
    seeds = _topic_or_flag(ctx, "seeds", seeds, named)
    try:
        cfg = StudyConfig(
            topic=topic,
            planner=chosen,
            backend=backend,
            defaults=PlanDefaults(seeds=seeds, steps=steps),
            approve=approve,
            shared_base=shared_base,
            deterministic=deterministic,
            adaptive=Adaptive(
                rounds=rounds, max_seeds=max_seeds, spending=spending, precision=precision, early_stop=early_stop
            ),
            # policies of one server: every trial of a round at once, unless --parallel says otherwise
            parallel=parallel
            if not shared_base or ctx.get_parameter_source("parallel") == ParameterSource.COMMANDLINE
            else max(parallel, SHARED_BASE_PARALLEL),
            budget=Budget(
                max_trials=max_trials,
                cpu_hours=cpu_hours,
                gpu_hours=gpu_hours,
                wall_clock_s=parse_duration(wall_clock),
                llm_tokens=llm_tokens,
                deadline=parse_deadline(deadline),
            ),
            trial_program=shlex.split(trial_program) if trial_program else default_trial_program(),
            # 0 became the default hour in silence (`if time_limit`); it is refused as 0.5 is
            trial_time_limit_s=config_field("trial_time_limit_s").default if time_limit is None else int(time_limit),
            poll_s=poll,
            model_dir=_model_dir(model),
            report_out=str(out.resolve()) if out is not None else None,
            trial_cpus=trial_cpus,
            trial_gpus=trial_gpus,
            partition=partition,
            workflow=workflow,
            dataset=dataset,
            trial_env={"PYTHONPATH": os.pathsep.join(filter(None, (os.getcwd(), os.environ.get("PYTHONPATH"))))}
            if workflow
            else {},
            llm_base_url=llm.get("base_url"),
            llm_model=llm.get("model"),
        )
    except ValidationError as e:
        raise usage_error(e) from None
    if cfg.planner == "llm":
        cfg.prompt_versions = LLMPlanner.prompt_versions()
    if dry_run:
        plan = _plan(cfg)
        print_plan(cfg, plan)
        try:
            check_program(cfg, plan.design)
        except ValueError as e:  # shown with the plan, and the exit says so: a script checking a design reads 1
            console.print(f"[bold red]This design cannot run yet:[/] {escape(str(e))}")
            console.print("[dim]dry run: nothing launched[/]")
            raise typer.Exit(1) from None
        console.print("[dim]dry run: nothing launched[/]")
        return
    if cfg.planner == "rules":  # deterministic and free: refuse a topic or budget before creating anything
        first = _plan(cfg)
        if first.note:
            console.print(f"[yellow]{escape(first.note)}[/]")
        if cfg.shared_base:  # what one server's policies cannot vary: refused before anything starts
            try:
                check_program(cfg, first.design)
            except ValueError as e:
                raise typer.BadParameter(str(e).removeprefix("--shared-base: "), param_hint="--shared-base") from None
    if cfg.uses_swarm_train and cfg.model_dir is None:
        from swarm.model.recipe import matches  # lazy: the research extra's command; no torch

        embedded = default_model_dir()
        if not matches(embedded, seed=0):  # built already: its marker says so, without importing torch (~3 s)
            from swarm.model.build import init_model  # lazy: a build imports torch and transformers

            console.print("[dim]building the embedded model (once, takes a few minutes)…[/]")
            embedded = init_model(embedded)
        cfg.model_dir = str(embedded)
    mark(ctx, CREATING)
    sid = create_study(cfg, on_created=lambda created: mark(ctx, created), report_home=Path.cwd())
    study_dir = load_config(init_db(), sid).study_dir  # chosen by create_study (ROOST_HOME/studies/study-N)
    console.print(
        f"[bold]Study {sid}[/] (planner: {escape(planner_description(cfg))}; {cfg.backend} backend): {study_dir}"
    )
    if not foreground:
        study_daemon.register()
        console.print(f"Left to the daemon (`researcher daemon`); follow with: researcher status {sid}")
        if running_daemon() is None:
            console.print("[yellow]no researcher daemon runs on this machine[/]: start one with `researcher daemon`")
        return
    mark(ctx, DRIVING)
    _drive_here(sid, options_of(ctx), out=out)


def _topic_counts(topic: str) -> dict[str, int]:
    """The steps and seeds the question names ("over 100 steps"), or a usage error naming the clash."""
    from researcher.planning import UnsupportedTopic  # lazy: research extra (checked by the caller)
    from researcher.topic import topic_counts  # lazy: as above

    try:
        return topic_counts(topic)
    except UnsupportedTopic as e:
        raise typer.BadParameter(str(e), param_hint="TOPIC") from None


def _model_dir(model: str | None) -> str | None:
    """--model as an absolute path to a model directory, checked now: a relative one meant nothing to a
    daemon started elsewhere, and a wrong one failed every trial (exit 2) while the study "completed"."""
    if model is None:
        return None
    path = Path(model).expanduser()
    if not path.exists():
        raise typer.BadParameter(f"{model} does not exist", param_hint="--model")
    if not (path / "config.json").is_file():
        raise typer.BadParameter(
            f"{model} is not a Hugging Face model directory (no config.json)", param_hint="--model"
        )
    return str(path.resolve())


def _topic_or_flag(ctx: typer.Context, name: str, value: int, named: dict[str, int]) -> int:
    """The count the question names unless the command line names another, which is refused: a study of
    "over 100 steps" that ran 40 would answer another question than the one asked."""
    if name not in named:
        return value
    if name == "seeds" and named[name] < MIN_SEEDS:
        raise typer.BadParameter(
            f"the topic names {named[name]} seeds; a study runs at least {MIN_SEEDS} per arm", param_hint="TOPIC"
        )
    if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE and value != named[name]:
        raise typer.BadParameter(
            f"the topic says {named[name]} {name} and --{name} says {value}; drop one", param_hint=f"--{name}"
        )
    return named[name]


def _drive_here(study_id: int, opts: CliOptions, resume: object = None, out: Path | None = None) -> None:
    from researcher.llm import LLMUnreachable  # lazy: research extra (the caller checked it)
    from researcher.runner import drive, make_context  # lazy: research extra (the caller checked it)
    from store.models import StudyStatus  # lazy: with the runner

    try:
        with signals_interrupt():  # SIGTERM, SIGHUP: the interrupted line and exit 130, as Ctrl-C (they killed it mute)
            with Progress() as progress:
                step = drive(study_id, resume=resume, on_step=progress, on_node=progress.node)
            finish(study_id, step, out)
    except KeyboardInterrupt:
        console.print(
            f"\n[yellow]interrupted[/]: running trials go on; continue with "
            f"`researcher resume {study_id}` or stop them with `researcher stop {study_id}`"
        )
        raise typer.Exit(130) from None
    except LLMUnreachable as e:
        # FAILED: the daemon leaves it alone instead of retrying every tick; `resume` re-activates it
        make_context(study_id).set_study_status(StudyStatus.FAILED)
        if opts.debug:
            raise
        raise fail(str(e), f"{hints()[LLMUnreachable]}; then continue with: researcher resume {study_id}") from None


@app.command()
@said_when_interrupted
@expected_errors
def approve(
    ctx: typer.Context,
    study_id: int = typer.Argument(...),
    reject: bool = typer.Option(False, "--reject", help="reject the plan: the study stops"),
    foreground: bool = typer.Option(
        True, "--foreground/--background", help="drive the study here, or leave it to the daemon"
    ),
) -> None:
    """Approve (or reject) the plan of a study waiting at --approve, and continue it."""
    mark(ctx, Again(study_id, approving=True))  # an interrupt from here: it still waits
    require_research()
    from researcher.runner import advance  # lazy: research extra (checked above)
    from store.models import StudyStatus  # lazy: with the runner

    status = known_study(study_id)
    if status != StudyStatus.PAUSED.value:  # only a plan waiting at --approve takes an answer
        from researcher.runner import load_config  # lazy: as above
        from store.schema import init_db  # lazy: as above

        asks = status == StudyStatus.ACTIVE.value and load_config(init_db(), study_id).approve
        raise fail(
            f"study {study_id} is not waiting for approval: it is {status}"
            + (", its plan not made yet (the daemon's next tick, or `researcher resume`, makes it)" if asks else ""),
            f"a study started with --approve waits for one; see it with: researcher status {study_id}",
        )
    answer = {"approved": not reject}
    mark(ctx, DRIVING)  # from here the drive (or the daemon's advance) takes the answer
    if foreground:
        _drive_here(study_id, options_of(ctx), resume=answer)
    else:
        step = advance(study_id, resume=answer)
        console.print(f"study {study_id}: {step.state}")


@app.command()
@said_when_interrupted
@expected_errors
def resume(
    ctx: typer.Context,
    study_id: int = typer.Argument(...),
    foreground: bool = typer.Option(
        True, "--foreground/--background", help="drive the study here, or leave it to the daemon"
    ),
) -> None:
    """Continue a study after a crash or restart: running trials are reconciled, never resubmitted."""
    mark(ctx, Again(study_id))  # an interrupt from here: the study is as it was
    require_research()
    from researcher.runner import advance, make_context  # lazy: research extra (checked above)
    from store.models import StudyStatus  # lazy: with the runner

    known_study(study_id)
    study_ctx = make_context(study_id)
    status = study_ctx.study().status
    if status in (StudyStatus.COMPLETED.value, StudyStatus.CANCELLED.value):  # as `stop` and `approve` say it
        raise fail(
            f"study {study_id} has ended ({status}): nothing to resume", f"its report: researcher report {study_id}"
        )
    if status == StudyStatus.FAILED.value:
        study_ctx.set_study_status(StudyStatus.ACTIVE)
    mark(ctx, DRIVING)
    if foreground:
        _drive_here(study_id, options_of(ctx))
    else:
        console.print(f"study {study_id}: {advance(study_id, ctx=study_ctx).state}")


for command in (status, report, stop, daemon):  # after approve and resume, in --help's order
    app.command()(command)


unwrap_help(app)  # every command's help wraps to the terminal (store/help_text.py)


def main() -> None:
    run_app(app, debug="--debug" in sys.argv[1:])
