"""`swarm eval`: score a model, a run or a team run on the built-in tasks, in process.

The scoring is swarm/model/evaluate.py's (one model) and swarm/model/team_eval.py's (a team's roles
together); this module reads the flags, picks what to score and prints the table.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from store.paths import default_model_dir
from swarm.children import quiet_progress_bars_off_terminal
from swarm.config.options import require_extra
from swarm.config.run import parse_mix
from swarm.output_paths import require_output, write_output
from swarm.run_layout import RUN_FILE
from swarm.tasks import list_tasks

COLUMNS = ("task", "temperature", "n", "mean_reward", "solved", "calls_per_episode", "seconds")


def run_tasks(path: Path, climb: int = 5) -> list[str]:
    """The built-in tasks the `swarm train` run holding `path` trained on (its run.yaml's `task`, a mix
    split), found in `path` or the folders above it (a checkpoint is OUT/server/checkpoints/step_N);
    [] for a plain model or a run of a workflow of its own."""
    import yaml  # lazy: only a run folder needs it

    for folder in [path, *path.resolve().parents][: climb + 1]:
        if (folder / RUN_FILE).is_file():
            try:
                task = (yaml.safe_load((folder / RUN_FILE).read_text()) or {}).get("task")
            except (OSError, yaml.YAMLError, AttributeError):
                return []
            try:
                return list(parse_mix(task)) if isinstance(task, str) else []
            except ValueError:  # not a built-in task (a workflow's own name): every task
                return []
    return []


def eval_command(
    given: Path = typer.Argument(None, metavar="RUN_OR_MODEL", help="the same as --model", show_default=False),
    model: Path = typer.Option(
        None,
        "--model",
        help="Hugging Face causal-LM directory (a checkpoint too), or a `swarm train` run folder",
        show_default="the embedded model",
    ),
    task: list[str] = typer.Option(
        None, "--task", help="built-in task, repeatable", show_default="a run's own task(s); else every task"
    ),
    n: int = typer.Option(200, "--n", min=1, help="episodes per task and temperature"),
    temperature: list[float] = typer.Option(
        None, "--temperature", "-t", min=0.0, max=2.0, help="repeatable; 0 is greedy", show_default="0 and 1"
    ),
    seed: int = typer.Option(12345, "--seed", help="dataset and sampling seed (held out from training's)"),
    json_out: Path = typer.Option(None, "--json", help="also write the results here"),
    baseline: bool = typer.Option(
        None,
        "--baseline/--no-baseline",
        help="also score the model the run started from, side by side",
        show_default="on for a run folder (its last checkpoint is evaluated)",
    ),
    each_role: bool = typer.Option(
        False,
        "--each-role",
        help="a team run: also score each role trained alone, the other roles at the models they started "
        "from, and with three roles or more each role left initial beside the others trained (whose training "
        "moved the team)",
    ),
) -> None:
    """Score a model on built-in tasks in process (no server): mean reward, greedy and sampled.

    Given a `swarm train` run folder (or one of its checkpoints with --baseline), the trained model is
    scored beside the one it started from, on the run's own task(s): training may sharpen sampling and
    dip greedy.

    A team run's folder (`--task duet --shared-base`, `--team`) is scored on its team task, each role's
    checkpoint playing its part, a row per role; --each-role adds each role trained alone.
    """
    require_output(json_out, "--json")  # before the evaluation: its minutes are not lost to a bad path
    require_extra("server", "torch", "transformers")
    quiet_progress_bars_off_terminal()  # "Loading weights" per model: noise in a log
    from swarm.model.evaluate import Loaded, RunFolderError, comparison_table, evaluate, run_models  # lazy: torch
    from swarm.model.team_eval import team_plan

    if given is not None and model is not None and given != model:
        raise typer.BadParameter(f"two models named: {given} and --model {model}; give one", param_hint="--model")
    where = "RUN_OR_MODEL" if given else "--model"  # what a refusal names: what the user typed
    given = given or model or default_model_dir()
    unknown = [t for t in task or [] if t not in list_tasks()]
    if unknown:
        raise typer.BadParameter(
            f"unknown task {unknown[0]!r}; built-in tasks: {', '.join(list_tasks())}", param_hint="--task"
        )
    try:
        team = team_plan(given, task)
        if team:  # a team run: its roles play the team task together
            _eval_team(team, n, temperature or [0.0, 1.0], seed, baseline is not False, each_role, json_out)
            return
        model, initial = run_models(given)
    except RunFolderError as exc:
        raise typer.BadParameter(str(exc), param_hint=where) from None
    if each_role:
        raise typer.BadParameter(f"{given} is not a team run: it has no roles to score alone", param_hint="--each-role")
    if baseline is None:  # a run folder (resolved to its last checkpoint) compares by itself
        baseline = initial is not None and model != given
    if baseline and initial is None:
        raise typer.BadParameter(
            f"{model} is not a run folder or a run's checkpoint: no initial model to compare with",
            param_hint="--baseline",
        )
    for path in (model, initial) if baseline else (model,):
        if not path.exists():
            raise typer.BadParameter(f"{path} does not exist", param_hint=where)
        if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():  # a LoRA checkpoint
            raise typer.BadParameter(f"{path} is not a Hugging Face model directory (no config.json)", param_hint=where)
    names = task or run_tasks(given) or list_tasks()
    if not task and names != list_tasks():
        Console(stderr=True).print(f"tasks: {', '.join(names)}, the run's own (--task to choose)")
    models = [("initial", initial), ("trained", model)] if baseline else [("evaluated", model)]
    runs = [(role, path, name, t) for role, path in models for name in names for t in (temperature or [0.0, 1.0])]
    loaded = Loaded()

    def score(path: Path, name: str, t: float) -> list[dict]:
        return [{**evaluate(path, name, n, t, seed=seed, loaded=loaded), "model": str(path)}]

    results = _score(runs, "model", score)
    if baseline:
        Console().print(f"initial model: {initial}\ntrained model: {model}")
    _show(comparison_table(results) if baseline else _plain_table(results, f"evaluation of {model}"), results, json_out)


def _score(runs: list[tuple], kind: str, score: Callable[[Any, str, float], list[dict]]) -> list[dict]:
    """Each run (its label, what `score` scores, the task, the temperature) under one progress bar: the rows
    `score` gives it, each labelled (`model_role`) with the run's label."""
    results = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as progress:
        bar = progress.add_task("evaluating", total=len(runs))
        for label, scored, name, t in runs:
            progress.update(bar, description=f"{label} {kind}: {name} at temperature {t:g}")
            results += [{**row, "model_role": label} for row in score(scored, name, t)]
            progress.advance(bar)
    return results


