"""`swarm serve`: run a swarm server for one trainable model.

    swarm serve                                   # embedded model, 127.0.0.1:8000, token printed
    swarm serve --model ./my-hf-model --port 0 --group-size 8 --batch-groups 4 --max-steps 100
    ROOST_TOKEN=secret swarm serve --out runs/exp1 --checkpoint-every 5 --advantage rloo
    swarm serve --config server.yaml --quota math=0.5 --quota code=0.5   # file + flags on top
    swarm serve --lora-rank 8 --policy planner --policy executor        # two LoRA policies, one base

Every option but `--config`, `--quota` and `--log-level` is derived from a field of
`ServerConfig` (swarm/config/server.py): its help text, default and bounds live
there once. The server writes the settings it runs with to `OUT/config.yaml`
(secrets left out), so `swarm serve --config OUT/config.yaml` repeats the run. It
resumes from `OUT/checkpoints/latest` when present; `--max-steps` exits 0 after
that many optimisation steps. A port that cannot be bound stops it before anything
is written, with one line saying what to do.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import typer

from swarm.children import quiet_progress_bars_off_terminal
from swarm.config.options import build_config, config_options, require_extra, write_config
from swarm.config.server import ServerConfig
from swarm.model.widths import lora_problems
from swarm.run_layout import read_metrics
from swarm.server.bootstrap import hold_out_dir, parse_quotas, port_problem, tls_problem

CONFIG_FILE = "config.yaml"


def earlier_run(out: Path) -> str | None:
    """What of a trained run `out` holds (its metrics rows, its checkpoints), in words; None if nothing."""
    for folder in [out, *sorted((out / "policies").glob("*"))]:
        metrics = folder / "metrics.jsonl"
        rows = len(read_metrics(metrics)) if metrics.is_file() else 0  # a line cut short by a crash: no step
        if rows:
            return f"{rows} step(s) in {metrics.relative_to(out)}"
        checkpoints = folder / "checkpoints"
        if checkpoints.is_dir() and any(checkpoints.iterdir()):
            return f"checkpoints in {checkpoints.relative_to(out)}"
    return None


@config_options(ServerConfig)
def serve_command(
    overrides: dict[str, Any],
    config_file: Path = typer.Option(
        None,
        "--config",
        help="YAML/JSON file of ServerConfig fields (`train:` "
        "nested); flags given on the command line (or by envvar) override it",
    ),
    quota: list[str] = typer.Option(
        None,
        "--quota",
        metavar="FAMILY=SHARE",
        help="FAMILY=SHARE of each batch's "
        "groups, repeatable (e.g. --quota math=0.4 --quota code=0.6); other families "
        "share the rest",
    ),
    served_model_name: list[str] = typer.Option(
        None,
        "--served-model-name",
        metavar="NAME",
        help="a name requests may give as `model` (repeatable; the first is reported); others get 404",
    ),
    policy: list[str] = typer.Option(
        None,
        "--policy",
        metavar="NAME",
        help="train several LoRA policies on this one base model (repeatable; each gets the --lora-* "
        "and training settings, its own adapter, windows, checkpoints and metrics under OUT/policies/NAME); "
        "requests pick one by `model`, claims by `policy`. A config file's `policies:` list sets each apart",
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning"),
) -> None:
    """Serve a trainable model: OpenAI-compatible endpoints plus the episode API."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if quota:
        try:
            overrides = {**overrides, "quotas": parse_quotas(quota), "quota_schedule": None}
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--quota") from None
    if served_model_name:
        overrides = {**overrides, "served_model_names": list(served_model_name)}
    if policy:
        overrides = {**overrides, "policies": [{"name": name} for name in policy]}
    config: ServerConfig = build_config(ServerConfig, overrides, config_file)
    if not (Path(config.model_dir) / "config.json").exists() and config.engine in ("torch", "fake"):
        typer.echo(f"no model at {config.model_dir}: run `swarm model init` or pass --model PATH", err=True)
        raise typer.Exit(2)
    require_extra("server", "fastapi", "uvicorn", *(("torch", "transformers") if config.engine == "torch" else ()))
    problem = port_problem(config.host, config.port) or tls_problem(config)  # before anything is written
    if problem:
        typer.echo(f"swarm serve: {problem}", err=True)
        raise typer.Exit(1)
    if config.wants_gpu:
        from swarm.engine.precision import device_problem  # lazy: torch, only when a GPU is asked for

        if problem := device_problem(config.device):
            typer.echo(f"swarm serve: {problem}", err=True)
            raise typer.Exit(2)
    if found := lora_problems(config):  # before config.yaml is written: a refused start leaves no settings
        typer.echo(f"swarm serve: {found[0]}", err=True)
        raise typer.Exit(2)
    if not config.resume and (earlier := earlier_run(Path(config.out_dir))):
        typer.echo(
            f"swarm serve: --no-resume: {config.out_dir} holds an earlier run ({earlier}); a fresh one there would "
            "mix its checkpoints, metrics and rollouts with that run's: give another --out, clear it, or leave "
            "--no-resume out to continue it",
            err=True,
        )
        raise typer.Exit(2)
    held = hold_out_dir(config.out_dir)  # before its config is written over: one server per folder
    write_config(Path(config.out_dir) / CONFIG_FILE, config)
    quiet_progress_bars_off_terminal()  # under `swarm train` the output is a log: "Writing model shards" per checkpoint
    from swarm.server.app import serve  # lazy: FastAPI and the engines; `swarm client` must start light

    raise typer.Exit(serve(config, held=held))
