"""`swarm serve` at the command line: a start that cannot work fails in one line and leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tls_certs import self_signed  # tests/kit, on sys.path


def _refused(tmp_path: Path, *args: str) -> tuple[int, str]:
    """`swarm serve ARGS --out tmp/serve` that must fail: its exit status and its one line of output
    (a traceback fails the test), after checking it wrote nothing into its folder."""
    out = tmp_path / "serve"
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "serve", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ROOST_HOME": str(tmp_path / "home")},
    )
    assert r.returncode != 0, r.stdout + r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines  # no traceback
    assert not (out / "config.yaml").exists() and not (out / "secrets.json").exists()
    return r.returncode, lines[0]


def test_serve_on_a_port_in_use_says_so_in_one_line_and_writes_nothing(tmp_path: Path, model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        _, line = _refused(tmp_path, "--engine", "fake", "--model", str(model_dir), "--port", str(port))
    assert str(port) in line and "in use" in line and "--port" in line, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA can give --device cuda")
def test_serve_on_cuda_without_a_gpu_says_so_in_one_line(tmp_path: Path, model_dir: Path) -> None:
    """Not an 83-line traceback from inside the engine's placement: the flag, the reason, the fix."""
    code, line = _refused(tmp_path, "--model", str(model_dir), "--device", "cuda", "--no-mlflow", "--port", "0")
    assert code == 2 and "--device cuda" in line and "no CUDA GPU" in line and "--device cpu" in line, line


def test_serve_without_a_model_says_so_in_one_line(tmp_path: Path) -> None:
    """The fake engine too (it reads the model's tokenizer): it was a traceback from huggingface_hub."""
    code, line = _refused(tmp_path, "--engine", "fake", "--model", str(tmp_path / "nothing"), "--port", "0")
    assert code == 2 and line.startswith(f"no model at {tmp_path / 'nothing'}"), line


def test_a_lora_rank_wider_than_the_layers_is_one_line_and_nothing_is_written(tmp_path: Path, model_dir: Path) -> None:
    """Refused by the engine once the server had written config.yaml and secrets.json into its folder."""
    code, line = _refused(tmp_path, "--model", str(model_dir), "--lora-rank", "100000", "--port", "0", "--no-mlflow")
    assert code == 2 and line.startswith("swarm serve: --lora-rank: LoRA rank 100000 is larger than"), line


def test_a_checkpoint_that_does_not_fit_the_lora_settings_is_one_line_at_start(tmp_path: Path, model_dir: Path) -> None:
    """A policy's folder holds a rank-4 adapter and the server is started with rank 8: resuming it cannot
    work, and the reason is the line printed (it was a trace through create_app and the engine's load)."""
    ckpt = tmp_path / "serve" / "policies" / "a" / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8.0, "peft_type": "LORA"}))
    (ckpt / "server_state.json").write_text(json.dumps({"step": 1, "policy_version": 1}))
    args = ["--model", str(model_dir), "--policy", "a", "--lora-rank", "8", "--port", "0", "--no-mlflow"]
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "serve", *args, "--out", str(tmp_path / "serve")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"swarm serve: checkpoint {ckpt} holds a rank-4 adapter")


def test_a_certificate_that_cannot_serve_https_is_one_line_and_nothing_is_written(
    tmp_path: Path, model_dir: Path
) -> None:
    key, cert = self_signed(tmp_path)
    other_key, _ = self_signed(tmp_path, "other")
    base = ["--engine", "fake", "--model", str(model_dir), "--port", "0"]
    r = subprocess.run(  # a usage error (exit 2, the usage box), before anything is written
        [sys.executable, "-m", "swarm", "serve", *base, "--ssl-certfile", str(cert), "--out", str(tmp_path / "serve")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ROOST_HOME": str(tmp_path / "home")},
    )
    said = " ".join(r.stderr.replace("│", " ").split())
    assert r.returncode == 2 and "--ssl-certfile needs --ssl-keyfile" in said and "Traceback" not in said, said
    assert not (tmp_path / "serve" / "config.yaml").exists()
    code, line = _refused(tmp_path, *base, "--ssl-certfile", str(cert), "--ssl-keyfile", str(other_key))
    assert code == 1 and f"cannot serve HTTPS with {cert}" in line, line


def test_no_resume_on_a_folder_holding_a_run_is_refused(tmp_path: Path, model_dir: Path) -> None:
    """It started afresh there: the earlier run's metrics moved aside, its rollouts appended to, its
    checkpoints overwritten where the step numbers met, with one warning about discarded episodes."""
    base = ["--engine", "fake", "--model", str(model_dir), "--port", "0", "--no-resume"]
    (tmp_path / "serve" / "policies" / "p" / "checkpoints" / "step_000001").mkdir(parents=True)
    code, line = _refused(tmp_path, *base)
    assert code == 2 and "holds an earlier run (checkpoints in policies/p/checkpoints)" in line, line
    (tmp_path / "serve" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    code, line = _refused(tmp_path, *base)
    assert code == 2 and "(2 step(s) in metrics.jsonl)" in line and "give another --out" in line, line


def test_an_earlier_runs_steps_are_its_complete_metrics_rows(tmp_path: Path) -> None:
    """A server killed mid-write leaves a cut last line: it is no step (as `swarm train` counts them)."""
    from swarm.server.cli import earlier_run

    assert earlier_run(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "loss"')
    assert earlier_run(tmp_path) == "2 step(s) in metrics.jsonl"
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "policies" / "p").mkdir(parents=True)
    (tmp_path / "policies" / "p" / "metrics.jsonl").write_text('{"step": 1}\n')
    assert earlier_run(tmp_path) == "1 step(s) in policies/p/metrics.jsonl"
