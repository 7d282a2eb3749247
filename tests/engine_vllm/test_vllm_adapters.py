"""The vllm engine's LoRA adapter sync alone: validation, and the publisher against a stub of vLLM's routes.

No vLLM. The adapter is a real peft one (`save_adapter` of a 2-layer Qwen2 built in memory);
a real HTTP server in a thread stands in for vLLM's `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (recording the gate's state at each call) and keeps the set of
adapter names vLLM would hold, so the checks are: a bad adapter never reaches the server, each
sync loads the new version beside the old one, switches the label and model name with the gate
drained, and unloads the old one afterwards (at most two names held, ever); a load the server
refuses leaves the old version serving.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2Config, Qwen2ForCausalLM
from vllm_helpers import StubSupervisor, loopback_server, reply

from swarm.config.lora import LoraSettings
from swarm.config.vllm import max_lora_rank
from swarm.engine.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, attach, save_adapter
from swarm.engine.vllm.adapters import AdapterPublisher, adapter_layout, validate_adapter
from swarm.engine.vllm.errors import VllmEngineError
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.server import VllmProcess
from swarm.engine.vllm.weights import CheckpointRefused

RANK = 4


@pytest.fixture(scope="module")
def peft_model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    )
    return attach(Qwen2ForCausalLM(cfg), LoraSettings(rank=RANK), tmp_path_factory.mktemp("base"))


def _save(model: torch.nn.Module, fill: float | None = None):
    """A `Save` of the model's adapter, its B matrices set to `fill` first (distinct versions)."""

    def save(path: Path) -> None:
        if fill is not None:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.fill_(fill)
        save_adapter(model, path)

    return save


def test_max_lora_rank_is_the_smallest_vllm_accepts():
    assert [max_lora_rank(r) for r in (1, 2, 4, 8, 9, 64, 300, 512)] == [1, 8, 8, 8, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="at most 512"):
        max_lora_rank(513)


def test_the_vllm_command_line_enables_lora_only_with_a_rank(tmp_path):
    from swarm.config.vllm import VllmSettings

    def process(rank: int) -> VllmProcess:
        return VllmProcess(Path("python"), tmp_path, "roost", VllmSettings(port=8011), tmp_path / "log", lora_rank=rank)

    full, lora = process(0), process(4)
    assert "--enable-lora" not in full.command() and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in full.env()
    extra = lora.command()[len(full.command()) :]
    assert extra == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]
    assert lora.command()[: len(full.command())] == full.command()  # full-parameter runs keep theirs exactly
    assert lora.env()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_one_worker_in_the_engine_core_unless_the_args_ask_for_parallelism(tmp_path):
    """`uni` saves the CPU platform's third process (a start's CPU 28-30 s became 18 s); `-tp 2` and the like keep
    vLLM's own executor."""
    from swarm.config.vllm import VllmSettings

    def process(args: str) -> VllmProcess:
        return VllmProcess(Path("python"), tmp_path, "roost", VllmSettings(args=args), tmp_path / "log")

    uni = "--distributed-executor-backend uni"
    for args in ("", "--dtype bfloat16"):
        assert uni in " ".join(process(args).command())
        assert process(args).env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # else vLLM ignores uni on a CPU
    for args in ("-tp 2", "--tensor-parallel-size 2", "--distributed-executor-backend mp", "-dp 2"):
        assert "uni" not in process(args).command(), args
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in process(args).env()


