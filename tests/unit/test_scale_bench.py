"""bench/scale.py: the analytic memory bound, the table's assembly, and a quick run of the script.

The full run takes minutes of a 0.5B model and vLLM; what can break unnoticed is cheaper to check:
the bound's arithmetic on Qwen2.5-0.5B's shape (a wrong coefficient would make every memory verdict
wrong), the rows and verdicts built from a report, and the script's wiring end to end on the
embedded model with the torch engine only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from _scale_parts import Shape, memory_bound, memory_samples  # noqa: E402
from _scale_table import check_targets, render, table_rows  # noqa: E402

QWEN05 = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
}
PARAMS = 494_032_768


def test_shape_from_a_config_without_head_dim() -> None:
    shape = Shape.of(QWEN05, PARAMS, PARAMS)
    assert (shape.hidden, shape.intermediate, shape.layers, shape.vocab) == (896, 4864, 24, 151936)
    assert shape.kv == 2 * 64  # 2 KV heads of 896 / 14


def test_bound_of_a_full_step_on_the_0_5b() -> None:
    parts = memory_bound(Shape.of(QWEN05, PARAMS, PARAMS), tokens=512, trained=384)
    assert parts["weights"] == PARAMS * 4
    assert parts["grads"] == PARAMS * 4
    assert parts["adamw"] == 2 * PARAMS * 4
    per_token = 24 * (12 * 896 + 4 * 4864 + 3 * 128) + 2 * 896  # 736,000 floats
    assert per_token == 736_000
    assert parts["activations"] == 512 * per_token * 4 + 384 * 3 * 151936 * 4
    assert parts["total"] == 4 * PARAMS * 4 + parts["activations"]
    assert 10.1e9 < parts["total"] < 10.2e9  # 7.9 GB of weights and optimizer, 2.2 GB of activations


def test_bound_with_lora_counts_optimizer_state_for_the_adapter_only() -> None:
    adapter = 4_399_104
    parts = memory_bound(Shape.of(QWEN05, PARAMS + adapter, adapter), tokens=512, trained=384)
    assert parts["weights"] == (PARAMS + adapter) * 4
    assert parts["grads"] + parts["adamw"] == 3 * adapter * 4
    full = memory_bound(Shape.of(QWEN05, PARAMS, PARAMS), tokens=512, trained=384)
    assert parts["activations"] == full["activations"]


def test_memory_samples_fill_one_micro_batch_without_shared_prompts() -> None:
    from swarm.engine.policy_step import micro_batches

    samples, trained = memory_samples(vocab=1000, tokens=512)
    assert sum(len(s.input_ids) for s in samples) == 512
    assert micro_batches([len(s.input_ids) for s in samples], 512) == [list(range(len(samples)))]
    assert len({tuple(s.input_ids[:16]) for s in samples}) == len(samples)
    assert trained == sum(sum(s.loss_mask[1:]) for s in samples)
    assert {s.reward for s in samples} == {0.0, 1.0}


def _report() -> dict:
    def gen(tps: dict[int, float]) -> list[dict]:
        return [{"concurrency": c, "tokens_per_s": t} for c, t in tps.items()]

    mem = {
        "runtime": 300 * 2**20,
        "peak": 300 * 2**20 + 12 * 2**30,
        "reference": 2 * 2**30,
        "ratio": 1.25,
        "bound": {"total": int(9.6 * 2**30), "activations": int(1.7 * 2**30)},
    }
    return {
        "models": {
            "embedded": {
                "params": 912_512,
                "generation": {"torch": gen({1: 170, 8: 1300, 32: 3000}), "vllm": gen({1: 100, 8: 700, 32: 2000})},
                "swarm_train": {"torch": {"completed": True, "rc": 0, "wall_s": 19.0, "peak_rss_sum": 2**30}},
            },
            "0.5b": {
                "params": PARAMS,
                "generation": {"torch": gen({1: 4, 8: 20, 32: 30}), "vllm": gen({1: 10, 8: 50, 32: 100})},
                "train_step": {
                    "tokens": 200,
                    "engine_tokens_per_s": 30.0,
                    "plain_tokens_per_s": 20.0,
                    "raw_tokens_per_s": 15.0,
                },
                "memory": {"full": mem, "lora r8": {**mem, "ratio": 1.1, "reference": 0}},
                "sync": {"full": {"total_s": 6.0, "mb": 1884.0}, "adapter r8": {"total_s": 0.1, "mb": 16.8}},
                "swarm_train": {"vllm": {"completed": False, "rc": 1, "wall_s": 90.0, "peak_rss_sum": 2**33}},
                "errors": {"gen vllm": "RuntimeError: boom"},
            },
        }
    }


def test_table_puts_models_side_by_side_with_ratios() -> None:
    rows = {label: (values, target) for label, values, target in table_rows(_report())}
    assert rows["generate tok/s, 32 concurrent: torch"][0] == ["3000", "30"]
    assert rows["  torch / vLLM at 32"] == (["1.50", "0.30"], ">= 0.5 (0.5B)")
    assert rows["  engine / raw"][0] == ["-", "2.00"]
    assert rows["vLLM sync s, full"] == (["-", "6.000"], "<= 3.0 s (0.5B)")
    assert rows["  full / adapter"][0] == ["-", "60.0"]
    assert rows["swarm train --engine torch, 2 steps: wall"][0] == ["19 s", "-"]
    assert rows["swarm train --engine vllm, 2 steps: wall"][0] == ["-", "FAILED rc 1"]
    assert rows["  (peak - runtime) / bound"][1] == "<= 1.3"
    assert "ERROR gen vllm (0.5b)" in rows
    table = render(_report())
    assert [c.header for c in table.columns] == ["figure", "embedded", "0.5b", "target"]


def test_targets_judge_the_0_5b_only_but_every_swarm_train() -> None:
    verdicts = {t["target"]: t["met"] for t in check_targets(_report())}
    assert verdicts["0.5B torch/vLLM generation at 32 >= 0.5"] is False
    assert verdicts["0.5B train peak full <= 1.3x bound"] is True
    assert verdicts["0.5B full sync <= 3.0 s"] is False
    assert verdicts["embedded: swarm train --engine torch --steps 2 completes"] is True
    assert verdicts["0.5b: swarm train --engine vllm --steps 2 completes"] is False


@pytest.mark.slow
def test_quick_run_on_the_embedded_model_prints_the_table(tmp_path: Path) -> None:
    from swarm.testing import tiny_model_dir

    model = tiny_model_dir(tmp_path)
    out = tmp_path / "scale.json"
    args = ["--quick", "--models", "embedded", "--engines", "torch", "--parts", "gen,train"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/scale.py"), *args, "--embedded-dir", str(model), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for row in ("generate tok/s, 8 concurrent: torch", "train_step tok/s: raw torch step", "engine / raw"):
        assert row in done.stdout
    report = json.loads(out.read_text())
    m = report["models"]["embedded"]
    assert [r["concurrency"] for r in m["generation"]["torch"]] == [1, 8]
    assert m["train_step"]["engine_tokens_per_s"] > 0 and m["train_step"]["raw_tokens_per_s"] > 0
    assert "errors" not in m and "vllm" not in m["generation"]
