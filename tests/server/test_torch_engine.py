"""The real torch engine behind the server: OpenAI calls, a training step, resume with the same weights."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

from swarm.client import SwarmClient, run_fleet  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 12+30?"}]


@pytest.mark.slow
def test_torch_engine_end_to_end(make_server, model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from swarm.engine.torch_engine import TorchEngine

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = tmp_path / "run"
    eng = TorchEngine(model_dir, seed=0, device="cpu")
    srv = make_server(engine=eng, out_dir=out, group_size=2, batch_groups=2, checkpoint_every=1)
    client = SwarmClient(srv.url, srv.token)
    with client.episode("probe") as ep:
        r = ep.openai.chat.completions.create(
            model=ep.model, messages=MESSAGES, max_tokens=16, extra_body={"return_token_ids": True}
        )
        ids = r.choices[0].model_extra["token_ids"]
        assert tok.decode(ids, skip_special_tokens=True) == r.choices[0].message.content
        lps = [c.logprob for c in r.choices[0].logprobs.content]
        pids = r.model_extra["prompt_token_ids"]
        assert lps == pytest.approx(eng.logprobs(pids + ids)[len(pids) - 1 :], abs=2e-3)  # rollout == teacher-forced
        stream = ep.openai.chat.completions.create(
            model=ep.model, messages=MESSAGES, max_tokens=16, stream=True, extra_body={"return_token_ids": True}
        )
        text, sids = "", []
        for c in stream:
            if c.choices:
                text += c.choices[0].delta.content or ""
                sids += (c.choices[0].model_extra or {}).get("token_ids", [])
        assert tok.decode(sids, skip_special_tokens=True) == text
    # the block left without finish: the episode was aborted and its slot freed

    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def workflow(task: dict, episode) -> float:
        episode.openai.chat.completions.create(
            model=episode.model, max_tokens=6, messages=[{"role": "user", "content": task["q"]}]
        )
        with lock:  # one success and one failure per group: a nonzero GRPO advantage
            seen[task["task_id"]] += 1
            return float(seen[task["task_id"]] % 2)

    dataset = [{"task_id": "q1", "q": "What is 1+1?"}, {"task_id": "q2", "q": "What is 2+2?"}]
    stats = run_fleet(client, workflow, dataset, n=2, concurrency=4, epochs=1)
    assert stats.finished == 4 and stats.failed == 0
    end = time.monotonic() + 120
    while srv.swarm.trainer.step < 1:
        assert time.monotonic() < end
        time.sleep(0.1)
    assert eng.policy_version == 1
    probe = tok.encode("<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n2", add_special_tokens=False)
    after = eng.logprobs(probe)
    srv.stop()

    eng2 = TorchEngine(model_dir, seed=0, device="cpu")
    assert eng2.logprobs(probe) != pytest.approx(after, abs=1e-6)  # trained weights differ
    srv2 = make_server(engine=eng2, out_dir=out, group_size=2, batch_groups=2, checkpoint_every=1)
    assert SwarmClient(srv2.url, srv2.token).status().policy_version == 1
    assert eng2.logprobs(probe) == pytest.approx(after, abs=1e-5)
