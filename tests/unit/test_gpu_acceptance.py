"""bench/gpu_acceptance.{sh,py}: what of the GPU run a CPU can check.

The script runs on a lent GPU machine for minutes at a time, so a wiring mistake there costs
the lease: here it must refuse plainly without CUDA, and every row of its Python part must run
end to end on a small model (`--device cpu --model DIR`), its table and JSON complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swarm.testing import tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour of a GPU script")


def test_script_exits_2_without_cuda(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "GPU_OUT": str(tmp_path / "gpu")}
    done = subprocess.run(["bash", str(ROOT / "bench/gpu_acceptance.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs a CUDA GPU" in done.stderr
    assert not (tmp_path / "gpu").exists()  # nothing started, nothing written


def test_python_part_exits_2_without_cuda() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_acceptance.py")], capture_output=True, text=True)
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr


def test_every_row_runs_on_a_small_model(tmp_path: Path) -> None:
    model_dir = tiny_model_dir(tmp_path / "m")  # untrained: the rows time fixed-length requests
    out = tmp_path / "report.json"
    # arith only: the long workload is the same code on 2.5x the tokens (16 s of this test's 21 on a CPU)
    args = [
        "--device",
        "cpu",
        "--model",
        str(model_dir),
        "--max-tokens",
        "4",
        "--concurrency",
        "1,8",
        "--workloads",
        "arith",
    ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/gpu_acceptance.py"), *args, "--steps", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["concurrency"] for r in report["full"]["generation"]] == [1, 8]
    assert all(r["new_tokens"] == 4 * 2 * r["concurrency"] for r in report["full"]["generation"])
    assert [r["batch"] for r in report["hf_generate"]] == [1, 8]
    assert all(r["new_tokens"] == 4 * r["batch"] for r in report["hf_generate"])
    for kind in ("full", "lora"):
        assert [t["workload"] for t in report[kind]["train_step"]] == ["arith"]
        assert all(t["engine_tokens_per_s"] > 0 and t["raw_tokens_per_s"] > 0 for t in report[kind]["train_step"])
    assert report["lora"]["rank"] == 8 and report["lora"]["generation"][0]["new_tokens"] == 4 * 2 * 8
    assert "engine/HF" in done.stdout and "engine/raw" in done.stdout
