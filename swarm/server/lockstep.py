"""Deterministic mode (`--deterministic`): what makes the same config and seed give the same run.

Three things decide a run besides its config, and each is pinned here or beside it:

* **Which tokens a call samples.** An episode's calls are seeded from its identity, never from
  what shares its engine batch: `derive_seed(run seed, task, occurrence, slot, call)`, where the
  occurrence counts the task's earlier groups in this run (a dataset of several epochs), the slot
  is the episode's index among its group's members (0..n-1, handed out at claim; members of one
  task are interchangeable, so whichever client thread claims first takes slot 0 and the group's
  set of trajectories is the same), and the call is the episode's call count so far. A request
  that names its own `seed` keeps it. `swarm/engine/sampling.py` draws a seeded row's uniforms
  from its own generator, so they do not depend on its batch-mates.
* **Which weights generated them.** Lockstep: staleness 0 and no claims while a step trains
  (`ServerConfig._lockstep`), so every episode of step k is claimed after step k-1's weights are
  in and finished before step k starts.
* **Which episodes form step k, in which order.** The fleet claims in dataset order, one claim at
  a time (`swarm/client/_turnstile.py`), so window k admits the dataset's tasks in order; and here
  a taken batch is sorted (groups by task and occurrence, members by slot), so the step's samples,
  and the float sums over them, do not follow finish order.

What is left is numerical: a row's logits depend slightly on its batch's shape (padding width,
matmul blocking, a cached prefill against a fresh one), so a token whose uniform falls within
~1e-7 of a CDF boundary can flip. docs/researcher-statistics.md ("Reproducible trials") measures
how often. Pure bookkeeping, no I/O: `Swarm` calls it from the event loop.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable

from swarm.server.batcher import Batch, Group
from swarm.server.episodes import Episode

#: seeds are taken modulo this (the engines' and the OpenAI routes' seed range)
SEED_MOD = 1 << 63


def derive_seed(run_seed: int, task_id: str, occurrence: int, slot: int, call: int) -> int:
    """A call's sampling seed from the run seed and the call's place in the run, never its timing.

    A hash rather than arithmetic: neighbouring places (slot 0 and 1, call 0 and 1) must not give
    seeds whose streams start alike, and n choices of one call add their index to it
    (`generation.py`), which must not land on another place's seed."""
    key = f"roost-lockstep:{run_seed}:{occurrence}:{slot}:{call}:{task_id}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % SEED_MOD


def free_slot(taken: Iterable[int]) -> int:
    """The lowest slot index not taken: a released slot's replacement takes its index back, so a
    group's members keep the indices 0..n-1 however claims, aborts and retries interleave."""
    used = set(taken)
    slot = 0
    while slot in used:
        slot += 1
    return slot


def batch_order(groups: list[Group], occurrence: dict[str, int], slots: dict[str, int]) -> list[Group]:
    """The groups of a batch in a fixed order (task, occurrence), each one's finished members by slot.

    Sorts `Group.finished` in place; returns the groups sorted. Unknown ids (groups restored from
    the buffer after a restart) sort after the known ones, by their ids."""
    for g in groups:
        g.finished.sort(key=lambda e: (slots.get(e.episode_id, 1 << 30), e.episode_id))
    return sorted(groups, key=lambda g: (g.task_id, occurrence.get(g.group_id, 1 << 30), g.group_id))


class Lockstep:
    """A deterministic server's bookkeeping: each open episode's place (slot, calls so far) and
    each group's occurrence, until its batch is taken."""

    def __init__(self, run_seed: int) -> None:
        self.run_seed = run_seed
        self._groups_of_task: Counter[str] = Counter()  # groups opened so far per task (occurrences)
        self.occurrence: dict[str, int] = {}  # group id -> its task's earlier groups
        self.slots: dict[str, dict[str, int]] = {}  # group id -> episode id -> slot
        self._calls: dict[str, int] = {}  # episode id -> calls seeded so far

    def admitted(self, episode_id: str, group: Group) -> int:
        """`episode_id` got a slot in `group` (a claim): its slot index, kept until the batch is taken."""
        if group.group_id not in self.occurrence:
            self.occurrence[group.group_id] = self._groups_of_task[group.task_id]
            self._groups_of_task[group.task_id] += 1
        members = self.slots.setdefault(group.group_id, {})
        if episode_id not in members:
            live = set(group.claimed) | {e.episode_id for e in group.finished}
            members[episode_id] = free_slot(s for e, s in members.items() if e in live and e != episode_id)
        self._calls.pop(episode_id, None)  # a handed-over episode (same id, same slot) plays its calls afresh
        return members[episode_id]

    def seed_for(self, ep: Episode) -> int:
        """The seed of `ep`'s next call (its calls are counted as they are prepared)."""
        call = self._calls.get(ep.id, 0)
        self._calls[ep.id] = call + 1
        slot = self.slots.get(ep.group_id, {}).get(ep.id, 0)
        occurrence = self.occurrence.get(ep.group_id, 0)
        return derive_seed(self.run_seed, ep.task_id, occurrence, slot, call)

    def order(self, batch: Batch) -> None:
        """A taken batch in its fixed order (listener of `batch_taken`); its groups' places are forgotten."""
        slots = {e: s for g in batch.groups for e, s in self.slots.get(g.group_id, {}).items()}
        batch.groups = batch_order(batch.groups, self.occurrence, slots)
        for g in batch.groups:
            for episode_id in self.slots.pop(g.group_id, {}):
                self._calls.pop(episode_id, None)
            self.occurrence.pop(g.group_id, None)


__all__ = ["SEED_MOD", "Lockstep", "batch_order", "derive_seed", "free_slot"]
