"""Put new weights into a running vLLM server, between requests, and roll back when it cannot take them.

After every training step the trainer's weights must reach vLLM before any later
generation, and a request must never mix two policies:

1. the weights are written atomically to `candidate/model.safetensors` and validated
   (names, shapes, dtypes, finite: the trainer's tensors in memory before the write and the
   file by its header after it, a file from elsewhere read whole: weights.py): a bad file is
   refused (`CheckpointRefused`), nothing is sent to vLLM, and it keeps serving the last good
   weights;
2. the drain gate closes: new requests wait, requests in flight finish on the old
   weights and carry the old version (pause mode `wait`). If they outlast
   `drain_timeout_s`, `/pause?mode=abort` ends them with `finish_reason: "abort"`
   and the tokens they had (still the old version);
3. `/pause?mode=wait` (nothing runs by now; it also holds anyone else's requests),
   `/collective_rpc roost_reload` (in-place reload + the tied-embeddings `lm_head`
   re-pack, worker/roost_vllm_ext.py), `/update_weight_version`,
   `/reset_prefix_cache`, `/resume`; the candidate becomes the last good file;
4. the gate opens: the waiting requests go out, labelled with the new version.

A reload vLLM fails leaves its model half-loaded (meta tensors; the next forward
kills the engine core, and an in-place reload of the old file fails too), so the
rollback is a restart of the server on the last good file (by the supervisor,
whose `on_start` is `relabel`). The publisher owns the versions: `served_version`
labels every completion, and can lag the trainer's after a failed sync.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch

from swarm.engine.vllm.errors import VllmEngineError, post_route
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.supervisor import control_client
from swarm.engine.vllm.weights import CheckpointRefused, ServingDir

log = logging.getLogger("swarm.engine.vllm")


class Upstream(Protocol):
    """What the publisher needs of the server's supervisor (`supervisor.Supervisor` is one)."""

    lock: AbstractContextManager[Any]

    @property
    def url(self) -> str: ...

    def healthy(self) -> bool: ...

    def recover(self, reason: str) -> None: ...

    def restart(self, reason: str) -> None: ...


class WeightPublisher:
    """Publishes weights files from `serving` to the server `upstream` supervises, as numbered versions."""

    def __init__(
        self, serving: ServingDir, gate: DrainGate, upstream: Upstream, *, version: int, drain_timeout_s: float
    ) -> None:
        self.serving = serving
        self.gate = gate
        self.upstream = upstream
        self.drain_timeout_s = drain_timeout_s
        self.good_version = self.served_version = int(version)
        #: syncs, sync_failures, refused, rollbacks, aborted_in_sync
        self.counters: Counter[str] = Counter()
        #: one client for every control call (supervisor.control_client: a new one per call costs its TLS context)
        self._http = control_client()

    def close(self) -> None:
        """Close the control client (after the last sync)."""
        self._http.close()

    # -- versions ---------------------------------------------------------------
    def relabel(self) -> None:
        """The server (just started) serves the last good file: label it with that file's version."""
        self.served_version = self.good_version
        log.info("vLLM serves %s as version %d", self.serving.good, self.good_version)
        self._post("/update_weight_version", {"new_version": str(self.good_version)})

    def adopt(self, version: int) -> None:
        """Relabel the weights served now as `version` (a resume: the trainer's version is set after a load)."""
        with self.upstream.lock:
            if self.good_version == self.served_version:
                self.good_version = self.served_version = int(version)
                self._post("/update_weight_version", {"new_version": str(version)})

    # -- publishing -------------------------------------------------------------
    def publish(self, state: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Serve the tensors `state` as `version`; the sync's timings as metrics."""
        return self.push(self.serving.write_candidate(state), version)

    def offer(self, path: Path, version: int, *, validate_first: bool = True) -> dict[str, float]:
        """Serve the weights in safetensors file `path` as `version` (what `publish` does with a state)."""
        return self.push(self.stage(path, version), version, validate_first=validate_first)

    def stage(self, path: Path, version: int, *, link: bool = False) -> Path:
        """Weights file `path` as this publisher's candidate (`link`: hard-linked, for the candidate another
        replica's publisher wrote; swarm/engine/vllm/replicas.py). `version` is the adapter publisher's."""
        return self.serving.take_candidate(path, link=link)

    def check(self, candidate: Path) -> None:
        """Validate `candidate` before anything is sent: a bad file is counted (`refused`), discarded, raised.

        The trainer's own (`publish`) by its in-memory check and the written file's header, any other
        file read whole (`ServingDir.check_candidate`)."""
        try:
            self.serving.check_candidate(candidate)
        except CheckpointRefused:
            self.counters["refused"] += 1
            self.serving.discard_candidate()
            raise

    def push(self, candidate: Path, version: int, validate_first: bool = True) -> dict[str, float]:
        """Validate `candidate`, drain, reload, relabel, resume (the module docstring's steps).

        `CheckpointRefused` (nothing loaded) or `VllmEngineError` (rolled back: the server was
        restarted on the last good file) on failure.
        """
        t0 = time.perf_counter()
        if validate_first:
            self.check(candidate)
        t_valid = time.perf_counter() - t0
        with self.upstream.lock:
            if not self.upstream.healthy():
                self.upstream.recover("found dead before a weight sync")
            t_drain = time.perf_counter()
            drain_s = self.gate.drain(self.drain_timeout_s, self._abort)
            try:
                t1 = time.perf_counter()
                self._post("/pause", params={"mode": "wait"})
                result = self._post("/collective_rpc", {"method": "roost_reload", "args": [str(candidate.parent)]})
                reload_s = time.perf_counter() - t1
                self.serving.promote(candidate)
                self.good_version = self.served_version = int(version)
                self._post("/update_weight_version", {"new_version": str(version)})
                self._post("/reset_prefix_cache")
                self._post("/resume")
                self.counters["syncs"] += 1
            except VllmEngineError as exc:
                self.counters["sync_failures"] += 1
                self.counters["rollbacks"] += 1
                self.serving.discard_candidate()
                self.upstream.restart(
                    f"weight reload failed ({exc}); rolling back to {self.serving.good}, version {self.good_version}"
                )
                raise VllmEngineError(
                    f"vLLM could not load the weights of version {version}; serving "
                    f"version {self.good_version} again (restarted)"
                ) from exc
            finally:
                self.gate.reopen()
        worker = (result.get("results") or [{}])[0] if isinstance(result, dict) else {}
        return {
            "vllm_validate_s": t_valid,
            "vllm_wait_s": t_drain - t0 - t_valid,
            "vllm_drain_s": drain_s,
            "vllm_reload_s": reload_s,
            "vllm_worker_reload_s": float(worker.get("reload_s", 0.0)),
        }

    def _abort(self, running: int) -> None:
        """The drain timed out: end the `running` requests (they finish with `finish_reason: abort`)."""
        log.warning(
            "%d requests still running after %.0fs: aborting them for the weight sync", running, self.drain_timeout_s
        )
        self.counters["aborted_in_sync"] += running
        self._post("/pause", params={"mode": "abort"})

    def _post(self, route: str, body: dict[str, Any] | None = None, params: dict[str, str] | None = None) -> Any:
        """POST a control route of vLLM (dev mode); `VllmEngineError` unless it answers 200."""
        return post_route(self._http.post, self.upstream.url, route, body, params)
