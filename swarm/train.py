"""`swarm train`: one server and a client fleet, as separate processes, over loopback.

    swarm model init && swarm train --task arith
    swarm train --task arith+guess                # a task mix: equal shares of every batch
    swarm train --task arith=0.75+guess=0.25      # ... or these shares

The server (`swarm serve`) owns the model and trains it; the fleet
(`swarm client`, any number of processes) plays the task through the server's
OpenAI-compatible endpoint. This command only orchestrates: it picks a port and
tokens, writes the run's settings (`run.yaml`, from `RunConfig` in
swarm/config/run.py) and each process's own (`server.yaml`, `fleet-*.yaml`),
starts them with `--config`, shows progress from the server's metrics, stops
everything by PID when the target step is reached (or on Ctrl-C), and writes
`summary.json` (also when the run fails: `status: failed`, and its MLflow run FAILED; a `--resume` whose
server never comes up leaves the earlier run's run.yaml and summary.json as they were: `KeptFiles`).
`run.yaml` records what ran (the port, the server's group size...) and `swarm train
--config OUT/run.yaml` repeats the run, into a fresh sibling folder (swarm/run_checks.py
chooses the folder and checks every input before anything starts).

A task mix runs one fleet per task and gives the server a quota per task family,
so every batch holds the tasks in the given shares however fast each fleet is
(the server enforces it; see docs/server-control.md). The metrics then carry
`reward_mean/<family>` per step, and `summary.json` a first/last reward per family.
Every field of `summary.json` is documented in the README ("The run folder").
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from swarm.children import log_tail, open_log, signals_interrupt, stop, swarm_command, wait_serving
from swarm.config.fleet import FleetConfig
from swarm.config.options import write_config
from swarm.config.policies import PolicySpec
from swarm.config.run import SHARED_BASE_RANK as SHARED_BASE_RANK  # swarm/team_run.py takes it from here
from swarm.config.run import RunConfig, tracking_params, write_run_file
from swarm.config.server import ServerConfig
from swarm.fleet_alerts import FleetAlerts
from swarm.kept_files import KeptFiles, RunUnchanged
from swarm.run_checks import CURSORS, METRICS, RUN_FILE, MetricsTail, previous_run, read_metrics
from swarm.run_layout import SERVER_FILE
from swarm.run_summary import ServerStopped, ended, summarize, summarize_policies, write_summary
from swarm.server.bootstrap import keep_tokens
from swarm.server.tracking import EXTRA_FILE, MODEL_FILE
from swarm.server.tracking import RUN_FILE as MLFLOW_RUN_FILE
from swarm.tasks import get_task

console = Console(stderr=True)


def _family(task: str) -> str:
    return get_task(task).family


def server_config(spec: RunConfig, out: Path, port: int, resume: bool = False) -> ServerConfig:
    """The run's server settings with what `swarm train` orchestrates filled in."""
    update: dict = {
        "host": "127.0.0.1",
        "port": port,
        "ssl_certfile": None,  # loopback: the run's own fleets, no certificate to trust
        "ssl_keyfile": None,
        "out_dir": out / "server",
        "max_steps": spec.steps,
        "mlflow_run_name": spec.server.mlflow_run_name or f"{spec.name}-{out.name}",
        "resume": resume,
    }
    if spec.grouped:  # a group is one episode whose one call samples group_size choices
        update["group_size"] = 1
    mix = spec.mix
    if len(mix) > 1:  # one fleet per task; the server's quotas hold the shares in every batch
        update.update(quotas={_family(name): share for name, share in mix.items()}, quota_schedule=None)
    if spec.roles:  # --shared-base: a LoRA policy per role on the one base
        update["policies"] = [PolicySpec(name=role) for role in spec.roles]
        update["lora"] = spec.trained_lora
    return spec.server.model_copy(update=update)


def absolute_paths(server: ServerConfig) -> ServerConfig:
    """The model and a local teacher as absolute paths: `swarm train --config OUT/run.yaml` repeats a run
    from any folder, where `--teacher runs/train` named nothing (a URL teacher is left as it is)."""
    update: dict[str, object] = {"model_dir": Path(server.model_dir).absolute()}
    if server.teacher and not server.teacher.startswith(("http://", "https://")):
        update["teacher"] = str(Path(server.teacher).absolute())
    return server.model_copy(update=update)


def metric_files(spec: RunConfig, out: Path) -> dict[str, Path]:
    """Each trained policy's metrics: {"": server/metrics.jsonl}, or one per role with --shared-base."""
    if not spec.roles:
        return {"": out / METRICS}
    return {role: out / "server" / "policies" / role / "metrics.jsonl" for role in spec.roles}


