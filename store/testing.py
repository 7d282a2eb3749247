"""Throwaway PostgreSQL and MLflow servers for tests (any package's tests may use these).

    with start_postgres() as pg:                 # initdb + pg_ctl on a free loopback port
        url = pg.create_database("t1")           # postgresql+psycopg://postgres@127.0.0.1:P/t1
    with start_mlflow_server(tmp) as uri:        # python -m mlflow server, /health answered
        ...

Both are killed by PID on exit (pg_ctl stop, then the postmaster's PID; the MLflow
server's whole process group), even when the test fails.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from store.ports import free_port

PG_BIN = Path(os.environ.get("ROOST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def postgres_available() -> str | None:
    """None if a throwaway PostgreSQL can be started here, else the reason why not."""
    for tool in ("initdb", "pg_ctl"):
        if not (PG_BIN / tool).exists():
            return f"PostgreSQL server binaries not found ({PG_BIN / tool}); run .ci/postgres.sh"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root but `runuser` is missing (initdb refuses to run as root)"
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root but there is no `postgres` user to run initdb as"
    return None


def _as_postgres(argv: list[str]) -> list[str]:
    """initdb/postgres refuse to run as root: drop to the `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class PostgresServer:
    root: Path
    port: int
    user: str = "postgres"
    host: str = "127.0.0.1"
    _created: list[str] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def _admin(self):  # type: ignore[no-untyped-def]
        import psycopg  # lazy: an optional driver, only for PostgreSQL tests

        return psycopg.connect(host=self.host, port=self.port, user=self.user, dbname="postgres", autocommit=True)

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` (dropping an old one); returns its SQLAlchemy URL."""
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        self._created.append(name)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


def _stop_postgres(server: PostgresServer) -> None:
    pid = server.postmaster_pid()
    subprocess.run(
        _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(server.data), "-m", "immediate", "-w", "-t", "10", "stop"]),
        capture_output=True,
        timeout=30,
        check=False,
    )
    if pid is not None:
        for sig in (signal.SIGQUIT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            time.sleep(0.5)


@contextmanager
def start_postgres(attempts: int = 3) -> Iterator[PostgresServer]:
    """initdb a fresh cluster in a temp dir, start it on a free port, stop and delete it."""
    reason = postgres_available()
    if reason:
        raise RuntimeError(reason)
    # A directory the postgres user can enter: not pytest's root-only tmp dirs.
    root = Path(tempfile.mkdtemp(prefix="roost-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres")
    server: PostgresServer | None = None
    try:
        init = subprocess.run(
            _as_postgres(
                [
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(root / "data"),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "--no-sync",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip() or init.stdout.strip()}")
        last_error = ""
        for _ in range(attempts):
            port = free_port()
            opts = (
                f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off"
            )
            start = subprocess.run(
                _as_postgres(
                    [
                        str(PG_BIN / "pg_ctl"),
                        "-D",
                        str(root / "data"),
                        "-o",
                        opts,
                        "-l",
                        str(root / "server.log"),
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ]
                ),
                capture_output=True,
                text=True,
                timeout=90,
                check=False,
            )
            if start.returncode == 0:
                server = PostgresServer(root=root, port=port)
                break
            log_path = root / "server.log"
            last_error = (log_path.read_text()[-2000:] if log_path.exists() else "") or start.stderr
        if server is None:
            raise RuntimeError(f"pg_ctl start failed: {last_error}")
        yield server
    finally:
        if server is not None:
            _stop_postgres(server)
        else:  # a half-started postmaster still has a pid file
            _stop_postgres(PostgresServer(root=root, port=0))
        shutil.rmtree(root, ignore_errors=True)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


class MlflowServer:
    """`python -m mlflow server` on a free loopback port: SQLite backend (or `backend_uri`, a store
    others write to) and proxied artifacts under `workdir`. `launch()` returns at once (the server
    needs 15-20 s to answer), so a test can start it early and `wait()` when needed."""

    def __init__(self, workdir: Path, backend_uri: str | None = None) -> None:
        self.workdir = Path(workdir).absolute()
        self.backend_uri = backend_uri or f"sqlite:///{self.workdir / 'server.db'}"
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = self.workdir / "mlflow-server.log"

    def launch(self) -> MlflowServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # no job execution: MLflow 3 starts a job runner and seven huey consumers beside the server for its
        # GenAI jobs (each importing mlflow, ~30 CPU-s in all, then polling), which nothing here submits
        env = {
            **os.environ,
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "true",
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        }
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self._log, "wb") as log_file:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                    "--backend-store-uri",
                    self.backend_uri,
                    "--artifacts-destination",
                    str(self.workdir / "artifacts"),
                ],
                cwd=self.workdir,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: workers die with it
            )
        return self

    def wait(self, timeout_s: float = 120.0) -> str:
        """Block until /health answers; returns the tracking URI."""
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while not _healthy(f"{self.uri}/health"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}: {self._log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not healthy after {timeout_s:.0f} s")
            time.sleep(0.3)
        return self.uri

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what lingers (workers outlive the leader)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


@contextmanager
def start_mlflow_server(workdir: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """Launch an `MlflowServer`, yield its URI once healthy, kill its group afterwards."""
    server = MlflowServer(workdir).launch()
    try:
        yield server.wait(timeout_s)
    finally:
        server.stop()
