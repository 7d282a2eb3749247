"""`swarm ctl`: operate a running swarm server (admin token).

    swarm ctl --url http://127.0.0.1:8000 --admin-token T get
    swarm ctl set lr=1e-4 temperature=0.8 batch_groups=8
    swarm ctl set quota.math=0.5 quota.code=0.5        # replaces the quotas; `quotas=null` clears them
    swarm ctl set 'quota_schedule=[{"from_step": 0, "quotas": {"math": 1}}]'
    swarm ctl pause | resume | checkpoint | stop | status
    swarm ctl --policy planner set lr=1e-4             # one policy of a server of several
    swarm ctl status --policy planner                  # --policy before or after the command
    swarm ctl status --url http://10.0.0.5:8000        # so are --url, --admin-token and --timeout
    swarm ctl --server runs/train set lr=1e-4          # a `swarm train` run's server: URL and token from its folder
    swarm ctl policy add critic lora_rank=16 lr=5e-5   # a new LoRA policy on the running server's base
    swarm ctl policy add critic --lora-rank 16         # settings as serve's flags do as well
    swarm ctl policy remove critic | policy list

`--url` and `--admin-token` default to ROOST_URL and ROOST_ADMIN_TOKEN; `--server DIR` reads both
from a server's out folder (`server.json`, `secrets.json`), which is how a `swarm train` run's server,
on a port and with tokens of its choosing, is reached. Values
are parsed as JSON when they parse (numbers, null, lists, objects), else taken
as strings; the server validates them (400 with the reason otherwise). What
each setting does and when it takes effect: `swarm/server/control.py`.
Imports no torch: runs anywhere the client SDK runs.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from store.options_anywhere import ParameterSource, options_anywhere
from swarm.config.train import TrainConfig
from swarm.run_layout import ServerAddress, server_address
from swarm.server.admin_schema import LiveConfigUpdate

#: exit status of a request the server refused, by HTTP status: 2 where the command line can fix it (a bad
#: value, a wrong token, a name the server does not know), as for typer's own usage errors; 1 otherwise
#: (the server's state refuses it now, 409/429; it failed, 5xx; it could not be reached)
FIX_THE_COMMAND = (400, 401, 403, 404)

EXIT_CODES = (
    "Exit status: 0 done; 2 the command line was refused, here or by the server (a bad value 400, a wrong token "
    "401/403, a policy or name it does not know 404): fix the command; 1 the server could not do it (its state, "
    "409/429; a failure, 5xx) or could not be reached."
)


app = typer.Typer(
    cls=options_anywhere(with_value=("--url", "--admin-token", "--server", "--timeout")),
    help="Operate a running swarm server: live config, pause/resume, checkpoint, stop.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
)

ALIASES = {"kl": "kl_coef", "temp": "temperature", "B": "batch_groups", "batch-groups": "batch_groups"}


def alive(pid: int) -> bool:
    """Whether a process of that number exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Ctx:
    def __init__(
        self, url: str, token: str | None, timeout: float, policy: str | None = None, token_from: str = "--admin-token"
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.policy = policy
        self.token_from = token_from  # where the token came from, for a refusal of it
        self.address: ServerAddress | None = None  # with --server: the folder it was read from

    def call(self, method: str, path: str, body: Any = None) -> dict:
        if not self.token:  # checked here, not in the callback, so `--help` of every command works without one
            held = ""
            if self.address is not None:
                held = f"; {self.address.folder}/secrets.json holds none (a server given its tokens keeps them)"
            raise typer.BadParameter(
                "an admin token is required (--admin-token or ROOST_ADMIN_TOKEN)" + held,
                param_hint="--admin-token",
            )
        import httpx  # lazy: `swarm --help` mounts this CLI and should not pay for an HTTP stack

        try:
            r = httpx.request(
                method,
                f"{self.url}/swarm/v1{path}",
                params={"policy": self.policy} if self.policy else None,
                json=body,
                timeout=self.timeout,
                headers={"Authorization": f"Bearer {self.token}"},
            )
        except httpx.HTTPError as exc:
            pid = self.address.pid if self.address else None
            gone = f" (its server, pid {pid}, is not running: its run has ended)" if pid and not alive(pid) else ""
            typer.echo(f"cannot reach {self.url}: {exc}{gone}", err=True)
            raise typer.Exit(1) from None
        try:
            data = r.json()
        except ValueError:
            data = {"raw": r.text[:2000]}
        if r.status_code >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            typer.echo(f"{r.status_code} {err.get('code') or ''}: {self.refusal(r.status_code, err) or data}", err=True)
            raise typer.Exit(2 if r.status_code in FIX_THE_COMMAND else 1)
        return data

    def refusal(self, status: int, err: dict) -> str | None:
        """The server's message, said in ctl's terms where ctl knows more: it always sends the admin token
        (the server's `status` route, open to workers too, calls a wrong one "neither token"), and a server
        without policies (`policies: []` in its 404) serves only its model when `--policy` names another."""
        if status == 401:
            return (
                f"the admin token ({self.token_from}) is not this server's: the one it was started with "
                "(swarm serve --admin-token) or its OUT/secrets.json (swarm ctl --server OUT reads it)"
            )
        if status == 404 and err.get("code") == "model_not_found" and self.policy and err.get("policies") == []:
            return (
                f"no policy {self.policy!r}: this server has no policies (started without --policy); leave --policy out"
            )
        return err.get("message")


#: `--policy` after the command too (`swarm ctl status --policy b`), as well as before it
_POLICY = typer.Option(None, "--policy", help="the policy to operate, on a server of several (default: its first)")


def _on(ctx: typer.Context, policy: str | None) -> _Ctx:
    """The context, aimed at the policy named after the command where one is; two different names are an error."""
    obj: _Ctx = ctx.obj
    if policy is not None:
        if obj.policy is not None and obj.policy != policy:
            raise typer.BadParameter(
                f"two policies named: {obj.policy!r} before the command and {policy!r} after it", param_hint="--policy"
            )
        obj.policy = policy
    return obj


def _echo(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def as_pairs(items: list[str]) -> list[str]:
    """`--lora-rank 8`, `--lora-rank=8` -> `lora_rank=8`; `--no-merge` -> `merge=false`: settings written as
    `swarm serve` and `swarm train` take their flags, which is what a user types first."""
    out: list[str] = []
    rest = iter(items)
    for item in rest:
        if not item.startswith("--") or len(item) == 2:
            out.append(item)
            continue
        key, sep, value = item[2:].partition("=")
        key = key.replace("-", "_")
        if not sep and key.startswith("no_"):
            out.append(f"{key[3:]}=false")
            continue
        if not sep:
            value = next(rest, None)  # type: ignore[assignment]
            if value is None or value.startswith("--"):
                raise typer.BadParameter(f"{item} needs a value: {item} VALUE, or {key}=VALUE")
        out.append(f"{key}={value}")
    return out


def parse_settings(items: list[str]) -> dict[str, Any]:
    """`["lr=1e-4", "quota.math=0.5"]` (or `--lr 1e-4 --quota.math 0.5`) -> {"lr": 0.0001, "quotas": {"math": 0.5}}."""
    out: dict[str, Any] = {}
    for item in as_pairs(items):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if key.startswith("quota.") or key.startswith("quotas."):
            family = key.split(".", 1)[1]
            if not family:
                raise typer.BadParameter(f"expected quota.FAMILY=SHARE, got {item!r}")
            quotas = out.setdefault("quotas", {})
            if not isinstance(quotas, dict):
                raise typer.BadParameter("give quotas=... or quota.FAMILY=..., not both")
            quotas[family] = value
            continue
        out[ALIASES.get(key, key)] = value
    return out


@app.callback()
def main(
    ctx: typer.Context,
    url: str = typer.Option("http://127.0.0.1:8000", "--url", envvar="ROOST_URL", help="swarm server URL"),
    admin_token: str = typer.Option(None, "--admin-token", envvar="ROOST_ADMIN_TOKEN", help="the server's admin token"),
    server: Path = typer.Option(
        None,
        "--server",
        file_okay=False,
        help="the server's out folder, or a `swarm train` run folder: its URL and generated admin token from there",
    ),
    timeout: float = typer.Option(30.0, "--timeout", min=0.1, help="seconds per request"),
    policy: str = typer.Option(
        None, "--policy", help="the policy to operate, on a server of several (default: its first)"
    ),
) -> None:
    from_env = ctx.get_parameter_source("admin_token") == ParameterSource.ENVIRONMENT
    token_from = "ROOST_ADMIN_TOKEN" if from_env else "--admin-token"
    if server is not None:  # `swarm train` picks a free port and generates the tokens: they are in its folder
        if ctx.get_parameter_source("url") == ParameterSource.COMMANDLINE:
            raise typer.BadParameter("give --url or --server, not both", param_hint="--server")
        try:
            address = server_address(server)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--server") from None
        url = address.url
        if ctx.get_parameter_source("admin_token") != ParameterSource.COMMANDLINE and address.admin_token:
            admin_token = address.admin_token
            token_from = f"the secrets.json of {server}"
    ctx.obj = _Ctx(url, admin_token, timeout, policy, token_from)
    ctx.obj.address = address if server is not None else None


@app.command("get")
def get(ctx: typer.Context, policy: str = _POLICY) -> None:
    """Live settings, pending ones (next window), quotas and slots."""
    _echo(_on(ctx, policy).call("GET", "/admin/config"))


def _settings_help() -> str:
    """Every live setting, from the server's own request model (so a new one is listed without an edit here)."""
    lines = [
        "Change live settings (lr, temperature, quotas...): KEY=VALUE ... or --key VALUE.",
        "",
        "The settings:",
        "",
    ]
    lines += [f"- {name}: {info.description or ''}" for name, info in LiveConfigUpdate.model_fields.items()]
    aliases = ", ".join(f"{a}={n}" for a, n in ALIASES.items())
    return "\n".join([*lines, "", f"Aliases: {aliases}; quota.FAMILY=SHARE sets one family's share."])


#: `--lr 1e-4` reaches the KEY=VALUE list instead of "No such option" (`as_pairs` reads it)
FLAGS_AS_SETTINGS = {"ignore_unknown_options": True}


@app.command("set", help=escape(_settings_help()), context_settings=FLAGS_AS_SETTINGS)
def set_(
    ctx: typer.Context,
    settings: list[str] = typer.Argument(..., help="KEY=VALUE ... (or --key VALUE)"),
    policy: str = _POLICY,
) -> None:
    data = _on(ctx, policy).call("POST", "/admin/config", parse_settings(settings))
    _echo({"changed": data.get("changed"), "live": data.get("live"), "pending": data.get("pending")})


@app.command("pause")
def pause(ctx: typer.Context, policy: str = _POLICY) -> None:
    """Refuse new claims (429) until resume; running episodes finish and train."""
    _echo(_on(ctx, policy).call("POST", "/admin/pause"))


@app.command("resume")
def resume(ctx: typer.Context, policy: str = _POLICY) -> None:
    """Let claims in again."""
    _echo(_on(ctx, policy).call("POST", "/admin/resume"))


@app.command("checkpoint")
def checkpoint(ctx: typer.Context, policy: str = _POLICY) -> None:
    """Write a checkpoint now (after a running step)."""
    _echo(_on(ctx, policy).call("POST", "/admin/checkpoint"))


@app.command("stop")
def stop(ctx: typer.Context, policy: str = _POLICY) -> None:
    """Stop the server: refuse new work, finish a running step, checkpoint, exit."""
    _echo(_on(ctx, policy).call("POST", "/admin/stop"))


@app.command("status")
def status(ctx: typer.Context, policy: str = _POLICY) -> None:
    """Step, policy version, groups, counters, paused, quotas."""
    _echo(_on(ctx, policy).call("GET", "/status"))


policy_app = typer.Typer(
    help="Policies of a server of several (swarm serve --policy): add, remove, list.", no_args_is_help=True
)
app.add_typer(policy_app, name="policy")

#: KEY=VALUE of `policy add` that are not training knobs: where each goes in the PolicySpec
_SPEC_KEYS = {"group_size", "batch_groups", "max_staleness", "max_steps", "temperature", "seed"}
_LORA_KEYS = {"lora_rank": "rank", "lora_alpha": "alpha", "lora_targets": "targets", "lora_dropout": "dropout"}


def policy_spec(name: str, items: list[str]) -> dict[str, Any]:
    """`("critic", ["lora_rank=16", "lr=5e-5", "B=2"])` -> the PolicySpec body the server validates.

    A key none of the three kinds knows is refused here, with the one meant: these names are this
    command's own (`lora_rank`), so the server, which sees the body's, could only say `train.lora_rnak`."""
    spec: dict[str, Any] = {"name": name}
    known = [*_LORA_KEYS, *sorted(_SPEC_KEYS), *TrainConfig.model_fields, "quotas"]
    for key, value in parse_settings(items).items():
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(known)}"
            raise typer.BadParameter(f"{key}: not a policy setting; {hint}", param_hint="SETTINGS")
        if key in _LORA_KEYS:
            spec.setdefault("lora", {})[_LORA_KEYS[key]] = value
        elif key in _SPEC_KEYS:
            spec[key] = value
        elif key == "quotas":
            raise typer.BadParameter("quotas are set per policy with `swarm ctl --policy NAME set quota.F=S`")
        else:
            spec.setdefault("train", {})[key] = value
    return spec


@policy_app.command("add", context_settings=FLAGS_AS_SETTINGS)
def policy_add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="the new policy's name (its `model` in requests)"),
    settings: list[str] = typer.Argument(
        None,
        help="KEY=VALUE (or --key VALUE): lora_rank, lora_alpha, lora_targets, lora_dropout, group_size, batch_groups, "
        "max_staleness, max_steps, temperature, seed, or a training knob (lr, kl_coef, clip_eps...); "
        "default: the server's",
    ),
) -> None:
    """Add a LoRA policy to the running server (a name whose folder holds checkpoints resumes them)."""
    _echo(ctx.obj.call("POST", "/admin/policies", policy_spec(name, settings or [])))


@policy_app.command("remove")
def policy_remove(ctx: typer.Context, name: str = typer.Argument(..., help="the policy to remove")) -> None:
    """Stop a policy (its step ends, its last steps are checkpointed) and free its adapter."""
    _echo(ctx.obj.call("DELETE", f"/admin/policies/{name}"))


@policy_app.command("list")
def policy_list(ctx: typer.Context) -> None:
    """Every policy: step, policy version, out folder, LoRA rank."""
    _echo(ctx.obj.call("GET", "/admin/policies"))