def fleet_configs(spec: RunConfig, url: str) -> list[tuple[str, FleetConfig]]:
    """One fleet per task of the mix and client process: (log name, its settings)."""
    mix: dict[str | None, float] = dict(spec.mix) or {None: 1.0}  # None: the workflow's own dataset
    out = []
    for name, share in mix.items():
        per_client = max(1, round(spec.concurrency * share) // spec.clients)
        for i in range(spec.clients):
            log_name = f"client{i}" if len(mix) == 1 else f"client-{name}-{i}"
            out.append(
                (
                    log_name,
                    FleetConfig(
                        url=url,
                        task=name,
                        workflow=spec.workflow,
                        dataset=spec.dataset,
                        n=1 if spec.grouped else spec.server.group_size,
                        choices=spec.server.group_size if spec.grouped else 1,
                        concurrency=per_client,
                        seed=spec.server.seed * 1000 + i,
                        dataset_size=spec.dataset_size,
                        failure_streak=spec.failure_streak,
                        team=",".join(spec.roles) or None,
                        deterministic=spec.server.deterministic,
                    ),
                )
            )
    return out


def start_fleets(
    fleets: dict[str, FleetConfig], out: Path, logs: Path, env: dict[str, str], steps: tuple[int, int], resume: bool
) -> dict[Path, subprocess.Popen]:
    """Start one `swarm client` process per fleet (its config in OUT/fleet-NAME.yaml), each in its own
    session so it is stopped by its PID; returns {its log: the process}. `steps`: first and last."""
    procs = {}
    for log_name, fleet in fleets.items():
        log = logs / f"{log_name}.log"
        if fleet.state is None:  # the run's own cursor: --resume continues it, --fresh clears it, and two runs
            # (a study's trials on one shared server, same task and seed) never share one by its default key
            fleet = fleet.model_copy(update={"state": out / CURSORS / f"{log_name}.json"})
        procs[log] = subprocess.Popen(
            swarm_command("client", "--config", str(write_config(out / f"fleet-{log_name}.yaml", fleet))),
            stdout=open_log(log, resume, *steps),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return procs


def run(spec: RunConfig, resume: bool = False) -> dict:
    """Train until the server has done `spec.steps` steps (counting an earlier run's when resuming).

    On a failure (a dead server or fleet, a timeout, Ctrl-C) every process is stopped, summary.json
    says `status: failed` (or `interrupted`, or `stopped` for a server stopped cleanly) with the error,
    the MLflow run is marked FAILED (KILLED), and the error is raised again. A start over an earlier run
    (`--resume`) that fails before its server is up leaves that run as it was and raises `RunUnchanged`."""
    out = spec.out.resolve()
    given_rank = spec.server.lora.rank
    # what run.yaml records: the paths absolute, the LoRA the roles of a --shared-base run train (it said rank 0)
    server = absolute_paths(spec.server).model_copy(update={"lora": spec.trained_lora})
    spec = spec.model_copy(update={"out": out, "server": server})
    out.mkdir(parents=True, exist_ok=True)
    if not resume and previous_run(out):
        raise RuntimeError(f"{out} holds an earlier run: resume it or clear it first")
    metrics = metric_files(spec, out)
    done = min(len(read_metrics(m)) for m in metrics.values()) if resume else 0
    if done >= spec.steps:
        raise RuntimeError(f"the run in {out} already has {done} steps; ask for more with --steps")
    token, admin = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    if spec.roles and spec.server.lora.rank != given_rank:
        console.print(
            f"--shared-base: the roles train LoRA adapters of rank {spec.server.lora.rank} (roles of one base "
            "cannot be full-parameter; --lora-rank r > 0 to change it)"
        )
    served = server_config(spec, out, 0, resume)  # port 0: the server binds a free one and says which
    kept = KeptFiles.take(out, KEPT)  # what a start that fails before its server is up puts back
    write_run_file(out, spec, served, {})  # --resume finds it even when the server never starts
    server_file = write_config(out / "server.yaml", served)
    keep_tokens(served.out_dir, token, admin)  # `swarm ctl --server OUT` finds them there
    if served.mlflow:
        _hand_over_mlflow(spec, served, out)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROOST_TOKEN": token, "ROOST_ADMIN_TOKEN": admin}
    t0 = time.monotonic()
    procs: dict[Path, subprocess.Popen] = {}  # its log -> a process we started
    alerts: FleetAlerts | None = None  # the fleets' failure lines, once they run
    up = False  # the server answered: from then on the run's files are this start's
    try:
        with signals_interrupt():  # SIGTERM (a scheduler's cancel), SIGHUP: the cleanup below still runs
            try:
                server_log = logs / "server.log"
                server = procs[server_log] = subprocess.Popen(
                    swarm_command("serve", "--config", str(server_file)),
                    stdout=open_log(server_log, resume, done + 1, spec.steps),
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
                with console.status(starting_line(spec.server.engine, server_log)):  # a terminal's spinner
                    timeout = start_timeout(spec.server.engine)
                    url = wait_serving(served.out_dir / SERVER_FILE, token, server, server_log, timeout)
                up = True
                fleets = dict(fleet_configs(spec, url))
                write_run_file(out, spec, served.model_copy(update={"port": urlsplit(url).port}), fleets)
                console.print(
                    f"[dim]live control: swarm ctl --server {out} status (set lr=..., checkpoint)[/]", soft_wrap=True
                )
                procs |= start_fleets(fleets, out, logs, env, (done + 1, spec.steps), resume)
                clients = {log: p for log, p in procs.items() if p is not server}
                alerts = FleetAlerts(clients)
                follow(spec, url, token, server, metrics, t0, clients, alerts, done)
                _await_exit(server, [m.parent for m in metrics.values()])  # each policy logs its own model
            finally:
                for p in reversed(procs.values()):  # the server last, given the time to open and close its
                    stop(p, grace=45.0 if p is procs[server_log] else 10.0)  # MLflow run (it waits <= 30 s)
                if alerts is not None:
                    alerts.say(console)  # what the fleets said after the last look
    except BaseException as exc:
        if not up:
            kept.restore()
        if up or kept.summary is None:
            _record_failure(out, spec, time.monotonic() - t0, exc)
        elif isinstance(exc, Exception):
            raise RunUnchanged(str(exc), out, kept.status) from exc
        raise
    wall = time.monotonic() - t0
    summary = trained_summary(spec, out, wall)
    run_file = out / "server" / MLFLOW_RUN_FILE
    if run_file.exists():  # the server logged the run's params and the final model itself (no MLflow here)
        summary["mlflow"] = json.loads(run_file.read_text())
        model_uri = _logged_model(out / "server" / MODEL_FILE)
        if model_uri:
            summary["mlflow"]["model_uri"] = model_uri
        elif _model_state(out / "server" / MODEL_FILE).get("state") == "logging":  # stopped while logging it
            finish_mlflow_run(summary["mlflow"], tracking_params(spec), "FINISHED")
    write_summary(out, summary)
    return summary


#: what a start rewrites of an earlier run in its folder before its server is up (relative to OUT)
KEPT = (RUN_FILE, "server.yaml", "summary.json", f"server/{MODEL_FILE}")


def _hand_over_mlflow(spec: RunConfig, served: ServerConfig, out: Path) -> None:
    """What this command adds to the server's MLflow run, for the server to log (`EXTRA_FILE`): the run's
    own params, run.yaml and the model card's words. The server has MLflow, torch and transformers loaded;
    doing the same here cost ~15 s of imports and package scans after the last step. A model file of an
    earlier part of a resumed run goes: `_await_exit` follows the new one."""
    server_dir = out / "server"
    server_dir.mkdir(parents=True, exist_ok=True)
    (server_dir / MODEL_FILE).unlink(missing_ok=True)
    base = served.model_dir
    extra = {
        "params": tracking_params(spec),
        "artifacts": [str(out / RUN_FILE)],
        "model_card": {
            "title": f"{out.name}: trained by `swarm train`",
            "description": f"Fine-tuned from `{base}` by Roost's `swarm train`; the run's settings "
            f"are its MLflow run's `{RUN_FILE}` (`swarm train --config {RUN_FILE}`).",
        },
    }
    (server_dir / f".{EXTRA_FILE}.tmp").write_text(json.dumps(extra, indent=2))
    (server_dir / f".{EXTRA_FILE}.tmp").replace(server_dir / EXTRA_FILE)


def _model_state(path: Path) -> dict:
    """The server's `MODEL_FILE` (written whole, by rename), or {} before it writes one."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _await_exit(
    server: subprocess.Popen, server_dirs: list[Path], stop_s: float = 60.0, model_s: float = 900.0
) -> None:
    """Wait for the server, at its last step, to exit by itself (after --max-steps), with a status line of what
    it is doing: its last checkpoint (within `stop_s`, else TimeoutError: the run failed), then, MLflow on,
    logging the trained model (within `model_s` more: a large model takes minutes to write; with several
    policies, from the first that starts logging its own). Past that the
    server is stopped with the run finished all the same: the model is only its record."""
    deadline = time.monotonic() + stop_s
    logging_model = False
    with console.status("server: saving the last checkpoint…") as line:
        while server.poll() is None:
            if not logging_model and any(_model_state(d / MODEL_FILE).get("state") == "logging" for d in server_dirs):
                logging_model, deadline = True, time.monotonic() + model_s
                line.update("server: logging the trained model to MLflow…")
            if time.monotonic() > deadline:
                if logging_model:
                    return  # `run` stops it, warns and ends the MLflow run
                raise TimeoutError(f"the server did not exit within {stop_s:.0f}s of its last step")
            time.sleep(0.2)


def _logged_model(path: Path) -> str | None:
    """The URI of the model the server logged (said in a line, with how long it took), or None (a warning when
    it tried and failed; nothing when it had no Hugging Face checkpoint to log: the fake engine)."""
    state = _model_state(path)
    if state.get("state") == "logged":
        console.print(
            f"logged the trained model to MLflow in {state.get('seconds', 0):.1f}s (by the server): "
            f"{state['model_uri']}",
            soft_wrap=True,
        )
        return str(state["model_uri"])
    if state:
        console.print(
            f"[yellow]warning[/yellow]: could not log the model to MLflow: "
            f"{state.get('error', 'the server was stopped while logging it')}; see logs/server.log"
        )
    return None


def trained_summary(spec: RunConfig, out: Path, wall_s: float) -> dict:
    """What the run trained, ended or not: a --shared-base run's roles each from their own metrics (a failed
    or interrupted one was read from the server's file, which it has none of: "0 steps", no `policies`)."""
    if spec.roles:
        return summarize_policies(spec, metric_files(spec, out), wall_s)
    return summarize(read_metrics(out / METRICS), wall_s, spec)


def _record_failure(out: Path, spec: RunConfig, wall_s: float, exc: BaseException) -> None:
    """summary.json of a run that did not reach its steps, and its MLflow run marked as ended badly."""
    summary = {**trained_summary(spec, out, wall_s), **ended(exc)}
    run_file = out / "server" / MLFLOW_RUN_FILE
    if run_file.exists():
        summary["mlflow"] = json.loads(run_file.read_text())
        state = "FAILED" if summary["status"] == "failed" else "KILLED"
        finish_mlflow_run(summary["mlflow"], tracking_params(spec), state)
    write_summary(out, summary)


def finish_mlflow_run(mlflow_run: dict, params: dict[str, str], status: str | None = None) -> None:
    """End the MLflow run with `status` where the server could not (a failed run; a server stopped while
    logging the model), adding the run's own parameters not there yet: the server logs them (`EXTRA_FILE`)
    as it opens the run, which a server killed early may not have done (MLflow parameters never change).
    Only these paths import MLflow here; a finished run's server did all of it. A warning, never an
    error, when MLflow refuses."""
    try:
        from mlflow import MlflowClient  # lazy: importing MLflow takes seconds
        from mlflow.entities import Param  # lazy: as above

        client = MlflowClient(mlflow_run["tracking_uri"])
        logged = client.get_run(mlflow_run["run_id"]).data.params
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        if new:
            client.log_batch(mlflow_run["run_id"], params=new)
        if status is not None:
            client.set_terminated(mlflow_run["run_id"], status)
    except Exception as exc:  # noqa: BLE001 - tracking must never change how a run ends
        console.print(f"[yellow]warning[/yellow]: could not update the MLflow run: {exc}")


def reward_text(row: dict) -> str:
    """A step's reward for a progress line: the mean, and each task family's in a mix."""
    per = {k.partition("/")[2]: v for k, v in row.items() if k.startswith("reward_mean/")}
    text = f"reward {row.get('reward_mean', 0):.3f}"
    if len(per) > 1:
        text += " (" + ", ".join(f"{f} {v:.3f}" for f, v in sorted(per.items())) + ")"
    return text


def start_timeout(engine: str) -> float:
    """Seconds a run's server may take to answer: a vLLM server a minute or two on a loaded CPU, torch seconds."""
    return 900.0 if engine == "vllm" else 180.0


def starting_line(engine: str, log: Path, team: bool = False) -> str:
    """What a terminal shows while a run's server starts (a team's servers: `log` is their folder):
    silent, a vLLM server's minute or two looked hung."""
    took = "vLLM takes a minute or two" if engine == "vllm" else "loading the model"
    return f"starting the server{'s' * team} ({took}; {'their logs' if team else 'its log'}: {log})…"


def _shown(value: float, places: int) -> float:
    """`value` rounded as printed, without a sign on zero: the KL estimate's noise around 0 read `-0.0000`."""
    return round(value, places) + 0.0


def step_line(role: str | None, row: dict, entropy: bool = True) -> str:
    """One metrics row as the progress line `swarm train` prints per step (a team's roles prefixed). A measure
    the engine does not compute (the fake engine: no KL, entropy or throughput) is left out, not printed `nan`."""
    nan = float("nan")
    text = f"{f'{role} ' if role else ''}step {row.get('step')}: {reward_text(row)}  "
    text += f"loss {_shown(row.get('loss', nan), 4):+.4f}  "
    if _measured(row, "kl"):
        text += f"kl {_shown(row['kl'], 4):.4f}  "
    if entropy and _measured(row, "entropy"):
        text += f"entropy {row['entropy']:.3f}  "
    if _measured(row, "tokens_per_s"):
        text += f"{row['tokens_per_s']:.0f} tok/s"
    return text.rstrip()


def _measured(row: dict, key: str) -> bool:
    value = row.get(key)
    return isinstance(value, int | float) and value == value


def _stops_cleanly(server: object, wait_s: float = 60.0) -> bool:
    """Whether a server process we started exits with 0 within `wait_s` (a stop finishes its step and writes
    its checkpoint first); False for anything else (an attached run's shared server goes on)."""
    if not isinstance(server, subprocess.Popen):
        return False
    try:
        return server.wait(timeout=wait_s) == 0
    except subprocess.TimeoutExpired:
        return False


def follow(
    spec: RunConfig,
    url: str,
    token: str,
    server: subprocess.Popen,
    metrics: dict[str, Path],
    t0: float,
    clients: dict[Path, subprocess.Popen],
    alerts: FleetAlerts,
    shown: int = 0,
) -> None:
    """Print each new metrics row (rows of an earlier part of a resumed run are not shown again); with
    several policies (--shared-base) each role's rows, and the run's progress is the slowest role's."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bar = progress.add_task(f"training {spec.name}", total=spec.steps, info="")
        tails = {role: MetricsTail(path) for role, path in metrics.items()}
        printed = dict.fromkeys(metrics, shown)

        def rows_now() -> int:  # once the server or the fleet has exited: its last row may be newer than `shown`
            return min(len(t.poll()) for t in tails.values())

        while True:
            alerts.say(progress.console)  # the user's workflow failing: said at once, not found in a log later
            latest = {}
            for role, tail in tails.items():
                rows = tail.poll()
                for r in rows[printed[role] :]:
                    progress.console.print(step_line(role, r), soft_wrap=True)  # one line a step, in a log too
                printed[role] = len(rows)
                if rows:
                    latest[role] = rows[-1]
            shown = min(printed.values())
            info = "  ".join(f"{f'{role} ' if role else ''}{reward_text(r)}" for role, r in latest.items())
            info = info or "collecting…"
            progress.update(bar, completed=min(shown, spec.steps), info=info)
            if server.poll() is not None:
                shown = rows_now()
                if shown < spec.steps and server.returncode == 0:
                    raise ServerStopped(shown, spec.steps)
                if shown < spec.steps:
                    log = spec.out / "logs" / "server.log"
                    raise RuntimeError(
                        f"server stopped after {shown} of {spec.steps} steps "
                        f"(exit code {server.returncode}); see its log, {log}:\n{log_tail(log)}"
                    )
                return
            if shown >= spec.steps:
                return  # it exits by itself after --max-steps: `_await_exit`
            if all(c.poll() is not None for c in clients.values()):
                codes = sorted({c.returncode for c in clients.values()})
                if codes == [0] and _stops_cleanly(server):  # the fleet ended because its server is stopping
                    if rows_now() >= spec.steps:
                        return  # it was the run's end: the last row came after this round's read
                    raise ServerStopped(shown, spec.steps)
                first = next(iter(clients))
                raise RuntimeError(
                    f"every client process exited (exit code {', '.join(map(str, codes))}) after "
                    f"{shown} of {spec.steps} steps; see their logs: "
                    f"{', '.join(map(str, clients))}\n{first.name}:\n{log_tail(first)}"
                )
            if time.monotonic() - t0 > spec.timeout_s:
                steps = f"{spec.steps} step{'s' * (spec.steps != 1)}"
                raise TimeoutError(f"training did not reach {steps} in {spec.timeout_s:.0f}s")
            time.sleep(0.5)
