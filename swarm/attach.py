"""`swarm train --attach SERVER_OUT`: a run as one more policy of a running server on a shared base.

    swarm serve --lora-rank 8 --policy base --port 0 --out runs/base        # once: the shared base
    swarm train --attach runs/base --policy lr-a --lr 3e-3 --out runs/lr-a   # then any number of runs
    swarm train --attach runs/base --policy lr-b --lr 1e-3 --out runs/lr-b   # ... at the same time

Why: a study's trials differ in a few knobs on one base model. As policies of one server they
share the base's memory and its forward passes (rows of every policy batch together), and a run
starts no server, loads no torch and logs no model: on a small machine most of a short trial's
wall time was exactly that. `researcher study --shared-base` runs its trials this way.

The server is found through its out folder: `server.json` (the URL it bound) and `secrets.json`
(its tokens, mode 0600), both written by `swarm serve`; tokens the server was given rather than
generated are not there, and come from ROOST_TOKEN and ROOST_ADMIN_TOKEN. The run adds its policy through the admin
API (`PolicySpec`: its lr and the other step knobs, group and batch shape, LoRA, temperature, seed,
and `max_steps` = --steps, at which the policy stops itself), runs its client fleet here, follows
the policy's metrics, then removes the policy (its last steps checkpointed in the server's
`policies/NAME` folder) and writes `metrics.jsonl` and `summary.json` into --out as `swarm train`
does. A run whose policy is still on the server (its earlier process died) adopts it and goes on;
one whose folder holds checkpoints resumes from them. What a policy cannot change (the base model,
the engine) must be the server's: refused before anything starts. The server's other settings
(merge, leases, MLflow...) are the server's; the run's own values of those are not used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from swarm.children import signals_interrupt, stop
from swarm.config.policies import PolicySpec
from swarm.config.run import RunConfig, write_run_file
from swarm.config.server import ServerConfig
from swarm.fleet_alerts import FleetAlerts
from swarm.run_checks import read_metrics
from swarm.run_layout import SECRETS_FILE, server_address
from swarm.run_summary import ended, summarize, write_summary
from swarm.train import console, fleet_configs, follow, start_fleets

#: what an attached run writes into its --out (the policy's own rows, copied from the server's folder)
ATTACHED_METRICS = "metrics.jsonl"


class NoTokens(ValueError):
    """The server's tokens are neither in its secrets.json nor in the environment: waiting cannot help."""


@dataclass(frozen=True)
class SharedServer:
    """A running `swarm serve` of policies, as its out folder describes it."""

    out: Path
    url: str
    token: str
    admin_token: str
    config: ServerConfig

    @classmethod
    def find(cls, out: Path) -> SharedServer:
        """The server whose out folder is `out`; ValueError saying what is missing (NoTokens: its tokens)."""
        try:
            address = server_address(out)  # its ValueError names the folder and the file already
        except ValueError as exc:
            raise ValueError(f"--attach: {exc}") from None
        try:
            config = ServerConfig.model_validate(_yaml(address.folder / "config.yaml"))
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"--attach: {address.folder} is not the out folder of a running `swarm serve` (its config.yaml: {exc})"
            ) from None
        if not address.token or not address.admin_token:
            missing = [
                n for n, v in (("ROOST_TOKEN", address.token), ("ROOST_ADMIN_TOKEN", address.admin_token)) if not v
            ]
            raise NoTokens(
                f"--attach: the server of {out} was given its own tokens (they are not in its {SECRETS_FILE}): "
                f"set {' and '.join(missing)} to them"
            )
        return cls(address.folder, address.url, address.token, address.admin_token, config)

    @classmethod
    def wait(cls, out: Path, timeout_s: float = 300.0) -> SharedServer:
        """The server once it answers: a study submits its server and its trials together, so a trial may
        start first. ValueError at once when `out` is no folder at all (a typo), else after `timeout_s`."""
        if not out.is_dir():
            raise ValueError(f"--attach: {out} is not the out folder of a running `swarm serve` (no such folder)")
        end = time.monotonic() + timeout_s
        if not console.is_terminal:  # a log: the spinner below shows nothing there, and the wait may be minutes
            console.print(f"waiting for the server of {out} to answer (up to {timeout_s:.0f} s)")
        # one client for every try: building one costs ~20 ms of CPU (its TLS context), more than the request
        with console.status(f"waiting for the server of {out}…"), httpx.Client(timeout=5.0) as http:
            while True:
                try:
                    found = cls.find(out)
                    if http.get(f"{found.url}/health").status_code == 200:
                        return found
                    problem = f"{found.url} does not answer /health"
                except NoTokens:
                    raise
                except ValueError as exc:
                    problem = str(exc)
                except httpx.HTTPError as exc:
                    problem = f"its server does not answer: {exc}"
                if time.monotonic() > end:
                    raise ValueError(f"{problem} (waited {timeout_s:.0f}s)")
                time.sleep(0.5)

    def admin(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.url}/swarm/v1/admin{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=120.0,  # removing a policy waits for its step and its last checkpoint
        )

    def metrics(self, policy: str) -> Path:
        return self.out / "policies" / policy / "metrics.jsonl"


def _yaml(path: Path) -> dict:
    import yaml  # lazy: only an attached run reads the server's settings

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds no settings")
    return data