def _show(table: Table, results: list[dict], json_out: Path | None) -> None:
    Console().print(table)
    if json_out:
        write_output(json_out, json.dumps(results, indent=2))


def _eval_team(
    plan: list, n: int, temperatures: list[float], seed: int, baseline: bool, each_role: bool, json_out: Path | None
) -> None:
    """Each team task of `plan` with the roles' trained checkpoints (and, with `baseline`, the models
    they started from, when the run recorded them): a row per role. With `each_role`, also each role's
    checkpoint beside the others' initial models ("only ROLE trained"; in a team of three roles or more also
    "all but ROLE trained"): a role's own share of the change, which the whole team's rows cannot tell apart
    from what its partners learned (`team_mixes`)."""
    from swarm.model.evaluate import Loaded, comparison_table  # lazy: torch: seconds
    from swarm.model.team_eval import evaluate_team, team_mixes

    loaded = Loaded()
    runs = []
    for name, found in plan:
        trained = {role: checkpoint for role, (checkpoint, _) in found.items()}
        initial = {role: start for role, (_, start) in found.items()}
        if each_role and not all(initial.values()):
            unknown = ", ".join(role for role, start in initial.items() if start is None)
            raise typer.BadParameter(
                f"no initial model recorded for {unknown}: a role alone plays beside its partners' initial models",
                param_hint="--each-role",
            )
        compare = (baseline or each_role) and all(initial.values())
        mixes = team_mixes(trained, initial if compare else {}, each_role)
        runs += [(label, models, name, t) for label, models in mixes for t in temperatures]
    compared = any(label == "initial" for label, *_ in runs)
    results = _score(runs, "team", lambda models, name, t: evaluate_team(models, name, n, t, seed=seed, loaded=loaded))
    for name, found in plan:
        for role, (checkpoint, start) in found.items():
            Console().print(f"{name} {role}: trained {checkpoint}" + (f", initial {start}" if compared else ""))
    _show(comparison_table(results) if compared else _plain_table(results, "evaluation of the team"), results, json_out)


def _plain_table(results: list[dict], title: str) -> Table:
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="right" if column != "task" else "left")
    for r in results:
        table.add_row(*(str(r[c]) for c in COLUMNS))
    return table


__all__ = ["eval_command"]
