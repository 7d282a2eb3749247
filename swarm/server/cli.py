"""`swarm serve`: run a swarm server for one trainable model.

    swarm serve                                   # embedded model, 127.0.0.1:8000, token printed
    swarm serve --model ./my-hf-model --port 0 --group-size 8 --batch-groups 4 --max-steps 100
    ROOST_TOKEN=secret swarm serve --out runs/exp1 --checkpoint-every 5 --advantage rloo
    swarm serve --config server.yaml --quota math=0.5 --quota code=0.5   # file + flags on top

Registered by `swarm/cli.py` as `app.command("serve")(serve_command)`. The server
resumes from `OUT/checkpoints/latest` when present; `--max-steps` exits 0 after
that many optimisation steps.
"""

from __future__ import annotations

import dataclasses
import logging
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from swarm.engine.base import TrainConfig

if TYPE_CHECKING:
    from swarm.server.config import ServerConfig


class EngineName(str, Enum):
    torch = "torch"
    fake = "fake"


class Continuity(str, Enum):
    exact = "exact"
    retokenize = "retokenize"


class FailedGroupPolicy(str, Enum):
    drop = "drop"
    keep = "keep"


class Advantage(str, Enum):
    grpo = "grpo"
    rloo = "rloo"
    reinforce_pp = "reinforce_pp"


class LossAgg(str, Enum):
    token_mean = "token-mean"
    seq_mean_token_mean = "seq-mean-token-mean"