class _Alive:
    """The server's liveness as `follow` asks a process for it: `poll()` is None while /health answers.

    Three misses in a row over 10 s or more count as gone (a loaded machine can miss one). It asks twice
    a second for the whole run, so through one client: a new one per ask cost ~20 ms of CPU (its TLS
    context), 4 % of a core per attached run."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.returncode: int | None = None
        self._missed_since: float | None = None
        self._misses = 0
        self._http = httpx.Client(timeout=5.0)

    def close(self) -> None:
        self._http.close()

    def poll(self) -> int | None:
        try:
            ok = self._http.get(f"{self.url}/health").status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            self._missed_since, self._misses = None, 0
            return None
        self._misses += 1
        self._missed_since = self._missed_since or time.monotonic()
        if self._misses >= 3 and time.monotonic() - self._missed_since >= 10.0:
            self.returncode = 1
        return self.returncode


def policy_name(spec: RunConfig) -> str:
    """The run's policy on the server: --policy, else the --out folder's name."""
    return spec.policy or Path(spec.out).name


def policy_spec(spec: RunConfig, name: str) -> PolicySpec:
    """What the run asks of its policy: the run's step knobs, shape, adapter, temperature and seed."""
    s = spec.server
    return PolicySpec(
        name=name,
        lora=s.lora if s.lora.enabled else None,  # none given: the server's adapter settings
        train=s.train.model_dump(mode="json"),
        group_size=1 if spec.grouped else s.group_size,  # a group call samples the group in one episode
        batch_groups=s.batch_groups,
        max_staleness=s.max_staleness,
        max_steps=spec.steps,
        temperature=s.temperature,
        seed=s.seed,
    )


def base_problems(spec: RunConfig, server: ServerConfig) -> list[str]:
    """What the run asks that a policy of `server` cannot have: another base model or engine."""
    found = []
    mine, theirs = Path(spec.server.model_dir).resolve(), Path(server.model_dir).resolve()
    if mine != theirs:
        found.append(f"--model: the server at --attach trains {theirs}, not {mine} (a policy shares its base)")
    if spec.server.engine != server.engine:
        found.append(f"--engine: the server at --attach runs {server.engine.value}, not {spec.server.engine.value}")
    return found


class Refused(ValueError):
    """The run cannot attach (no server at the folder, another base): nothing was added or started."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def run_attached(spec: RunConfig) -> dict:
    """Train this run's policy on the server at `spec.attach` to `spec.steps` steps; its summary.

    `Refused` before anything is added to the server or started here."""
    assert spec.attach is not None
    out = Path(spec.out).resolve()
    spec = spec.model_copy(update={"out": out})
    try:
        shared = SharedServer.wait(Path(spec.attach).resolve())
    except ValueError as exc:
        raise Refused([str(exc)]) from None
    problems = base_problems(spec, shared.config)
    if problems:
        raise Refused(problems)
    name = policy_name(spec)
    wanted = policy_spec(spec, name)
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    added = shared.admin("POST", "/policies", wanted.model_dump(mode="json", exclude_none=True))
    code = added.json().get("error", {}).get("code") if added.status_code >= 400 else None
    if code == "policy_exists":  # its earlier process died: the policy and what it collected go on
        console.print(f"policy {name} is on the server already: going on with it")
    elif added.status_code != 200:
        raise RuntimeError(f"the server refused policy {name}: {added.status_code} {added.text[:500]}")
    fleets = {log: f.model_copy(update={"policy": name}) for log, f in fleet_configs(spec, shared.url)}
    served = shared.config.for_policy(wanted)
    write_run_file(out, spec, served, fleets)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROOST_TOKEN": shared.token}
    t0 = time.monotonic()
    clients: dict[Path, subprocess.Popen] = {}
    metrics = shared.metrics(name)
    removed: str | None = None
    alerts: FleetAlerts | None = None  # the fleets' failure lines, once they run
    try:
        with signals_interrupt():  # a cancelled trial (SIGTERM), SIGHUP: its fleet stopped, its policy removed
            try:
                clients |= start_fleets(fleets, out, logs, env, (1, spec.steps), resume=False)
                alerts = FleetAlerts(clients)
                alive = _Alive(shared.url)
                try:
                    follow(spec, shared.url, shared.token, alive, {"": metrics}, t0, clients, alerts)  # type: ignore[arg-type]
                finally:
                    alive.close()
            finally:
                for p in clients.values():
                    stop(p)
                if alerts is not None:  # a short run can end before a failure's line was read
                    alerts.say(console)
                removed = _remove(shared, name)
                if metrics.exists():
                    shutil.copyfile(metrics, out / ATTACHED_METRICS)
    except BaseException as exc:
        _write_summary(spec, shared, name, removed, t0, exc)
        raise
    return _write_summary(spec, shared, name, removed, t0)


def _write_summary(
    spec: RunConfig, shared: SharedServer, name: str, removed: str | None, t0: float, exc: BaseException | None = None
) -> dict:
    """summary.json as `swarm train` writes it, its rows from the policy's own metrics, and where it ran."""
    out = Path(spec.out)
    summary = {
        **summarize(read_metrics(out / ATTACHED_METRICS), time.monotonic() - t0, spec),
        "metrics": ATTACHED_METRICS,
        "attached": {"server": str(shared.out), "url": shared.url, "policy": name, "checkpoint": removed},
    }
    if exc is not None:
        summary |= ended(exc)
    write_summary(out, summary)  # with the workflow's failures, as `swarm train` writes it
    return summary


def _remove(shared: SharedServer, name: str) -> str | None:
    """Take the policy off the server (its last steps checkpointed); its checkpoint's path, or None."""
    try:
        r = shared.admin("DELETE", f"/policies/{name}")
    except httpx.HTTPError as exc:
        console.print(f"[yellow]warning[/yellow]: could not remove policy {name} from {shared.url}: {exc}")
        return None
    if r.status_code != 200:
        console.print(f"[yellow]warning[/yellow]: removing policy {name}: {r.status_code} {r.text[:300]}")
        return None
    return r.json().get("path")


__all__ = ["ATTACHED_METRICS", "Refused", "SharedServer", "base_problems", "policy_name", "policy_spec", "run_attached"]
