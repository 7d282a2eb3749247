"""In-job supervisors that connect swarm servers and client fleets through the store.

Why a supervisor process (and not a one-shot "register" step after `swarm serve`)? The
job has to keep doing things for as long as the server lives: heartbeat the
`swarm_servers` row (a stale heartbeat is how others learn a server died), and mark it
STOPPED/DOWN when the server exits. It runs unchanged under the local backend and
Slurm (both just run an argv), and `swarm serve` stays ignorant of the store.

    python -m scheduler.register serve --name trial-7 --out OUT -- swarm serve --port 0 --out OUT ...

  starts the server, waits for OUT/server.json (written by `swarm serve`, which binds
  port 0 itself, so no port race), polls GET /swarm/v1/status with the worker token
  (env ROOST_TOKEN) until it answers 200, writes the URL into `swarm_servers` (status
  UP, `job_id` = env ROOST_JOB_ID), heartbeats every `--heartbeat` s, and when the
  server exits records STOPPED (exit 0) or DOWN and exits with the server's code.

    python -m scheduler.register client --name trial-7 --clients 2 --seed 3 -- \\
        swarm client --url {url} --seed {seed} --task arith ...

  waits until the store has an UP server of that name with a fresh heartbeat, then runs
  N copies of the command with `{url}`, `{i}` (0..N-1) and `{seed}` (seed*1000+i: each
  client its own slice of the dataset) filled in. The fleet lives as long as its
  server: when the server row turns STOPPED (training done) the clients are stopped
  and the fleet exits 0; when it turns DOWN the fleet exits 1.

SIGTERM/SIGINT (cancel, time limit) are forwarded to the children.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger("scheduler.register")

ENV_TOKEN = "ROOST_TOKEN"
ENV_JOB_ID = "ROOST_JOB_ID"


class _Stop:
    requested = False


def _on_signal(signum: int, _frame: Any) -> None:
    _Stop.requested = True


def _engine(db_url: str | None) -> Any:
    from store.db import init_db

    return init_db(db_url)


def _public_url(url: str) -> str:
    """A URL others can reach: a wildcard bind address becomes this host's name."""
    for wildcard in ("0.0.0.0", "[::]"):
        if f"//{wildcard}:" in url:
            return url.replace(wildcard, socket.getfqdn(), 1)
    return url


