"""Where a run folder keeps each policy or role: the layouts the readers of runs walk.

`swarm eval` (a team's checkpoints) and `swarm inspect` (a rollout log) both look for the folder of
one policy or role in whatever a run left. The writers lay them out like this:

    OUT/server/policies/ROLE           swarm train --shared-base (one server of LoRA policies)
    OUT/policies/ROLE                  a server's own --out, with --policy
    OUT/servers/A+B/policies/ROLE      swarm train --team: a server per base, several roles on it
    OUT/servers/ROLE                   swarm train --team: a role alone on its model

`run_summary` reads the summary a run's driver writes at its end (`swarm train`'s checks, `swarm eval`);
`MetricsTail` a server's growing `metrics.jsonl`, a complete row per trained step (the server's own
check for an earlier run, `swarm train` following its run, the summary counting its steps);
`server_address` a running server's URL and tokens from its out folder (`swarm train --attach`, `swarm ctl
--server`).

Pure paths (no torch): `swarm inspect` reads runs on machines without it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the settings a `swarm train` run ran with, in its folder (swarm/run_checks.py writes and reads it)
RUN_FILE = "run.yaml"
#: The layouts of a policy's (or team role's) folder under a run folder, in the order they are looked at.
ROLE_FOLDERS = ("server/policies/{role}", "policies/{role}", "servers/*/policies/{role}", "servers/{role}")


def role_folders(run_dir: Path, role: str = "*") -> list[Path]:
    """The folders under `run_dir` that hold `role` (every policy or role: "*"), in ROLE_FOLDERS' order.

    With "*" a team's shared server (`servers/A+B`) is listed too: the callers keep the folders that
    hold what they look for (checkpoints, a rollout log)."""
    return [folder for where in ROLE_FOLDERS for folder in sorted(Path(run_dir).glob(where.format(role=role)))]


def server_of(folder: Path) -> Path:
    """The server folder that holds a policy's folder (its `config.yaml` names the model it started from)."""
    return folder.parent.parent if folder.parent.name == "policies" else folder


def run_summary(out: Path) -> dict[str, Any] | None:
    """The `summary.json` a run's driver wrote into `out` at its end (None without a readable one)."""
    try:
        summary = json.loads((Path(out) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


#: what a server writes into its out folder once bound (its URL, pid, model, policies) ...
SERVER_FILE = "server.json"
#: ... and the tokens it generated (mode 0600); tokens it was given are not there
SECRETS_FILE = "secrets.json"


@dataclass(frozen=True)
class ServerAddress:
    folder: Path
    url: str
    token: str | None
    admin_token: str | None
    pid: int | None = None  # the process that wrote server.json (gone once its run has ended)


def server_address(folder: Path) -> ServerAddress:
    """A running server's URL and tokens from its out folder, or from a `swarm train` run folder (its
    `server/`). Tokens the server was given rather than generated come from ROOST_TOKEN and
    ROOST_ADMIN_TOKEN (None where neither has them). ValueError naming what is missing."""
    folder = Path(folder)
    if not (folder / SERVER_FILE).exists() and (folder / "server" / SERVER_FILE).exists():
        folder = folder / "server"
    try:
        written = json.loads((folder / SERVER_FILE).read_text())
        url = written["url"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        team = sorted(p.name for p in (folder / "servers").glob("*") if (p / SERVER_FILE).exists())
        if team:  # a --team run: a server per model
            raise ValueError(
                f"{folder} is a run of several servers: give one, {' or '.join(team)} under servers/"
            ) from None
        raise ValueError(
            f"{folder} is not the out folder of a started `swarm serve` (its {SERVER_FILE}: {exc})"
        ) from None
    try:
        secrets = json.loads((folder / SECRETS_FILE).read_text())
    except (OSError, ValueError):
        secrets = {}
    return ServerAddress(
        folder,
        url,
        secrets.get("token") or os.environ.get("ROOST_TOKEN"),
        secrets.get("admin_token") or os.environ.get("ROOST_ADMIN_TOKEN"),
        written.get("pid") if isinstance(written.get("pid"), int) else None,
    )


class MetricsTail:
    """The rows of a growing `metrics.jsonl`, read incrementally: each poll parses only the lines
    appended since the last (a long run's file is re-read whole only if it shrank, as a
    recovering server rewrites it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict] = []
        self._offset = 0

    def poll(self) -> list[dict]:
        try:
            with self.path.open("rb") as f:
                if f.seek(0, 2) < self._offset:
                    self.rows, self._offset = [], 0
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self.rows
        end = data.rfind(b"\n") + 1  # a line being written right now waits for the next poll
        for line in data[:end].splitlines():
            try:
                self.rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        self._offset += end
        return self.rows


def read_metrics(path: Path) -> list[dict]:
    """The complete rows of a metrics file (none when there is no file)."""
    return MetricsTail(path).poll()


__all__ = [
    "MetricsTail",
    "ROLE_FOLDERS",
    "SECRETS_FILE",
    "SERVER_FILE",
    "ServerAddress",
    "read_metrics",
    "role_folders",
    "run_summary",
    "server_address",
    "server_of",
]
