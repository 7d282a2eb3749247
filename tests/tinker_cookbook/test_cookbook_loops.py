"""tinker-cookbook's own training loops, unchanged, against Roost's Tinker API (docs/tinker.md).

* SFT: `tinker_cookbook.supervised.train.main` on a generated chat set (its
  `FromConversationFileBuilder`): the mean NLL of the last steps is well under that of the first.
* RL: `tinker_cookbook.rl.train.main` on Roost's `arith` task (a cookbook `ProblemEnv`, GRPO groups,
  the cookbook's default `importance_sampling` loss): the mean reward of the last steps is well over
  that of the first.

Both train the embedded model (`swarm model init`) through a real `swarm serve`, with the cookbook's
`qwen3_instruct` renderer on the model directory's own tokenizer (loaded from disk: HF_HUB_OFFLINE=1).
Run by `.ci/tinker_cookbook.sh` in `.venv-cookbook`; elsewhere they skip unless
`ROOST_REQUIRE_COOKBOOK=1`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

try:
    import tinker_cookbook  # noqa: F401
except ImportError:  # the main venv: the cookbook is only in .venv-cookbook
    if os.environ.get("ROOST_REQUIRE_COOKBOOK") == "1":
        raise
    pytest.skip("tinker-cookbook is not installed (.ci/tinker_cookbook.sh runs these tests)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the glue and cookbook_serving.py, by name (importlib mode)

import roost_cookbook as glue  # noqa: E402
from cookbook_serving import report, write_arith_problems  # noqa: E402
from tinker_cookbook.rl import train as rl_train  # noqa: E402
from tinker_cookbook.supervised import train as sl_train  # noqa: E402

# the SDK's 0.38 deprecations of the *_async methods the cookbook 0.5.8 still calls
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

SFT_STEPS, SFT_BATCH = 24, 8
RL_STEPS, RL_BATCH, RL_GROUP, RL_LR = 40, 8, 8, 1e-3
WINDOW = 8  # steps averaged at each end of the RL run (4 for SFT)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@pytest.mark.timeout(300)
def test_cookbook_sft_loss_falls(roost_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the tokenizer from the model directory, never the hub
    data = glue.write_chat_jsonl(tmp_path / "chat.jsonl", SFT_STEPS * SFT_BATCH)
    log = tmp_path / "sft"
    config = glue.sft_config(roost_server.model, data, log, roost_server.url, batch_size=SFT_BATCH)
    started = time.monotonic()
    asyncio.run(sl_train.main(config))
    wall = time.monotonic() - started
    nll = [row["train_mean_nll"] for row in glue.read_metrics(log) if "train_mean_nll" in row]
    assert len(nll) == SFT_STEPS
    first, last = _mean(nll[:4]), _mean(nll[-4:])
    report(
        "sft",
        {
            "steps": len(nll),
            "first_nll": round(nll[0], 3),
            "last_nll": round(nll[-1], 3),
            "first4_mean": round(first, 3),
            "last4_mean": round(last, 3),
            "wall_s": round(wall, 1),
        },
    )
    assert last < 0.75 * first, nll


@pytest.mark.timeout(420)
def test_cookbook_rl_reward_rises(roost_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problems = write_arith_problems(tmp_path / "arith.jsonl", seed=0, size=RL_STEPS * RL_BATCH)
    log = tmp_path / "rl"
    config = glue.rl_config(
        roost_server.model,
        problems,
        log,
        roost_server.url,
        steps=RL_STEPS,
        batch_size=RL_BATCH,
        group_size=RL_GROUP,
        lr=RL_LR,
    )
    started = time.monotonic()
    asyncio.run(rl_train.main(config))
    wall = time.monotonic() - started
    rows = [row for row in glue.read_metrics(log) if "env/all/reward/total" in row]
    reward = [row["env/all/reward/total"] for row in rows]
    assert len(reward) == RL_STEPS
    # the sampler and the trainer agree (the sampling client samples the weights just trained)
    assert all(abs(row["optim/kl_sample_train_v1"]) < 1e-2 for row in rows)
    first, last = _mean(reward[:WINDOW]), _mean(reward[-WINDOW:])
    report(
        "rl",
        {
            "steps": len(reward),
            "first_reward": round(reward[0], 3),
            "last_reward": round(reward[-1], 3),
            f"first{WINDOW}_mean": round(first, 3),
            f"last{WINDOW}_mean": round(last, 3),
            "wall_s": round(wall, 1),
        },
    )
    assert last > first + 0.07, reward