def serve_command(
    ctx: typer.Context,
    model: Path = typer.Option(None, "--model", help="Hugging Face model dir [default: the embedded model]"),
    engine: EngineName = typer.Option(EngineName.torch, "--engine", help="generation/training engine"),
    host: str = typer.Option("127.0.0.1", "--host", help="bind address (loopback unless told)"),
    port: int = typer.Option(8000, "--port", help="port; 0 picks a free one (printed)"),
    group_size: int = typer.Option(8, "--group-size", "-n", min=1, help="episodes per task in a group"),
    batch_groups: int = typer.Option(4, "--batch-groups", "-B", min=1, help="groups per training step"),
    checkpoint_every: int = typer.Option(10, "--checkpoint-every", min=0, help="checkpoint every k steps"),
    out: Path = typer.Option(None, "--out", help="metrics and checkpoints [default: ROOST_HOME/runs/serve]"),
    lr: float = typer.Option(TrainConfig.lr, "--lr", min=0.0, help="learning rate"),
    advantage: Advantage = typer.Option(Advantage.grpo, "--advantage", help="group advantage estimator"),
    kl_coef: float = typer.Option(TrainConfig.kl_coef, "--kl-coef", min=0.0, help="KL to the reference"),
    loss_agg: LossAgg = typer.Option(LossAgg.token_mean, "--loss-agg", help="token-mean: every trained token "
                                     "weighs the same; seq-mean-token-mean: every sample does (task mixes)"),
    token: str = typer.Option(None, "--token", envvar="ROOST_TOKEN",
                              help="worker token; generated and printed when absent"),
    admin_token: str = typer.Option(None, "--admin-token", envvar="ROOST_ADMIN_TOKEN",
                                    help="admin token; generated and printed when absent"),
    max_steps: int = typer.Option(None, "--max-steps", min=1, help="stop (exit 0) after this many steps"),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="default max_tokens of a call"),
    temperature: float = typer.Option(None, "--temperature", min=0.0, max=2.0,
                                      help="force this sampling temperature on every call"),
    merge: bool = typer.Option(True, "--merge/--no-merge", help="merge prefix-sharing calls into one sample"),
    per_episode_norm: bool = typer.Option(False, "--per-episode-norm",
                                          help="an episode's samples share a loss weight of 1"),
    continuity: Continuity = typer.Option(Continuity.exact, "--continuity",
                                          help="exact: reuse generated ids in later prompts"),
    seed: int = typer.Option(0, "--seed", help="engine seed"),
    device: str = typer.Option(None, "--device", help="torch device [default: cuda if available]"),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning"),
    mlflow: bool = typer.Option(False, "--mlflow/--no-mlflow", help="log params and per-step metrics to MLflow "
                                "(MLFLOW_TRACKING_URI, default SQLite under ROOST_HOME)"),
    mlflow_experiment: str = typer.Option("swarm", "--mlflow-experiment", help="MLflow experiment"),
    mlflow_run_name: str = typer.Option(None, "--mlflow-run-name", help="MLflow run name [default: out dir name]"),
    mlflow_parent: str = typer.Option(None, "--mlflow-parent", help="parent MLflow run id (nest under a study)"),
    config_file: Path = typer.Option(None, "--config", help="YAML/JSON file of ServerConfig fields; flags given "
                                     "on the command line (or by envvar) override it"),
    quota: list[str] = typer.Option(None, "--quota", help="FAMILY=SHARE of each batch's groups, repeatable "
                                    "(e.g. --quota math=0.4 --quota code=0.6); other families share the rest"),
    secret: str = typer.Option(None, "--secret", envvar="ROOST_SECRET", show_default=False,
                               help="HMAC secret of episode keys; generated and kept in OUT/secrets.json"),
    default_temperature: float = typer.Option(1.0, "--default-temperature", min=0.0, max=2.0,
                                              help="temperature of calls that name none"),
    lease_seconds: float = typer.Option(600.0, "--lease-seconds", min=0.05,
                                        help="episode lease, renewed by heartbeats and the episode's calls"),
    quota_borrow_s: float = typer.Option(30.0, "--quota-borrow-s", min=0.0, help="once a window is this old, "
                                         "a family over quota may take a slot left unclaimed (0: never)"),
    group_stall_s: float = typer.Option(300.0, "--group-stall-s", min=0.0, help="a group nobody plays for this "
                                        "long completes smaller (0: wait forever)"),
    durable_buffer: bool = typer.Option(True, "--durable/--no-durable", help="persist finished episodes "
                                        "(OUT/buffer.sqlite) before acknowledging them; replayed on restart"),
    max_staleness: int = typer.Option(1, "--max-staleness", min=0, help="replay buffered episodes at most this "
                                      "many policy versions away after a restart; older ones: dropped_stale"),
    failed_group_policy: FailedGroupPolicy = typer.Option(
        FailedGroupPolicy.drop, "--failed-group-policy", help="a group with a failed episode: drop it, or keep "
                                                              "training the rest (when >= 2 remain)"),
    generate_timeout_s: float = typer.Option(300.0, "--generate-timeout-s", min=0.0,
                                             help="engine calls running longer get a 504 (0: no limit)"),
) -> None:
    """Serve a trainable model: OpenAI-compatible endpoints plus the episode API."""
    from swarm.paths import data_dir, default_model_dir
    from swarm.server.app import serve
    from swarm.server.config import ServerConfig

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    train = dataclasses.replace(TrainConfig(), lr=lr, advantage=advantage.value, kl_coef=kl_coef,
                                loss_agg=loss_agg.value)
    config = ServerConfig(
        host=host, port=port, model_dir=model or default_model_dir(), engine=engine.value,
        device=device, seed=seed, group_size=group_size, batch_groups=batch_groups,
        checkpoint_every=checkpoint_every, out_dir=out or data_dir() / "runs" / "serve",
        token=token, admin_token=admin_token, max_steps=max_steps, default_max_tokens=max_tokens,
        train=train, temperature=temperature, merge=merge, per_episode_norm=per_episode_norm,
        continuity=continuity.value, mlflow=mlflow, mlflow_experiment=mlflow_experiment,
        mlflow_run_name=mlflow_run_name, mlflow_parent_run_id=mlflow_parent,
        lease_seconds=lease_seconds, group_stall_s=group_stall_s or None,
        quota_borrow_s=quota_borrow_s or None, durable_buffer=durable_buffer,
        max_staleness=max_staleness, failed_group_policy=failed_group_policy.value,
        generate_timeout_s=generate_timeout_s or None,
    )
    config = _with_file_and_quotas(ctx, config, config_file, quota, secret, default_temperature)
    if not (Path(config.model_dir) / "config.json").exists() and config.engine == "torch":
        typer.echo(f"no model at {config.model_dir}: run `swarm model init` or pass --model PATH", err=True)
        raise typer.Exit(2)
    raise typer.Exit(serve(config))


def _with_file_and_quotas(ctx: typer.Context, config: ServerConfig, config_file: Path | None,
                          quota: list[str] | None, secret: str | None, default_temperature: float) -> ServerConfig:
    """The flags' config, on top of `--config FILE` when given (only explicit flags override it)."""
    from swarm.server.bootstrap import load_config_file, merge, parse_quotas

    try:
        quotas = parse_quotas(quota) if quota else None
        config = config.model_copy(update={"secret": secret, "default_temperature": default_temperature})
        if quotas is not None:
            config = type(config).model_validate({**config.model_dump(), "quotas": quotas,
                                                  "quota_schedule": None})
        if config_file is None:
            return config
        # by name: typer may vendor its own click, with its own ParameterSource enum
        explicit = {name for name in ctx.params
                    if getattr(ctx.get_parameter_source(name), "name", "") in ("COMMANDLINE", "ENVIRONMENT")}
        return merge(load_config_file(config_file), config, explicit)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise typer.BadParameter(str(exc), param_hint="--config / --quota") from None
