"""`swarm train --team ROLE=MODEL[,ROLE=MODEL...]`: a team of models trained in one command.

    swarm model init --preset tiny-wide        # a second, different model (same tokenizer)
    swarm train --team planner=embedded,executor=tiny-wide --task duet
    swarm train --team planner=embedded,executor=embedded --task duet     # one server, a LoRA policy per role
    swarm train --team a=DIR1,b=DIR2 --workflow my_team:play --dataset my_team:problems

Why: each role of a team task is its own trainable model, and a user should not have to write the
harness that starts a server per model and routes each role's calls to its own. A model is a
directory, a preset name (`swarm model init --preset NAME`, built here if missing) or `embedded`.

The roles are grouped by model: roles on one model share ONE server as LoRA policies of that base
(the `--shared-base` machinery: a `PolicySpec` per role), every other model gets a server of its own
whose served model name is the role. One team fleet (`swarm client --team ROLE=URL,...`) claims one
episode per role, each on its role's server, and each server trains its own role on that role's
reward (the task's per-role rewards). The layout follows `swarm train`'s, one folder per server:

    OUT/run.yaml  summary.json  fleet-client0.yaml  server-NAME.yaml
    OUT/servers/NAME/          the server's out folder (NAME: the role, or `planner+executor` when shared)
    OUT/logs/server-NAME.log  client0.log

Supervision: a server that dies before its roles reach `--steps` is restarted from its last
checkpoint (the same port and folder; `resume`), and replays every episode it acknowledged from its
durable buffer; the other servers keep going, and the fleet's clients wait for the restarted one
(they reconnect for `reconnect_s`). A server that exits cleanly was stopped, not crashed (`swarm ctl
--server OUT/servers/NAME stop`, a signal to it): the others stop too, each with a last checkpoint, and
the run ends `stopped` (`--resume` goes on). A team run checkpoints every `TEAM_CHECKPOINT_EVERY` steps when
the run asks for none, so a restart loses little. The servers do not stop themselves at `--steps`:
a role that is ahead (a team whose other member died unfinished) would stop the whole team while
another role still needs episodes; this command stops every server (admin stop: a last checkpoint)
once every role has its steps. `summary.json` has a section per role (`roles`) and per server
(`servers`); the run's reward is the mean of the roles'. `--resume` (same --out) starts every server
from its own latest checkpoint and counts each role on from it (swarm/team_resume.py reads the folder).

Every input is checked before anything starts (swarm/team_checks.py): one line per problem, exit 2.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from swarm.children import log_tail, open_log, signals_interrupt, stop, swarm_command, wait_serving
from swarm.config.fleet import FleetConfig
from swarm.config.options import write_config
from swarm.config.policies import PolicySpec
from swarm.config.run import RunConfig, write_run_file
from swarm.config.server import ServerConfig
from swarm.fleet_alerts import FleetAlerts
from swarm.run_checks import MetricsTail, previous_run, read_metrics
from swarm.run_layout import SERVER_FILE
from swarm.run_summary import ServerStopped, combine_roles, ended, summarize, write_summary
from swarm.server.bootstrap import keep_tokens
from swarm.server.tracking import RUN_FILE as MLFLOW_RUN_FILE
from swarm.team_checks import members, parse_team
from swarm.team_resume import SERVERS, Member, role_dir, role_steps
from swarm.train import SHARED_BASE_RANK, console, start_fleets, start_timeout, starting_line, step_line

#: checkpoint every k steps when the run asks for none (`--checkpoint-every 0`): a restarted server
#: resumes from its last checkpoint and retrains only the steps after it
TEAM_CHECKPOINT_EVERY = 5
#: restarts of one server before the run fails (a server that cannot stay up is not a transient fault)
MAX_RESTARTS = 3


def member_config(spec: RunConfig, member: Member, out: Path, port: int, resume: bool = False) -> ServerConfig:
    """A team server's settings: the run's, on the member's model, in its own folder."""
    s = spec.server
    update: dict = {
        "host": "127.0.0.1",
        "port": port,
        "ssl_certfile": None,  # loopback, as `swarm train`'s own server
        "ssl_keyfile": None,
        "model_dir": member.model,
        "out_dir": out / SERVERS / member.name,
        "max_steps": None,  # this command stops the servers together once every role has its steps
        "checkpoint_every": s.checkpoint_every or TEAM_CHECKPOINT_EVERY,
        "mlflow_run_name": f"{s.mlflow_run_name or f'{spec.name}-{out.name}'}-{member.name}",
        "resume": resume,
    }
    if member.shared:  # roles on one base: a LoRA policy per role, as --shared-base
        update["policies"] = [PolicySpec(name=role) for role in member.roles]
        if not s.lora.enabled and s.engine in ("torch", "vllm"):
            update["lora"] = s.lora.model_copy(update={"rank": SHARED_BASE_RANK})
    else:  # the role's calls and claims name the role: the server's model name
        update["model_name"] = member.roles[0]
    return s.model_copy(update=update)


