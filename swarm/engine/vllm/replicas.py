"""Several vLLM server processes behind one engine (`--vllm-replicas N`): routing, weights, restarts.

One vLLM process is one GPU's worth of generation; a cluster node has several. Each `Replica` is
the whole single-process stack of this package, unchanged: a `server.VllmProcess` on its own port
(and, with `--vllm-devices`, its own CUDA_VISIBLE_DEVICES), its own `gate.DrainGate`, its own
`supervisor.Supervisor` (watchdog, restart on the last good weights) and its own publisher
(`publisher.WeightPublisher`, or `adapters.AdapterPublisher` with a LoRA rank) over its own serving
directory. What this module adds is what only several of them need:

* routing (`Router`, pure): a request goes to the replica with the fewest requests in flight (its
  gate's count), ties taken in turn so that idle replicas share the work. A request with an
  affinity key (the episode id, `GenerateRequest.affinity`) goes where that key's earlier calls
  went while that replica is up, because its prompt extends theirs and that replica's prefix cache
  holds it; a key whose replica is dead or restarting is re-pinned to the least loaded one up;
* weights (`ReplicaSet.publish`): the trainer's weights (or adapter) are written and validated
  once, staged to every other replica's serving directory (a hard link of the same file; an
  adapter's few MB copied), then pushed to all replicas at once, each through its own drain gate
  and publisher (drain, reload, relabel, resume, rollback on failure: publisher.py). `train_step`
  returns only when every push has ended, and the server's generation gate holds the next
  generation until then, so no replica serves it with the old weights; a replica whose push failed
  serves its last good version and labels its completions with it (`served_version` is the lowest);
* failure: a dead replica is restarted by its own supervisor (watchdog, or the request that found
  it gone, in the background) while the router sends new requests to the others. A request whose
  replica went away before it produced a token is sent again to another replica (the engine's
  `_stream`); one that had streamed tokens ends with `VllmEngineError` (a 500 the client's OpenAI
  SDK retries), as with one process. A sync waits for a restarting replica under its lock, then
  pushes to it, so training goes on and the restarted replica serves the new weights too.

With one replica this is the single-process engine exactly: the same parts, one push.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from swarm.engine.vllm.adapters import AdapterPublisher
from swarm.engine.vllm.errors import VllmEngineError
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.publisher import WeightPublisher
from swarm.engine.vllm.server import VllmProcess
from swarm.engine.vllm.stream import CompletionsClient
from swarm.engine.vllm.supervisor import Supervisor

log = logging.getLogger("swarm.engine.vllm")

Publisher = WeightPublisher | AdapterPublisher
T = TypeVar("T")


class Router:
    """Which replica a request goes to: its key's replica while up, else the least loaded up (module docstring).

    Pure and thread-safe: it sees only the replicas' loads and whether each is up. At most
    `max_keys` keys are remembered (the least recently used are forgotten: finished episodes).
    """

    def __init__(self, n: int, max_keys: int = 65536) -> None:
        if n < 1:
            raise ValueError(f"a router needs at least one replica, not {n}")
        self.n = n
        self.max_keys = max_keys
        self._pins: OrderedDict[str, int] = OrderedDict()
        self._turn = 0
        self._lock = threading.Lock()

    def pinned(self, key: str) -> int | None:
        """The replica `key` is pinned to (None: none yet, or forgotten)."""
        with self._lock:
            return self._pins.get(key)

    def pick(self, loads: Sequence[int], up: Sequence[bool], key: str | None = None) -> int:
        """The replica for a request with affinity `key` (None: none), given each replica's requests in
        flight (`loads`) and whether it can take one now (`up`). With none up, the least loaded of all
        (the request waits at its gate for the restart)."""
        if len(loads) != self.n or len(up) != self.n:
            raise ValueError(f"{len(loads)} loads and {len(up)} states for {self.n} replicas")
        with self._lock:
            if key is not None and (i := self._pins.get(key)) is not None and up[i]:
                self._pins.move_to_end(key)
                return i
            order = [(self._turn + k) % self.n for k in range(self.n)]
            best = min([i for i in order if up[i]] or order, key=lambda i: loads[i])  # first of the least loaded
            self._turn = (best + 1) % self.n
            if key is not None:
                self._pins[key] = best
                self._pins.move_to_end(key)
                while len(self._pins) > self.max_keys:
                    self._pins.popitem(last=False)
            return best


@dataclass(eq=False)
class Replica:
    """One vLLM process and the parts that serve it (module docstring); `requests` counts those routed here."""

    index: int
    process: VllmProcess
    gate: DrainGate
    supervisor: Supervisor
    publisher: Publisher
    client: CompletionsClient
    requests: int = 0

    def up(self) -> bool:
        """Running and not being restarted: a new request sent here is served now."""
        return self.process.alive() and not self.supervisor.restarting

    def label(self, served_name: str) -> tuple[int, str]:
        """What a request admitted here now is labelled with, and the model it names (LoRA: that version's)."""
        p = self.publisher
        return p.served_version, (p.served_model if isinstance(p, AdapterPublisher) else served_name)


class ReplicaSet:
    """The replicas of one engine, their router, and the operations that span them (module docstring)."""

    def __init__(self, replicas: Sequence[Replica] = ()) -> None:
        self.replicas: list[Replica] = []
        for r in replicas:
            self.add(r)

    def add(self, replica: Replica) -> None:
        """One more replica (before `start`; the engine builds each from the first one's files)."""
        if replica.index != len(self.replicas):
            raise ValueError(f"replica {replica.index} added as number {len(self.replicas)}")
        self.replicas.append(replica)
        self.router = Router(len(self.replicas))

    def __len__(self) -> int:
        return len(self.replicas)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.replicas)

    def __getitem__(self, index: int) -> Replica:
        return self.replicas[index]

    # -- routing ------------------------------------------------------------------
    def choose(self, key: str | None = None, exclude: Collection[int] = ()) -> Replica:
        """The replica for a request with affinity `key`, never one of `exclude` while another is left."""
        loads = [r.gate.in_flight for r in self.replicas]
        up = [r.up() and r.index not in exclude for r in self.replicas]
        if not any(up) and len(exclude) < len(self.replicas):  # none up: wait for a replica not excluded
            loads = [n if r.index not in exclude else 1 << 30 for n, r in zip(loads, self.replicas)]
        replica = self.replicas[self.router.pick(loads, up, key)]
        replica.requests += 1
        return replica

    def others_up(self, tried: Collection[int]) -> bool:
        """Whether a replica not in `tried` is up (a request that lost its replica can go there)."""
        return any(r.up() for r in self.replicas if r.index not in tried)

    def recover_later(self, replica: Replica, reason: str) -> None:
        """Restart `replica` in the background (unless healthy by then): the request that found it gone fails
        over to another replica instead of waiting for the restart."""

        def run() -> None:
            try:
                replica.supervisor.recover(reason)
            except Exception:  # noqa: BLE001 - its watchdog or the next request retries
                log.exception("restarting vLLM replica %d failed", replica.index)

        threading.Thread(target=run, name=f"roost-vllm-{replica.index}-recover", daemon=True).start()

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """Start every replica at once (each waits until healthy); if one fails, stop them all and raise."""
        try:
            self._each(lambda r: r.supervisor.start())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop watching and stop every process (after any sync or restart under way)."""
        self._each(lambda r: r.supervisor.close(), raise_first=False)
        for r in self.replicas:
            r.publisher.close()  # its control client

    # -- versions and counters ------------------------------------------------------------
    @property
    def served_version(self) -> int:
        """The oldest version a replica serves (all the same but after a failed push to one)."""
        return min(r.publisher.served_version for r in self.replicas)

    def adopt(self, version: int) -> None:
        """Relabel the weights every replica serves as `version` (a resume)."""
        for r in self.replicas:
            r.publisher.adopt(version)

    def counters(self) -> Counter[str]:
        """The publishers' counters summed over replicas, and `restarts`."""
        total: Counter[str] = Counter()
        for r in self.replicas:
            total.update(r.publisher.counters)
            total["restarts"] += r.supervisor.restarts
        return total

    # -- weights -------------------------------------------------------------------
    def publish(self, write: Callable[[], Path], version: int, *, validate_first: bool = True) -> dict[str, float]:
        """Serve on every replica, as `version`, the candidate `write()` puts in the first replica's publisher.

        Validated once (`CheckpointRefused`: nothing sent anywhere), staged to the others, pushed to
        all at once. `VllmEngineError` if any replica could not take it (each such one serves its last
        good version on; the others serve `version`). Timings: the slowest replica's.
        """
        first = self.replicas[0].publisher
        t0 = time.perf_counter()
        candidate = write()
        t_write = time.perf_counter() - t0
        if validate_first:
            first.check(candidate)
        t_valid = time.perf_counter() - t0 - t_write
        staged = {0: candidate}
        for r in self.replicas[1:]:
            staged[r.index] = r.publisher.stage(candidate, version, link=True)
        results = self._each(lambda r: r.publisher.push(staged[r.index], version, validate_first=False))
        metrics: dict[str, float] = {}
        for m in results:
            for k, v in m.items():
                metrics[k] = max(v, metrics.get(k, v))
        metrics.update(vllm_write_s=t_write, vllm_validate_s=t_valid)
        return metrics

    def _each(self, work: Callable[[Replica], object], *, raise_first: bool = True) -> list:
        return on_each(self.replicas, work, raise_first=raise_first)


def on_each(items: Sequence[T], work: Callable[[T], object], *, raise_first: bool = True) -> list:
    """`work(item)` for the replicas' `items` (replica i's at index i) all at once; the results in order.

    With one item it runs here (its exception as it is); with several, every call ends before failures
    are raised as one `VllmEngineError` naming each replica (`raise_first=False`: logged only)."""
    if len(items) == 1:
        return [work(items[0])]
    with ThreadPoolExecutor(len(items), thread_name_prefix="roost-vllm-replicas") as pool:
        futures = [pool.submit(work, item) for item in items]
    failed = [(i, f.exception()) for i, f in enumerate(futures) if f.exception() is not None]
    if failed and raise_first:
        raise VllmEngineError(
            "; ".join(f"vLLM replica {i}: {exc}" for i, exc in failed)
            + f" (the other {len(items) - len(failed)} replicas succeeded)"
        ) from failed[0][1]
    for i, exc in failed:
        log.error("vLLM replica %d: %s", i, exc)
    return [f.result() for f in futures if f.exception() is None]
