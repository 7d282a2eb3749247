"""Rewards a workflow can compute with a model's help: an LLM judge of a group (`Judge`, `judge_group`).

Client-side and torch-free, like the SDK: a workflow calls them with its trajectories and returns
the rewards as its own.
"""

from swarm.rewards.judge import Judge, JudgeError, judge_group

__all__ = ["Judge", "JudgeError", "judge_group"]