def test_validation_refuses_corrupt_nan_and_foreign_adapters(peft_model, tmp_path):
    layout = adapter_layout(peft_model)
    good = tmp_path / "good"
    _save(peft_model)(good)
    validate_adapter(good, layout, RANK)
    tensors = load_file(str(good / ADAPTER_WEIGHTS))
    some = sorted(tensors)[0]

    def variant(name: str, state: dict[str, torch.Tensor] | None = None, config: str | None = None) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / ADAPTER_CONFIG).write_text(config if config is not None else (good / ADAPTER_CONFIG).read_text())
        if state is not None:
            save_file(state, str(d / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        return d

    nan = {k: v.clone() for k, v in tensors.items()}
    nan[some].view(-1)[0] = math.nan
    inf = {k: v.clone() for k, v in tensors.items()}
    inf[some].view(-1)[-1] = math.inf
    truncated = variant("truncated")
    (truncated / ADAPTER_WEIGHTS).write_bytes((good / ADAPTER_WEIGHTS).read_bytes()[:-100])
    other_rank = json.loads((good / ADAPTER_CONFIG).read_text()) | {"r": 8}
    cases = {
        "NaN or inf": [variant("nan", nan), variant("inf", inf)],
        "not a readable safetensors": [truncated, variant("no-weights")],
        "names differ": [
            variant("renamed", {k.replace("lora_A", "lora_X"): v for k, v in tensors.items()}),
            variant("missing", {k: v for k, v in tensors.items() if k != some}),
        ],
        "the model's is": [variant("shape", {k: (v[:-1] if k == some else v) for k, v in tensors.items()})],
        "dtype|float16": [variant("dtype", {k: v.half() for k, v in tensors.items()})],
        "rank 8": [variant("rank", tensors, json.dumps(other_rank))],
        "not readable JSON": [variant("config", tensors, "{not json")],
    }
    for words, dirs in cases.items():
        for d in dirs:
            with pytest.raises(CheckpointRefused, match=words):
                validate_adapter(d, layout, RANK)


class Vllm:
    """vLLM's adapter routes: load (refused when told to) and unload, keeping the names it holds."""

    def __init__(self, gate: DrainGate) -> None:
        self.gate = gate
        self.held: list[str] = []
        self.most_held = 0
        self.fail_load = False
        self.fail_unload = False
        self.drained: list[tuple[str, bool]] = []  # (route, the gate's state) at each call
        self.lock = threading.Lock()

    def __call__(self, method: str, path: str, body: Any, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.drained.append((path, self.gate.draining))
            if path == "/v1/load_lora_adapter":
                assert (Path(body["lora_path"]) / ADAPTER_WEIGHTS).is_file()
                if self.fail_load:
                    return reply(h, 500, {"error": {"message": "cannot load"}})
                if body["lora_name"] in self.held:
                    return reply(h, 400, {"error": {"message": "already loaded"}})
                self.held.append(body["lora_name"])
                self.most_held = max(self.most_held, len(self.held))
            elif path == "/v1/unload_lora_adapter":
                if self.fail_unload:
                    return reply(h, 500, {"error": {"message": "busy"}})
                if body["lora_name"] not in self.held:
                    return reply(h, 404, {"error": {"message": "not found"}})
                self.held.remove(body["lora_name"])
            reply(h, 200, "Success", content_type="text/plain")


@pytest.fixture
def setup(peft_model, tmp_path):
    """A publisher serving version 0 (the fresh adapter) on the stub, as the engine starts one."""
    gate = DrainGate()
    vllm = Vllm(gate)
    with loopback_server(vllm) as (url, rec):
        upstream = StubSupervisor(url, on_restart=vllm.held.clear)  # a fresh server holds none
        publisher = AdapterPublisher(
            tmp_path / "adapters",
            adapter_layout(peft_model),
            RANK,
            gate,
            upstream,
            served_name="roost",
            version=0,
            drain_timeout_s=5.0,
        )
        upstream.publisher = publisher
        publisher.prepare(_save(peft_model, 0.0))
        publisher.relabel()  # the supervisor's on_start
        yield publisher, vllm, rec


def _dirs(publisher: AdapterPublisher) -> list[str]:
    return sorted(p.name for p in publisher.root.iterdir())


def test_version_0_is_the_fresh_adapter_loaded_at_start(setup):
    publisher, vllm, rec = setup
    assert rec.routes() == ["/v1/load_lora_adapter"] and vllm.held == ["roost-v0"]
    assert publisher.served_model == "roost-v0" and publisher.served_version == 0 and _dirs(publisher) == ["v0"]
    b = [v for k, v in load_file(str(publisher.good / ADAPTER_WEIGHTS)).items() if "lora_B" in k]
    assert b and all(bool((t == 0).all()) for t in b)  # B = 0: the base's outputs


def test_each_sync_loads_the_new_version_beside_the_old_then_unloads_the_old(setup, peft_model):
    publisher, vllm, rec = setup
    for version in (1, 2, 3):
        metrics = publisher.publish(_save(peft_model, 0.01 * version), version)
        assert publisher.served_model == f"roost-v{version}" and publisher.served_version == version
        assert vllm.held == publisher.loaded == [f"roost-v{version}"]
        assert _dirs(publisher) == [f"v{version}"]  # the old directory goes with the old version
        assert {"vllm_write_s", "vllm_validate_s", "vllm_reload_s", "vllm_drain_s", "vllm_unload_s"} <= set(metrics)
    assert vllm.most_held == 2  # the serving version and the next, never more
    assert rec.routes()[1:] == ["/health", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"] * 3
    # the load runs with the gate open (the old version serves meanwhile); the unload after it reopened
    assert not any(drained for _path, drained in vllm.drained) and not publisher.gate.draining
    assert publisher.counters["syncs"] == 3 and publisher.counters["unloaded"] == 3
    served = load_file(str(publisher.good / ADAPTER_WEIGHTS))
    assert all(float(v.flatten()[0]) == pytest.approx(0.03) for k, v in served.items() if "lora_B" in k)


def test_a_refused_adapter_never_reaches_the_server(setup, peft_model, tmp_path):
    publisher, vllm, rec = setup
    publisher.publish(_save(peft_model, 0.01), 1)
    bad = tmp_path / "bad"
    _save(peft_model)(bad)
    tensors = load_file(str(bad / ADAPTER_WEIGHTS))
    name = next(k for k in tensors if "lora_B" in k)
    tensors[name].view(-1)[0] = math.nan
    save_file(tensors, str(bad / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    calls = len(rec.calls)
    with pytest.raises(CheckpointRefused, match="NaN"):
        publisher.offer(bad, 2)
    assert len(rec.calls) == calls and vllm.held == ["roost-v1"]
    assert publisher.counters["refused"] == 1 and publisher.served_version == 1 and _dirs(publisher) == ["v1"]


def test_a_load_vllm_refuses_leaves_the_old_version_serving(setup, peft_model):
    publisher, vllm, _rec = setup
    vllm.fail_load = True
    with pytest.raises(VllmEngineError, match="version 0 serves on"):
        publisher.publish(_save(peft_model, 0.01), 1)
    assert publisher.served_model == "roost-v0" and vllm.held == ["roost-v0"] and _dirs(publisher) == ["v0"]
    assert publisher.counters["sync_failures"] == 1 and not publisher.gate.draining
    vllm.fail_load = False
    publisher.publish(_save(peft_model, 0.02), 2)
    assert vllm.held == ["roost-v2"]


def test_a_failed_unload_is_retried_and_counted(setup, peft_model):
    publisher, vllm, _rec = setup
    vllm.fail_unload = True
    publisher.publish(_save(peft_model, 0.01), 1)
    assert publisher.counters["unload_failures"] == 1 and publisher.loaded == ["roost-v0", "roost-v1"]
    vllm.fail_unload = False
    publisher.publish(_save(peft_model, 0.02), 2)
    assert vllm.held == publisher.loaded == ["roost-v2"] and publisher.counters["unloaded"] == 2


def test_a_request_outlasting_the_drain_is_aborted_then_vllm_resumed(setup, peft_model):
    publisher, vllm, rec = setup
    publisher.drain_timeout_s = 0.05
    assert publisher.gate.enter_blocking(lambda: publisher.served_model) == "roost-v0"  # a request in flight

    def answer(method: str, path: str, body: Any, h: BaseHTTPRequestHandler) -> None:
        if path == "/pause?mode=abort":
            publisher.gate.leave()  # vLLM ends it
            return reply(h, 200, b"", content_type="text/plain")
        Vllm.__call__(vllm, method, path, body, h)

    with loopback_server(answer) as (url, rec2):
        publisher.upstream.url = url  # type: ignore[misc]
        publisher.publish(_save(peft_model, 0.01), 1)
    assert rec2.routes() == [
        "/health",
        "/v1/load_lora_adapter",
        "/pause?mode=abort",
        "/resume",
        "/v1/unload_lora_adapter",
    ]
    assert publisher.counters["aborted_in_sync"] == 1 and publisher.gate.in_flight == 0


def test_a_policys_straggler_ends_itself_and_vllm_is_never_paused(setup, peft_model):
    """`abort_by_pause=False` (a policy on a vLLM shared with others): a drain that times out sets the
    gate's `aborting` for the policy's own streams to end themselves, and posts no `/pause` (it would end
    every policy's requests) and so no `/resume`; `aborting` is off again once the drain is over."""
    publisher, vllm, _rec = setup
    publisher.drain_timeout_s = 0.05
    publisher.abort_by_pause = False
    assert publisher.gate.enter_blocking(lambda: publisher.served_model) == "roost-v0"  # a request in flight
    seen: list[bool] = []

    def stream() -> None:  # the stream's side: it sees the abort at its next chunk and leaves
        while not publisher.gate.aborting:
            time.sleep(0.005)
        seen.append(publisher.gate.aborting)
        publisher.gate.leave()

    reader = threading.Thread(target=stream)
    reader.start()
    with loopback_server(vllm) as (url, rec):
        publisher.upstream.url = url  # type: ignore[misc]
        publisher.publish(_save(peft_model, 0.01), 1)
    reader.join(5)
    assert seen == [True] and not publisher.gate.aborting and publisher.gate.in_flight == 0
    assert rec.routes() == ["/health", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
    assert publisher.counters["aborted_in_sync"] == 1 and publisher.served_version == 1


def test_a_restart_loads_the_last_good_version_and_adopt_relabels_it(setup, peft_model):
    publisher, vllm, _rec = setup
    publisher.publish(_save(peft_model, 0.01), 1)
    publisher.upstream.restart("killed")  # type: ignore[attr-defined]
    assert vllm.held == publisher.loaded == ["roost-v1"] and publisher.served_version == 1
    publisher.adopt(7)  # a resume labels what serves with the checkpoint's version
    assert vllm.held == ["roost-v7"] and publisher.served_version == 7 and _dirs(publisher) == ["v1"]
    publisher.publish(_save(peft_model, 0.02), 7)  # the same version again: fresh names, no clash
    assert vllm.held == ["roost-v7.2"] and _dirs(publisher) == ["v7"]
