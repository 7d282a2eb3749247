"""What every framework test needs: the server's address, claiming, and the check of a finished episode.

Imports only the client and the pure timeline (torch-free: the frameworks' venv has no server).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from swarm.client import SwarmClient
from swarm.timeline import Call, episode_samples

QUESTION = "What is (12 + 30) * 2? Use the tools."
ANSWER = "The answer is 84."
#: the JSON schema of `add`'s arguments, for frameworks that take tools as schemas
ADD_PARAMS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def need(module: str) -> ModuleType:
    """`module`, or a skip when it is not installed (a failure under ROOST_REQUIRE_FRAMEWORKS=1)."""
    if os.environ.get("ROOST_REQUIRE_FRAMEWORKS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@dataclass
class Roost:
    url: str
    token: str
    out: Path

    def client(self) -> SwarmClient:
        return SwarmClient(self.url, self.token)

    def calls(self, episode_id: str) -> list[dict[str, Any]]:
        """The finished episode's recorded calls, from the server's rollout log."""
        for line in (self.out / "rollouts.jsonl").read_text().splitlines():
            record = json.loads(line)
            if record["episode_id"] == episode_id:
                return record["calls"]
        raise AssertionError(f"episode {episode_id} is not in rollouts.jsonl")

    def check_merged(self, episode_id: str, turns: int, samples: int = 1) -> None:
        """`turns` calls merged into `samples` training samples (1: all of them, the exact continuation
        of each other) with every generated token trained once and nothing else (tool results, prompts
        and prefills: mask 0). A sample is the calls it holds, each a prefix of the next."""
        calls = self.calls(episode_id)
        assert len(calls) == turns, [c["completion_ids"][-3:] for c in calls]
        merged = [Call(c["agent"], c["prompt_ids"], c["completion_ids"], c["logprobs"]) for c in calls]
        got = episode_samples(merged, episode_id, "g", 1.0)
        assert len(got) == samples, f"{turns} calls made {len(got)} samples, not {samples}"
        covered = 0
        for s in got:
            mine = [
                c
                for c in calls
                if s.input_ids[: len(c["prompt_ids"]) + len(c["completion_ids"])]
                == c["prompt_ids"] + c["completion_ids"]
            ]
            assert mine and s.input_ids == mine[-1]["prompt_ids"] + mine[-1]["completion_ids"]
            trained = [0] * len(s.input_ids)
            for c in mine:
                lo = len(c["prompt_ids"])
                hi = lo + len(c["completion_ids"])
                assert s.rollout_logprobs[lo:hi] == c["logprobs"]
                trained[lo:hi] = [1] * (hi - lo)
            assert s.loss_mask == trained
            covered += len(mine)
        assert covered == turns  # every call in exactly one sample