def _terminate(procs: list[subprocess.Popen[bytes]], wait_s: float = 20.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + wait_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---------------------------------------------------------------- server side


def _set_server(engine: Any, row_id: int | None, **fields: Any) -> int:
    from store.db import session_scope
    from store.models import SwarmServer

    with session_scope(engine) as s:
        row = s.get(SwarmServer, row_id) if row_id is not None else None
        if row is None:
            row = SwarmServer()
        for k, v in fields.items():
            setattr(row, k, v)
        s.add(row)
        s.flush()
        assert row.id is not None
        return row.id


def _healthy(url: str, token: str | None) -> bool:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.get(f"{url}/swarm/v1/status", headers=headers, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _read_url(out: Path, since: float) -> str | None:
    path = out / "server.json"
    try:
        if path.stat().st_mtime < since - 1:
            return None  # a previous run's file
        return str(json.loads(path.read_text())["url"])
    except (FileNotFoundError, ValueError, KeyError):
        return None


def serve(args: argparse.Namespace, cmd: list[str]) -> int:
    from store.models import ServerStatus
    from store.types import utcnow

    engine = _engine(args.db)
    token = os.environ.get(ENV_TOKEN)
    job_id = int(os.environ[ENV_JOB_ID]) if os.environ.get(ENV_JOB_ID, "").isdigit() else None
    out = Path(args.out)
    (out / "server.json").unlink(missing_ok=True)
    row = _set_server(engine, None, name=args.name, model=args.model or "", job_id=job_id,
                      status=ServerStatus.STARTING.value)
    started = time.time()
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    url: str | None = None
    next_beat = 0.0
    deadline = time.monotonic() + args.health_timeout
    while True:
        rc = child.poll()
        if rc is not None:
            status = ServerStatus.STOPPED if rc == 0 else ServerStatus.DOWN
            _set_server(engine, row, status=status.value)
            log.info("server exited with code %s; marked %s", rc, status.value)
            return rc
        if _Stop.requested:
            log.info("stop requested; stopping the server")
            _set_server(engine, row, status=ServerStatus.DRAINING.value)
            _terminate([child])
            _set_server(engine, row, status=ServerStatus.STOPPED.value)
            return 143
        now = time.monotonic()
        if url is None:
            found = _read_url(out, started)
            if found and _healthy(found, token):
                url = _public_url(found)
                _set_server(engine, row, url=url, status=ServerStatus.UP.value, last_heartbeat=utcnow())
                log.info("server %s is up at %s", args.name, url)
                next_beat = now + args.heartbeat
            elif now > deadline:
                log.error("server not healthy after %.0f s; stopping it", args.health_timeout)
                _terminate([child])
                _set_server(engine, row, status=ServerStatus.DOWN.value)
                return 1
        elif now >= next_beat:
            if _healthy(url, token):
                _set_server(engine, row, last_heartbeat=utcnow(), status=ServerStatus.UP.value)
            next_beat = now + args.heartbeat
        time.sleep(0.2)


# ---------------------------------------------------------------- client side


def _find_server(engine: Any, name: str, stale_s: float) -> tuple[str | None, str | None]:
    """(url, status) of the newest server row of that name; url only if UP and fresh."""
    from sqlmodel import select

    from store.db import session_scope
    from store.models import ServerStatus, SwarmServer
    from store.types import utcnow

    with session_scope(engine) as s:
        row = s.exec(select(SwarmServer).where(SwarmServer.name == name)
                     .order_by(SwarmServer.id.desc()).limit(1)).first()  # type: ignore[union-attr]
        if row is None:
            return None, None
        fresh = row.last_heartbeat is not None and utcnow() - row.last_heartbeat < timedelta(seconds=stale_s)
        up = row.status == ServerStatus.UP.value and row.url and fresh
        return (row.url if up else None), row.status


def client(args: argparse.Namespace, cmd: list[str]) -> int:
    from store.models import ServerStatus

    engine = _engine(args.db)
    deadline = time.monotonic() + args.wait
    while True:
        url, status = _find_server(engine, args.name, args.stale)
        if url:
            break
        if _Stop.requested:
            return 143
        if time.monotonic() > deadline:
            log.error("no UP server named %r after %.0f s (last status: %s)", args.name, args.wait, status)
            return 3
        time.sleep(0.5)
    log.info("server %s at %s; starting %d client(s)", args.name, url, args.clients)
    procs = []
    for i in range(args.clients):
        argv = [a.replace("{url}", url).replace("{i}", str(i)).replace("{seed}", str(args.seed * 1000 + i))
                for a in cmd]
        procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))
    next_check = time.monotonic() + 1.0
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            bad = [c for c in codes if c]
            return bad[0] if bad else 0
        if _Stop.requested:
            _terminate(procs)
            return 143
        if time.monotonic() >= next_check:
            _, status = _find_server(engine, args.name, args.stale)
            if status in (ServerStatus.STOPPED.value, ServerStatus.DOWN.value):
                log.info("server %s is %s; stopping the fleet", args.name, status)
                _terminate(procs)
                return 0 if status == ServerStatus.STOPPED.value else 1
            next_check = time.monotonic() + 2.0
        time.sleep(0.2)


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m scheduler.register {serve|client} [options] -- COMMAND...", file=sys.stderr)
        return 2
    split = argv.index("--")
    ours, cmd = argv[:split], argv[split + 1:]
    ap = argparse.ArgumentParser(prog="python -m scheduler.register")
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve", help="supervise a swarm server and register its URL")
    s.add_argument("--name", required=True, help="server name in the store (clients look it up)")
    s.add_argument("--out", required=True, help="the server's --out directory (server.json appears there)")
    s.add_argument("--model", default="", help="model label recorded in the store")
    s.add_argument("--db", default=None, help="database URL [default: ROOST_DATABASE_URL or the data dir]")
    s.add_argument("--heartbeat", type=float, default=10.0, help="seconds between heartbeats")
    s.add_argument("--health-timeout", type=float, default=600.0, help="give up if not healthy by then")
    c = sub.add_parser("client", help="wait for a registered server, then run N clients against it")
    c.add_argument("--name", required=True, help="server name to look up")
    c.add_argument("--db", default=None)
    c.add_argument("--clients", type=int, default=1)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the server")
    c.add_argument("--stale", type=float, default=60.0, help="a heartbeat older than this is a dead server")
    args = ap.parse_args(ours)
    if not cmd:
        ap.error("no command after --")
    # Our own lines at INFO; libraries (alembic, httpx) only when something is wrong.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return serve(args, cmd) if args.mode == "serve" else client(args, cmd)


if __name__ == "__main__":
    sys.exit(main())