def role_metrics(out: Path, member: Member) -> dict[str, Path]:
    """Each role's metrics file in its server's folder."""
    return {role: role_dir(out, member, role) / "metrics.jsonl" for role in member.roles}


def team_fleets(spec: RunConfig, urls: dict[str, str]) -> dict[str, FleetConfig]:
    """The team fleet, one config per client process: every role routed to its server (`ROLE=URL`)."""
    team = ",".join(f"{role}={url}" for role, url in urls.items())
    per_client = max(1, spec.concurrency // spec.clients)
    return {
        f"client{i}": FleetConfig(
            url=next(iter(urls.values())),
            task=spec.task,
            workflow=spec.workflow,
            dataset=spec.dataset,
            n=spec.server.group_size,
            concurrency=per_client,
            seed=spec.server.seed * 1000 + i,
            dataset_size=spec.dataset_size,
            failure_streak=spec.failure_streak,
            team=team,
            reconnect_s=300.0,  # a restarted server takes a while to answer again (a torch load, the replay)
        )
        for i in range(spec.clients)
    }


class _Server:
    """One team server process and what restarting it needs."""

    def __init__(self, member: Member, spec: RunConfig, out: Path, env: dict[str, str]) -> None:
        self.member, self.spec, self.out, self.env = member, spec, out, env
        self.port = 0  # the kernel's pick on the first start (`wait_announced`); a restart binds it again
        self.url = ""  # known once the server has bound its port
        self.folder = out / SERVERS / member.name
        self.log = out / "logs" / f"server-{member.name}.log"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.exits: list[int] = []

    def start(self, resume: bool, first_step: int = 1) -> None:
        config = member_config(self.spec, self.member, self.out, self.port, resume)
        path = write_config(self.out / f"server-{self.member.name}.yaml", config)
        keep_tokens(config.out_dir, self.env["ROOST_TOKEN"], self.env["ROOST_ADMIN_TOKEN"])  # for `swarm ctl --server`
        self.proc = subprocess.Popen(
            swarm_command("serve", "--config", str(path)),
            stdout=open_log(self.log, resume, first_step, self.spec.steps),
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )

    def wait_healthy(self, token: str) -> None:
        """Until it answers; its URL is known from then on (the fleets are given it)."""
        assert self.proc is not None
        timeout = start_timeout(self.spec.server.engine)
        self.url = wait_serving(self.folder / SERVER_FILE, token, self.proc, self.log, timeout)
        self.port = urlsplit(self.url).port or 0

    def admin_stop(self, admin: str) -> None:
        """Ask it to stop (a last checkpoint of each policy); a server already gone is no error."""
        try:
            httpx.post(f"{self.url}/swarm/v1/admin/stop", headers={"Authorization": f"Bearer {admin}"}, timeout=10)
        except httpx.HTTPError:
            pass


def run_team(spec: RunConfig, resume: bool = False) -> dict:
    """Train every role of the team to `spec.steps` steps; the run's summary (also written on failure).

    `resume`: continue the team run in `spec.out` (`team_problems` checked it is this team): every
    server from its latest checkpoint, each role counted on from that checkpoint's step."""
    out = spec.out.resolve()
    spec = spec.model_copy(update={"out": out})
    out.mkdir(parents=True, exist_ok=True)
    if not resume and previous_run(out):
        raise RuntimeError(f"{out} holds an earlier run: clear it first (--fresh)")
    done = role_steps(out, members(spec)) if resume else {}
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    token, admin = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROOST_TOKEN": token, "ROOST_ADMIN_TOKEN": admin}
    servers = [_Server(m, spec, out, env) for m in members(spec)]
    team, _ = parse_team(spec.team or "")
    write_run_file(out, spec, member_config(spec, servers[0].member, out, 0, resume), {})  # for --resume
    metrics = {role: path for s in servers for role, path in role_metrics(out, s.member).items()}
    metrics = {role: metrics[role] for role in team}
    for s in servers:
        if s.member.shared:
            console.print(f"--team: {', '.join(s.member.roles)} share {s.member.model}: LoRA policies of one server")
    if resume:
        at = (f"{role} from step {done[role]}" if done[role] else f"{role} from its model" for role in team)
        console.print(f"--resume: {', '.join(at)}")
    t0 = time.monotonic()
    clients: dict[Path, subprocess.Popen] = {}
    alerts: FleetAlerts | None = None  # the fleets' failure lines, once they run
    try:
        with signals_interrupt():  # SIGTERM (a scheduler's cancel), SIGHUP: the cleanup below still runs
            try:
                first_step = {s.member.name: min(done.get(r, 0) for r in s.member.roles) + 1 for s in servers}
                for s in servers:
                    s.start(resume, first_step[s.member.name])
                with console.status(starting_line(spec.server.engine, logs, team=True)):
                    for s in servers:
                        s.wait_healthy(token)  # a resumed server has cut its metrics back to its checkpoint by now
                urls = {role: s.url for s in servers for role in s.member.roles}
                fleets = team_fleets(spec, {role: urls[role] for role in team})  # --team order
                first = member_config(spec, servers[0].member, out, servers[0].port, resume)
                write_run_file(out, spec, first, fleets)
                clients |= start_fleets(fleets, out, logs, env, (min(first_step.values()), spec.steps), resume)
                alerts = FleetAlerts(clients)
                stopped = None
                try:
                    _supervise(spec, servers, metrics, clients, alerts, token, t0, done)
                except ServerStopped as exc:  # one server was stopped: the others stop with it, a checkpoint each
                    stopped = exc
                for s in servers:
                    s.admin_stop(admin)
                _await_exits(servers)
                if stopped is not None:
                    raise stopped
            finally:
                for p in clients.values():
                    stop(p)
                if alerts is not None:
                    alerts.say(console)  # what the fleets said after the last look
                for s in servers:
                    if s.proc is not None:
                        stop(s.proc, grace=45.0)
    except BaseException as exc:
        write_summary(out, {**team_summary(spec, servers, metrics, time.monotonic() - t0, team), **ended(exc)})
        raise
    summary = team_summary(spec, servers, metrics, time.monotonic() - t0, team)
    write_summary(out, summary)
    return summary


def _supervise(
    spec: RunConfig,
    servers: list[_Server],
    metrics: dict[str, Path],
    clients: dict[Path, subprocess.Popen],
    alerts: FleetAlerts,
    token: str,
    t0: float,
    done: dict[str, int] | None = None,
) -> None:
    """Show each role's new rows (not those of the run's earlier part, `done`); restart a server that died
    (from its checkpoint) while the others go on; return once every role has `spec.steps` rows."""
    tails = {role: MetricsTail(path) for role, path in metrics.items()}
    printed = {role: (done or {}).get(role, 0) for role in metrics}
    while True:
        alerts.say(console)  # the team workflow failing: said at once (swarm/fleet_alerts.py)
        for role, tail in tails.items():
            rows = tail.poll()
            for r in rows[printed[role] :]:
                console.print(step_line(role, r, entropy=False))
            printed[role] = len(rows)  # a restarted server rewrites its file: rows lost with the crash go
        if all(n >= spec.steps for n in printed.values()):
            return
        for s in servers:
            assert s.proc is not None
            if s.proc.poll() is None:
                continue
            s.exits.append(s.proc.returncode)
            if s.proc.returncode == 0:  # it stopped cleanly (`swarm ctl stop`, a signal): asked, not died
                raise _stopped(s, printed, spec.steps)
            done = {role: printed[role] for role in s.member.roles}
            if s.restarts >= MAX_RESTARTS:
                raise RuntimeError(
                    f"server {s.member.name} died {s.restarts + 1} times (exit codes {s.exits}); see {s.log}:\n"
                    f"{log_tail(s.log)}"
                )
            s.restarts += 1
            console.print(
                f"[yellow]server {s.member.name} died[/yellow] (exit code {s.proc.returncode}) with steps "
                f"{done}: restarting it from its last checkpoint ({s.restarts} of {MAX_RESTARTS}); "
                "the other roles go on"
            )
            s.start(resume=True)
            s.wait_healthy(token)
        if all(c.poll() is not None for c in clients.values()):
            codes = sorted({c.returncode for c in clients.values()})
            if codes == [0] and (s := _stopping(servers)) is not None:  # the fleet ended as a server stops
                raise _stopped(s, printed, spec.steps)
            first = next(iter(clients))
            raise RuntimeError(
                f"every client process exited (exit code {', '.join(map(str, codes))}) with steps {printed} of "
                f"{spec.steps}; see {first}:\n{log_tail(first)}"
            )
        if time.monotonic() - t0 > spec.timeout_s:
            raise TimeoutError(f"the team did not reach {spec.steps} steps per role in {spec.timeout_s:.0f}s")
        time.sleep(0.5)


def _stopping(servers: list[_Server], wait_s: float = 60.0) -> _Server | None:
    """The server that is exiting cleanly (a stop finishes its step and writes its checkpoint first), if one
    does within `wait_s`; the fleet's clients leave as soon as a server says it is stopping."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for s in servers:
            assert s.proc is not None
            if s.proc.poll() is not None:
                return s if s.proc.returncode == 0 else None
        time.sleep(0.2)
    return None


def _stopped(server: _Server, printed: dict[str, int], steps: int) -> ServerStopped:
    done = ", ".join(f"{role} {n}" for role, n in printed.items())
    return ServerStopped(done, steps, f"server {server.member.name}", "each server's")


def _await_exits(servers: list[_Server], stop_s: float = 90.0) -> None:
    """Every server, asked to stop, exits by itself after its last checkpoint; else the run failed."""
    deadline = time.monotonic() + stop_s
    with console.status("servers: saving their last checkpoints…"):
        for s in servers:
            assert s.proc is not None
            while s.proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server {s.member.name} did not exit within {stop_s:.0f}s of the stop")
                time.sleep(0.2)


def team_summary(
    spec: RunConfig, servers: list[_Server], metrics: dict[str, Path], wall_s: float, team: dict[str, str]
) -> dict:
    """summary.json of a team: the run's numbers as `swarm train` gives them (rewards: the mean of the
    roles'), a section per role (its model, server, rewards, steps, MLflow run) and per server."""
    per = {role: summarize(read_metrics(path), wall_s, spec) for role, path in metrics.items()}
    base = combine_roles(per)
    server_of = {role: s for s in servers for role in s.member.roles}
    roles = {}
    for role, p in per.items():
        s = server_of[role]
        run_file = role_dir(spec.out, s.member, role) / MLFLOW_RUN_FILE
        roles[role] = {
            "model": team[role],
            "model_dir": str(s.member.model),
            "server": s.member.name,
            "metrics": str(metrics[role].relative_to(spec.out)),
            **{k: p[k] for k in ("reward_first_mean", "reward_last_mean", "steps_done", "families", "timing")},
            "restarts": s.restarts,
        }
        if run_file.exists():
            roles[role]["mlflow"] = json.loads(run_file.read_text())
    return {
        **base,
        "team": dict(team),
        "model": None,
        "metrics": {role: r["metrics"] for role, r in roles.items()},
        "roles": roles,
        "servers": {
            s.member.name: {
                "roles": list(s.member.roles),
                "model_dir": str(s.member.model),
                "out": str((spec.out / SERVERS / s.member.name).relative_to(spec.out)),
                "log": str(s.log.relative_to(spec.out)),
                "restarts": s.restarts,
                "exit_codes": s.exits,
            }
            for s in servers
        },
        "wall_s": round(wall_s, 2),
    }


__all__ = [
    "MAX_RESTARTS",
    "TEAM_CHECKPOINT_EVERY",
    "Member",
    "member_config",
    "role_metrics",
    "run_team",
    "team_fleets",
    "team_summary",
]
