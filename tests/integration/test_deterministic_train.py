"""`swarm train --deterministic`: the same config and seed give the same run, to the bit.

Real server and client processes over loopback (`swarm train` starts them in their own sessions
and stops them by PID), on the embedded model, so the rewards are not all zero and a seed matters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: small enough for ~15 s a run on two CPU cores: 4 groups of 4 choices a step
SMALL = ("--group-size", "4", "--batch-groups", "4", "--concurrency", "8")


def _embedded_model() -> Path:
    from store.paths import default_model_dir  # lazy: reads ROOST_HOME when asked
    from swarm.model.build import init_model, is_complete  # lazy: a build imports torch

    for candidate in (default_model_dir(), Path.home() / ".cache" / "roost" / "models" / "tiny-qwen2"):
        if is_complete(candidate, seed=0):
            return candidate.resolve()
    return init_model(default_model_dir(), seed=0).resolve()


def _train(tmp_path: Path, name: str, seed: int, model: Path) -> Path:
    out = tmp_path / name
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    argv = ["--task", "arith", "--deterministic", "--steps", "3", "--no-mlflow", "--seed", str(seed), *SMALL]
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "train", *argv, "--model", str(model), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def _rewards(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "server" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["policy_lag_max"] == 0 for r in rows)
    return [r["reward_mean"] for r in rows]


def _completions(out: Path) -> dict[str, list[list[int]]]:
    """Each episode's generated ids by task: what the run sampled, however its episodes were named."""
    rows = [json.loads(line) for line in (out / "server" / "rollouts.jsonl").read_text().splitlines()]
    return {r["task_id"]: [c["completion_ids"] for c in r["calls"]] for r in rows}


def _weights(out: Path) -> dict:
    return load_file(str(out / "server" / "checkpoints" / "step_000003" / "model.safetensors"))


def _distance(a: dict, b: dict) -> float:
    """L2 distance between two state dicts of the same keys."""
    return sum(float(((a[k].float() - b[k].float()) ** 2).sum()) for k in a) ** 0.5


def test_the_same_seed_gives_the_same_run_and_another_seed_another(tmp_path: Path) -> None:
    model = _embedded_model()
    first, again, other = (_train(tmp_path, name, seed, model) for name, seed in (("a", 1), ("b", 1), ("c", 2)))

    assert _rewards(first) == _rewards(again)  # exactly: the same floats
    assert _completions(first) == _completions(again)
    # the same tokens and rewards, exactly; the weights to the bit on a quiet machine, but not always: each
    # sampled token's logprob, which the loss's ratio reads, comes from a batched forward whose other rows
    # depend on timing (within 2.2e-6, docs/researcher-statistics.md "Reproducible trials"), and AdamW
    # normalises what that leaves in a near-zero gradient. Measured in a loaded CI run: 3.0e-6 apart (L2)
    # at the same seed, 0.77 at another seed; asked here: at most 1/1000 of another seed's distance
    w1, w2 = _weights(first), _weights(again)
    assert w1.keys() == w2.keys()
    same, apart = _distance(w1, w2), _distance(w1, _weights(other))
    assert same <= 1e-3 * apart, f"trained weights {same:g} apart at one seed, {apart:g} at another"

    assert _completions(other) != _completions(first)  # another seed: other tasks, other samples
    assert _rewards(other) != _rewards(first)
