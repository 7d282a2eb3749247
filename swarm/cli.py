"""The `swarm` command line.

    swarm model init                 # build the embedded tiny model (once, ~2 min on 2 cores)
    swarm train --task arith         # server + client fleet on loopback; writes summary.json
    swarm serve --port 8000          # a swarm server for one trainable model
    swarm client --url URL --task arith   # a client fleet against a server

Heavy modules (torch, transformers) are imported inside the commands, so
`swarm client` starts without them.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

import scheduler.cli as _sched_cli
import store.cli as _store_cli
import swarm.ctl as _ctl
from swarm.client.cli import client_command
from swarm.server.cli import Advantage, LossAgg, serve_command

app = typer.Typer(help="Swarm RL training: serve a trainable model, run agent fleets, train.",
                  no_args_is_help=True, add_completion=False)
model_app = typer.Typer(help="The embedded model.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.command("serve", help="Run a swarm server: OpenAI-compatible endpoint + episode API + trainer.")(serve_command)
app.add_typer(_store_cli.app, name="db", help="The project database: migrations (upgrade, downgrade, current, check).")
app.add_typer(_sched_cli.app, name="sched", help="Jobs on local processes or Slurm: submit, status, cancel, logs, daemon.")
app.command("client", help="Run a client fleet: play a workflow over a dataset through a server.")(client_command)
app.add_typer(_ctl.app, name="ctl", help="Operate a running server: live config (lr, temperature, quotas...), pause, resume, checkpoint, stop.")


@model_app.command("init")
def model_init(
    out: Path = typer.Option(None, "--out", help="model directory [default: ROOST_HOME/models/tiny-qwen2]"),
    seed: int = typer.Option(0, "--seed", help="seed for tokenizer, weights and warm start"),
    force: bool = typer.Option(False, "--force", help="rebuild even if a complete model exists"),
) -> None:
    """Build the embedded tiny Qwen2 model: tokenizer, weights, supervised warm start.

    Deterministic from the seed and idempotent: a complete model is reused.
    """
    from swarm.model.build import init_model, rich_progress

    with rich_progress() as progress:
        path = init_model(out, seed=seed, force=force, progress=progress)
    typer.echo(str(path))


@app.command("train")
def train_command(
    task: str = typer.Option("arith", "--task", help="built-in task (arith | guess), or a mix: arith+guess "
                             "(equal shares of each batch) or arith=0.75+guess=0.25"),
    model: Path = typer.Option(None, "--model", help="HF causal-LM dir [default: the embedded model, built if missing]"),
    out: Path = typer.Option(Path("runs/train"), "--out", help="output directory (summary.json, metrics, logs)"),
    steps: int = typer.Option(100, "--steps", min=1, help="optimisation steps to run"),
    group_size: int = typer.Option(8, "--group-size", "-n", min=2, help="episodes per task (GRPO group)"),
    batch_groups: int = typer.Option(16, "--batch-groups", "-B", min=1, help="groups per step"),
    lr: float = typer.Option(3e-4, "--lr", min=0.0, help="learning rate"),
    advantage: Advantage = typer.Option(Advantage.grpo, "--advantage", help="group advantage estimator"),
    loss_agg: LossAgg = typer.Option(LossAgg.token_mean, "--loss-agg", help="seq-mean-token-mean: each sample "
                                     "weighs the same (task mixes of short and long episodes)"),
    kl_coef: float = typer.Option(0.0, "--kl-coef", min=0.0, help="KL penalty to the initial model"),
    clients: int = typer.Option(1, "--clients", min=1, help="client fleet processes"),
    concurrency: int = typer.Option(128, "--concurrency", min=1, help="episodes in flight, over all clients"),
    seed: int = typer.Option(0, "--seed", help="seed (engine, dataset order)"),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", min=0, help="checkpoint every k steps (0: end only)"),
    timeout_s: float = typer.Option(3600.0, "--timeout", help="give up after this many seconds"),
    temperature: float = typer.Option(None, "--temperature", min=0.0, max=2.0,
                                      help="force this sampling temperature on every call [default: the workflow's]"),
    merge: bool = typer.Option(True, "--merge/--no-merge", help="timeline merging of multi-turn calls"),
    per_episode_norm: bool = typer.Option(False, "--per-episode-norm", help="each episode weighs 1 in the loss"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="log the run to MLflow (see README)"),
    mlflow_experiment: str = typer.Option("swarm-train", "--mlflow-experiment", help="MLflow experiment"),
    mlflow_parent: str = typer.Option(None, "--mlflow-parent", help="nest the run under this MLflow run id"),
) -> None:
    """Train a model on a built-in task: one server and a client fleet over loopback."""
    from swarm.paths import default_model_dir
    from swarm.train import TrainSpec, parse_mix, run

    try:
        parse_mix(task)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--task") from None
    if model is None:
        from swarm.model.build import init_model, rich_progress

        with rich_progress("building the embedded model") as progress:
            model = init_model(default_model_dir(), progress=progress)
    elif not (model / "config.json").exists():
        raise typer.BadParameter(f"{model} is not a Hugging Face model directory (no config.json)", param_hint="--model")
    spec = TrainSpec(task=task, model=model, out=out, steps=steps, group_size=group_size, batch_groups=batch_groups,
                     lr=lr, advantage=advantage.value, loss_agg=loss_agg.value, kl_coef=kl_coef, clients=clients,
                     concurrency=concurrency,
                     seed=seed, checkpoint_every=checkpoint_every, timeout_s=timeout_s, mlflow=mlflow,
                     temperature=temperature, merge=merge, per_episode_norm=per_episode_norm,
                     mlflow_experiment=mlflow_experiment, mlflow_parent=mlflow_parent)
    summary = run(spec)
    typer.echo(json.dumps({k: summary[k] for k in ("reward_first", "reward_last", "wall_s")}))
    typer.echo(f"summary: {out.resolve() / 'summary.json'}")


@app.command("inspect")
def inspect_command(
    run_dir: Path = typer.Argument(..., help="a server output dir (holds rollouts.jsonl) or the file itself"),
    episode: str = typer.Option(None, "--episode", "-e", help="episode id [default: the last recorded]"),
    model: Path = typer.Option(None, "--model", help="tokenizer dir [default: the run's model, else the embedded one]"),
    html_out: Path = typer.Option(None, "--html", help="also write a standalone HTML page here"),
) -> None:
    """Show a recorded episode token by token: text, id, loss mask, logprob, agent."""
    from transformers import AutoTokenizer

    from swarm.inspect import find_episode, render_html, render_terminal
    from swarm.paths import default_model_dir

    try:
        ep = find_episode(run_dir, episode)
    except (FileNotFoundError, KeyError) as exc:
        raise typer.BadParameter(str(exc).strip('"'), param_hint="RUN_DIR / --episode") from None
    tok_dir = model or (Path(ep["model_dir"]) if ep.get("model_dir") else default_model_dir())
    tok = AutoTokenizer.from_pretrained(tok_dir)
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    render_terminal(ep, decode)
    if html_out:
        html_out.write_text(render_html(ep, decode))
        typer.echo(f"wrote {html_out}")


def main() -> None:
    app()
