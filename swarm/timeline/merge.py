"""Merge an episode's recorded LLM calls into training samples.

A multi-turn agent re-sends its whole conversation every turn, so call k's prompt
usually starts with call k-1's prompt + completion. Training each call separately
re-encodes that shared history k times; merging trains the longest sequence once
with every generated token unmasked. The rules, all on token ids (never text):

* Calls merge only within one agent tag.
* Call `a` is absorbed by call `b` when `a.prompt + a.completion` is a token prefix
  of `b.prompt`. Absorption chains; a chain becomes one sample hosted by its last
  call.
* Every generated token (one generation event) has loss mask 1 in exactly one
  sample, with its own rollout logprob; every other token has mask 0.
* Branches (two later calls extending the same earlier call) host it once: the
  earlier call's tokens are trained in the first branch and are plain context in
  the other. Retries whose generated ranges would overlap inside one host are
  split off into their own sample.

Prefix lookup uses polynomial hashes of prompt prefixes (verified by comparison),
so the cost is linear in the total number of tokens, not quadratic in calls.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from swarm.samples import Call

_MOD = (1 << 61) - 1
_BASE = 1_000_003


@dataclass
class Segment:
    """One merged training sequence of one agent, before rewards are attached."""

    agent: str
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    calls: list[int] = field(default_factory=list)  # indices into the episode's call list
    policy_version: int = 0


@dataclass
class MergeStats:
    calls: int
    samples: int
    tokens_unmerged: int  # sum of len(prompt + completion) over calls
    tokens_merged: int  # sum of len(input_ids) over samples

    @property
    def merge_ratio(self) -> float:
        return self.calls / self.samples if self.samples else 0.0


def _hash_seq(ids: Sequence[int]) -> int:
    h = 0
    for t in ids:
        h = (h * _BASE + t + 1) % _MOD
    return h


def _parents(calls: Sequence[Call], idx: list[int]) -> dict[int, int]:
    """For each call (by index) the call that absorbs it, if any.

    The absorbing call is the one with the shortest prompt that extends the
    call's full sequence (ties: earliest recorded): the nearest continuation.
    """
    wanted: dict[int, list[int]] = defaultdict(list)  # length -> calls whose full seq has it
    full_hash: dict[int, int] = {}
    for i in idx:
        full = calls[i].full
        wanted[len(full)].append(i)
        full_hash[i] = _hash_seq(full)
    # (length, prefix hash) -> candidate hosts, from every prompt's prefixes at wanted lengths
    table: dict[tuple[int, int], list[int]] = defaultdict(list)
    for j in idx:
        h = 0
        prompt = calls[j].prompt_ids
        for n, t in enumerate(prompt, start=1):
            h = (h * _BASE + t + 1) % _MOD
            if n in wanted:
                table[(n, h)].append(j)
    parent: dict[int, int] = {}
    for i in idx:
        full = calls[i].full
        best: int | None = None
        for j in table.get((len(full), full_hash[i]), ()):
            if j == i or calls[j].prompt_ids[: len(full)] != full:
                continue
            if best is None or (len(calls[j].prompt_ids), j) < (len(calls[best].prompt_ids), best):
                best = j
        if best is not None:
            parent[i] = best
    return parent


def _root(i: int, parent: dict[int, int]) -> int:
    while i in parent:
        i = parent[i]
    return i


def _segment(calls: Sequence[Call], host: int, members: list[int]) -> tuple[Segment, list[int]]:
    """Build the host's sample; return it and the members whose tokens collided."""
    seq = calls[host].full
    mask = [0] * len(seq)
    logprobs = [0.0] * len(seq)
    taken: list[int] = []
    ejected: list[int] = []
    for i in sorted(members, key=lambda k: (len(calls[k].prompt_ids), k)):
        c = calls[i]
        lo, hi = len(c.prompt_ids), len(c.prompt_ids) + len(c.completion_ids)
        if any(mask[lo:hi]):
            ejected.append(i)
            continue
        mask[lo:hi] = [1] * (hi - lo)
        logprobs[lo:hi] = list(c.logprobs)
        taken.append(i)
    version = min(calls[i].policy_version for i in taken)
    return Segment(calls[host].agent, list(seq), mask, logprobs, sorted(taken), version), ejected


def merge(calls: Sequence[Call], enabled: bool = True) -> list[Segment]:
    """Merge one episode's calls into segments (one per call when `enabled` is False)."""
    for k, c in enumerate(calls):
        if len(c.logprobs) != len(c.completion_ids):
            raise ValueError(f"call {k}: {len(c.logprobs)} logprobs for {len(c.completion_ids)} tokens")
    if not enabled:
        return [_segment(calls, i, [i])[0] for i in range(len(calls)) if calls[i].completion_ids]
    by_agent: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(calls):
        if c.completion_ids:  # a call that generated nothing trains nothing
            by_agent[c.agent].append(i)
    out: list[Segment] = []
    for agent in sorted(by_agent):
        idx = by_agent[agent]
        parent = _parents(calls, idx)
        groups: dict[int, list[int]] = defaultdict(list)
        for i in idx:
            groups[_root(i, parent)].append(i)
        pending = sorted(groups.items())
        while pending:
            host, members = pending.pop(0)
            seg, ejected = _segment(calls, host, members)
            out.append(seg)
            pending.extend((e, [e]) for e in ejected)
    out.sort(key=lambda s: s.calls[0])
    return out


def merge_stats(calls: Sequence[Call], segments: Sequence[Segment]) -> MergeStats:
    return MergeStats(
        calls=sum(1 for c in calls if c.completion_ids),
        samples=len(segments),
        tokens_unmerged=sum(len(c.full) for c in calls if c.completion_ids),
        tokens_merged=sum(len(s.input_ids) for s in segments),
    )
