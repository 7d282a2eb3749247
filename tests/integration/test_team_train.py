"""`swarm train --team planner=A,executor=B --task duet`: two different models, a server each, one team
fleet, a summary section per role (issue 24). Real processes over loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.model.build import VOCAB_SIZE, build_untrained, task_corpus
from swarm.model.presets import build_preset
from swarm.model.tokenizer import build_tokenizer
from swarm.model.warmstart import WarmStartConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: a warm start of a few batches: the test needs a second, differently shaped model, not a skilled one
TINY_WARM = WarmStartConfig(
    arith_examples=64, guess_examples=0, calc_examples=0, duet_examples=16, target_arith_reward=None
)


@pytest.mark.timeout(240)
def test_a_team_of_two_different_models_trains_each_role_on_its_own_server(tmp_path: Path) -> None:
    planner = build_untrained(tmp_path / "planner-model")
    executor = build_preset("tiny-wide", tmp_path / "executor-model", layers=1, warm=TINY_WARM)
    # the embedded recipe's tokenizer (the same ids as the embedded model), on another shape
    vocab = json.loads((executor / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocab == build_tokenizer(task_corpus(0), VOCAB_SIZE).backend_tokenizer.get_vocab(with_added_tokens=False)
    assert json.loads((executor / "config.json").read_text())["hidden_size"] == 192
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm",
            "train",
            "--team",
            f"planner={planner},executor={executor}",
            "--task",
            "duet",
            "--steps",
            "2",
            "--group-size",
            "2",
            "--batch-groups",
            "1",
            "--concurrency",
            "4",
            "--no-mlflow",
            "--out",
            str(out),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "ROOST_HOME": str(tmp_path / "home")},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    printed = json.loads(r.stdout.splitlines()[0])
    assert set(printed["roles"]) == {"planner", "executor"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["task"] == "duet"
    assert list(summary["roles"]) == ["planner", "executor"] and list(summary["servers"]) == ["planner", "executor"]
    for role, model in (("planner", planner), ("executor", executor)):
        section = summary["roles"][role]
        assert section["model_dir"] == str(model) and section["restarts"] == 0
        assert section["steps_done"] >= 2 and section["reward_first_mean"] is not None
        rows = [json.loads(x) for x in (out / section["metrics"]).read_text().splitlines()]
        assert [x["step"] for x in rows][:2] == [1, 2] and rows[0]["episodes"] == 2  # a group of 2 per step
        assert (out / "servers" / role / "checkpoints" / "latest").exists()  # each role's own checkpoint
        assert (out / "logs" / f"server-{role}.log").exists() and (out / f"server-{role}.yaml").exists()
    fleet = (out / "fleet-client0.yaml").read_text()
    assert "planner=http://127.0.0.1:" in fleet and ",executor=http://127.0.0.1:" in fleet
    assert "team: planner=" in (out / "run.yaml").read_text()
