"""How a server's config is assembled at start: file, environment, flags, persisted secrets, its port.

    swarm serve --config server.yaml --port 9000       # file values, flags on top
    ROOST_TOKEN=... ROOST_ADMIN_TOKEN=... ROOST_SECRET=... swarm serve

Precedence, highest first: command-line flags, environment variables
(`ROOST_TOKEN`, `ROOST_ADMIN_TOKEN`, `ROOST_SECRET` and any flag's own envvar),
the `--config` file (YAML or JSON with `ServerConfig` fields, `train:` nested),
defaults.

Secrets: a worker token, an admin token and the HMAC secret of episode keys.
Any of them still missing after the above is taken from `out_dir/secrets.json`
(a previous start) or generated and saved there (mode 0600, written atomically),
so a restarted server keeps its tokens and its secret: clients keep working and
episode keys it signed before the restart still verify.

The port and the TLS certificate are checked before any of that is written (`port_problem`,
`tls_problem`): a start that cannot bind or load them leaves no config.yaml or secrets.json behind
and says why in one line. A server reachable from other machines without TLS is said to be
(`clear_text_note`): its bearer tokens would cross the network readable.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import secrets
import socket
import ssl
import stat
from pathlib import Path
from typing import IO

from swarm.config.server import ServerConfig
from swarm.folder_lock import FolderInUse, hold_folder
from swarm.run_layout import SECRETS_FILE

log = logging.getLogger("swarm.server")

#: held by the server using an out folder (swarm/folder_lock.py): one server per folder
SERVER_LOCK = "server.lock"
ENV = {"token": "ROOST_TOKEN", "admin_token": "ROOST_ADMIN_TOKEN", "secret": "ROOST_SECRET"}
_GENERATE = {
    "token": lambda: "swt-" + secrets.token_urlsafe(24),
    "admin_token": lambda: "swa-" + secrets.token_urlsafe(24),
    "secret": lambda: secrets.token_hex(32),
}


def _read_secrets(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("%s is readable by others (mode %o); tightening to 0600", path, mode)
        try:
            path.chmod(0o600)
        except OSError:
            pass
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read {path}: {exc}; fix or remove it (its tokens are then regenerated)") from None
    return {k: v for k, v in data.items() if k in _GENERATE and isinstance(v, str) and v}


def _write_secrets(path: Path, values: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(values, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def keep_tokens(out_dir: Path, token: str, admin_token: str) -> None:
    """Tokens a driver chose for a server it starts (`swarm train`, a team's servers), kept in the server's
    secrets.json (mode 0600) beside any it generated: `swarm ctl --server RUN` and `--attach` read them
    there, as they read a server's own. The server itself gets them through its environment."""
    path = Path(out_dir) / SECRETS_FILE
    _write_secrets(path, {**_read_secrets(path), "token": token, "admin_token": admin_token})


def hold_out_dir(out_dir: Path) -> IO[str]:
    """The server's folder, for this process alone (swarm/folder_lock.py); keep it open while serving.
    Another server on it: SystemExit with one line naming it (exit 1), before anything there is touched."""
    try:
        return hold_folder(Path(out_dir), SERVER_LOCK, "swarm serve")
    except FolderInUse as exc:
        raise SystemExit(
            f"swarm serve: {exc}: stop it first (swarm ctl stop), or give this one another --out"
        ) from None


def ensure_secrets(config: ServerConfig, env: dict[str, str] | None = None) -> tuple[ServerConfig, dict[str, str]]:
    """`config` with every token and the secret set; and where each came from.

    Sources, in order: the config itself, the environment, `out_dir/secrets.json`,
    a fresh value (then saved to that file). The second value maps each field to
    "config", "env", "file" or "generated".
    """
    env = os.environ if env is None else env
    path = Path(config.out_dir) / SECRETS_FILE
    stored = _read_secrets(path)
    values: dict[str, str] = {}
    source: dict[str, str] = {}
    for field, var in ENV.items():
        given = getattr(config, field)
        if given:
            values[field], source[field] = given, "config"
        elif env.get(var):
            values[field], source[field] = env[var], "env"
        elif field in stored:
            values[field], source[field] = stored[field], "file"
        else:
            values[field], source[field] = _GENERATE[field](), "generated"
    generated = {k: values[k] for k, s in source.items() if s == "generated"}
    if generated:
        _write_secrets(path, {**stored, **generated})
    return config.model_copy(update=values), source


# -- the port -----------------------------------------------------------------------


def port_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be bound, as one line saying what to do; None when it can.

    Binds the way the server will (swarm/server/app.py `_bind`: SO_REUSEADDR, so a
    socket lingering in TIME_WAIT is no problem, a listening one is) and lets go at
    once. Port 0 always works: the kernel picks a free one.
    """
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return (
                f"port {port} on {host} is in use (another server?): stop what holds it, or pass "
                f"--port N (--port 0 picks a free one)"
            )
        if exc.errno == errno.EACCES:
            return f"port {port} on {host} needs privileges: pass --port 1024 or above (--port 0 picks a free one)"
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"cannot bind {host}: not an address of this machine; pass --host (default 127.0.0.1)"
        return f"cannot bind {host}:{port}: {exc.strerror or exc}; pass another --host or --port"
    return None


def tls_problem(config: ServerConfig) -> str | None:
    """Why the server's certificate and key cannot serve HTTPS, in one line; None when they can (or no TLS)."""
    if config.ssl_certfile is None or config.ssl_keyfile is None:
        return None
    for flag, path in (("--ssl-certfile", config.ssl_certfile), ("--ssl-keyfile", config.ssl_keyfile)):
        if not Path(path).is_file():
            return f"{flag} {path}: no such file"
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # an encrypted key fails here, not at OpenSSL's password prompt (a hang without a terminal)
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        return (
            f"cannot serve HTTPS with {config.ssl_certfile} and {config.ssl_keyfile}: {exc.strerror or exc} "
            "(PEM files, the key matching the certificate, not encrypted)"
        )
    return None


def clear_text_note(config: ServerConfig) -> str | None:
    """A line for a server that other machines can reach over plain HTTP; None on loopback or with TLS."""
    if config.tls:
        return None
    try:
        loopback = ipaddress.ip_address(config.host).is_loopback
    except ValueError:  # a host name: loopback only if it is localhost
        loopback = config.host == "localhost"
    if loopback:
        return None
    return (
        f"plain HTTP on {config.host}: the tokens cross the network readable; serve HTTPS with "
        "--ssl-certfile and --ssl-keyfile, or put a TLS proxy in front (--public-url)"
    )


# -- --quota -----------------------------------------------------------------------


def parse_quotas(items: list[str]) -> dict[str, float]:
    """`["math=0.4", "code=0.6"]` -> {"math": 0.4, "code": 0.6} (ValueError on a bad item)."""
    out: dict[str, float] = {}
    for item in items:
        family, sep, share = item.partition("=")
        family = family.strip()
        if not sep or not family:
            raise ValueError(f"expected FAMILY=SHARE, got {item!r}")
        try:
            out[family] = float(share)
        except ValueError:
            raise ValueError(f"share of {family!r} is not a number: {share!r}") from None
    return out
