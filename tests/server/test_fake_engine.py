"""FakeEngine honours the Engine interface: deterministic, stops, trains, saves."""

from __future__ import annotations

import asyncio
from pathlib import Path

from swarm.engine.base import Engine, GenerateRequest, SamplingParams, TrainBatch, TrainSample
from swarm.engine.fake import FakeEngine, token_logprob


def test_protocol_and_determinism(model_dir: Path) -> None:
    eng = FakeEngine(model_dir, seed=3)
    assert isinstance(eng, Engine)
    req = GenerateRequest([1, 2, 3], SamplingParams(max_tokens=50, seed=7))
    a = asyncio.run(eng.generate(req))
    b = asyncio.run(FakeEngine(model_dir, seed=3).generate(req))
    assert a.token_ids == b.token_ids and a.logprobs == [token_logprob(t) for t in a.token_ids]
    assert a.finish_reason in ("stop", "length") and len(a.token_ids) <= 50
    if a.finish_reason == "stop":
        assert a.token_ids[-1] == eng.eos_id


def test_max_tokens_and_stream_chunks(model_dir: Path) -> None:
    eng = FakeEngine(model_dir, stop_probability=0.0, chunk_tokens=2)

    async def collect() -> list:
        return [c async for c in eng.stream(GenerateRequest([5], SamplingParams(max_tokens=5)))]

    chunks = asyncio.run(collect())
    assert sum(len(c.token_ids) for c in chunks) == 5
    assert chunks[-1].finish_reason == "length" and all(c.finish_reason is None for c in chunks[:-1])


def test_script_and_stop_strings(model_dir: Path) -> None:
    eng = FakeEngine(model_dir, script=lambda ids: "41 END 42")
    c = asyncio.run(eng.generate(GenerateRequest([1], SamplingParams(stop=("END",)))))
    assert "END" in eng.tokenizer.decode(c.token_ids) and "42" not in eng.tokenizer.decode(c.token_ids)
    c = asyncio.run(eng.generate(GenerateRequest([1])))
    assert eng.tokenizer.decode(c.token_ids, skip_special_tokens=True) == "41 END 42"
    assert c.finish_reason == "stop"


def test_train_step_save_load(model_dir: Path, tmp_path: Path) -> None:
    eng = FakeEngine(model_dir)
    sample = TrainSample([1, 2], [0, 1], [0.0, -1.0], "e", "g", 1.0)
    metrics = eng.train_step(TrainBatch([sample]))
    assert eng.policy_version == 1 and metrics["trained_tokens"] == 1.0 and len(eng.batches) == 1
    eng.save(tmp_path / "ckpt")
    other = FakeEngine(model_dir)
    other.load(tmp_path / "ckpt")
    assert other.policy_version == 1
    assert FakeEngine(tmp_path / "ckpt").policy_version == 1  # a checkpoint is a model dir
