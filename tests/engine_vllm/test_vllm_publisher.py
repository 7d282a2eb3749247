"""The vllm engine's weight publisher alone, against a stub of vLLM's control routes on loopback.

No vLLM: a real HTTP server in a thread records the routes the publisher calls and
whether the drain gate was closed at each, and a stub supervisor stands in for the
process (its `restart` relabels, as the real supervisor's `on_start` does). What is
checked is the order of a sync (pause, reload, relabel, reset the cache, resume),
that a file failing validation never reaches the server, and the rollback when the
server fails the reload.
"""

from __future__ import annotations

import asyncio
import math
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from vllm_helpers import StubSupervisor, loopback_server, reply

from swarm.engine.vllm.errors import VllmEngineError
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.publisher import WeightPublisher
from swarm.engine.vllm.weights import CheckpointRefused, ServingDir, layout_of

SYNC = ["/pause?mode=wait", "/collective_rpc", "/update_weight_version", "/reset_prefix_cache", "/resume"]


class Control:
    """vLLM's control routes: 200 to each (the reload reports its time), or 500 to a reload when told to."""

    def __init__(self, gate: DrainGate) -> None:
        self.gate = gate
        self.fail_reload = False
        self.drained: list[bool] = []  # the gate's state at each call
        self.on_abort = lambda: None

    def __call__(self, method: str, path: str, body: Any, h: BaseHTTPRequestHandler) -> None:
        self.drained.append(self.gate.draining)
        if path == "/collective_rpc":
            if self.fail_reload:
                reply(h, 500, "meta tensors", content_type="text/plain")
            else:
                reply(h, 200, {"results": [{"reload_s": 0.25, "retied": True}]})
            return
        if path == "/pause?mode=abort":
            self.on_abort()
        reply(h, 200, b"", content_type="text/plain")


def _state(fill: float) -> dict[str, torch.Tensor]:
    return {"embed.weight": torch.full((4, 2), fill), "norm.bias": torch.full((2,), fill)}


@pytest.fixture
def setup(tmp_path: Path):
    """A served directory at version 0 (weights of 0.0), its gate, the control stub and the publisher."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    serving = ServingDir(tmp_path / "serving", layout_of(_state(0.0)))
    serving.prepare(model, _state(0.0))
    gate = DrainGate()
    control = Control(gate)
    with loopback_server(control) as (url, rec):
        upstream = StubSupervisor(url)
        publisher = WeightPublisher(serving, gate, upstream, version=0, drain_timeout_s=5.0)
        upstream.publisher = publisher
        yield publisher, control, rec, upstream


def _good(publisher: WeightPublisher) -> float:
    return float(load_file(str(publisher.serving.good))["norm.bias"][0])


def test_a_sync_pauses_reloads_relabels_and_resumes_with_the_gate_closed(setup):
    publisher, control, rec, _ = setup
    metrics = publisher.publish(_state(1.0), 1)
    assert rec.routes() == SYNC
    calls = {path: body for _m, path, body in rec.calls}
    assert calls["/collective_rpc"] == {"method": "roost_reload", "args": [str(publisher.serving.candidate.parent)]}
    assert calls["/update_weight_version"] == {"new_version": "1"}
    assert all(control.drained) and not publisher.gate.draining  # no request in between; open again after
    assert publisher.served_version == publisher.good_version == 1 and _good(publisher) == 1.0
    assert not publisher.serving.candidate.exists()
    assert metrics["vllm_worker_reload_s"] == 0.25 and metrics["vllm_drain_s"] >= 0
    assert publisher.counters["syncs"] == 1

    publisher.adopt(7)  # a resume relabels what is served
    assert publisher.served_version == 7 and rec.calls[-1][1:] == ("/update_weight_version", {"new_version": "7"})


def test_a_file_failing_validation_never_reaches_the_server(setup, tmp_path):
    publisher, _control, rec, upstream = setup
    nan = _state(2.0)
    nan["norm.bias"][1] = math.nan
    bad_files = {
        "NaN": nan,
        "embed.weight": {**_state(2.0), "embed.weight": torch.zeros(3, 2)},
        "missing": {"norm.bias": torch.zeros(2)},
    }
    for words, state in bad_files.items():
        path = tmp_path / f"bad-{words}.safetensors"
        save_file(state, str(path))
        with pytest.raises(CheckpointRefused, match=words):
            publisher.offer(path, 5)
    assert rec.calls == [] and upstream.restarts == []
    assert publisher.counters["refused"] == 3 and publisher.served_version == 0 and _good(publisher) == 0.0
    assert not publisher.serving.candidate.exists()


def test_a_reload_the_server_fails_rolls_back_to_the_last_good_file(setup):
    publisher, control, rec, upstream = setup
    publisher.publish(_state(1.0), 1)
    control.fail_reload = True
    with pytest.raises(VllmEngineError, match="weights of version 2; serving version 1 again"):
        publisher.publish(_state(2.0), 2)
    assert rec.routes() == SYNC + ["/pause?mode=wait", "/collective_rpc", "/update_weight_version"]
    assert rec.calls[-1][2] == {"new_version": "1"}  # the restarted server is labelled with the last good version
    assert len(upstream.restarts) == 1 and "rolling back" in upstream.restarts[0]
    assert publisher.served_version == 1 and _good(publisher) == 1.0 and not publisher.serving.candidate.exists()
    assert not publisher.gate.draining
    assert dict(publisher.counters) == {"syncs": 1, "sync_failures": 1, "rollbacks": 1}


def test_a_request_outlasting_the_drain_is_aborted_before_the_reload(setup):
    publisher, control, rec, _ = setup
    publisher.drain_timeout_s = 0.05
    publisher.gate.enter_blocking()  # a request in flight; vLLM ends it when told to abort
    control.on_abort = publisher.gate.leave
    publisher.publish(_state(1.0), 1)
    assert rec.routes() == ["/pause?mode=abort", *SYNC]
    assert publisher.counters["aborted_in_sync"] == 1 and publisher.gate.in_flight == 0


def test_the_gate_holds_new_requests_until_reopened_and_labels_them_at_entry():
    gate = DrainGate(poll_s=0.005)
    version = [1]

    async def go() -> tuple[bool, int]:
        gate.hold()  # a sync or restart under way
        entering = asyncio.create_task(gate.enter(lambda: version[0]))
        await asyncio.sleep(0.1)
        waited = not entering.done()
        version[0] = 2  # the new weights are in
        gate.reopen()
        return waited, await entering

    assert asyncio.run(go()) == (True, 2) and gate.in_flight == 1
    gate.leave()
    assert gate.drain(1.0, on_timeout=lambda n: pytest.fail("nothing was in flight")) < 1.0 and gate.draining
