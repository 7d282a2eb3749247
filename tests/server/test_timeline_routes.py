"""Timeline through the real HTTP server: agent tags, token continuity, drift, merged samples."""

from __future__ import annotations

import json

import httpx

from swarm.client import SwarmClient
from swarm.engine.fake import FakeEngine


def _char_ids(tok, text: str) -> list[int]:
    """The reply spelled one character per token (BPE would merge it): forces drift."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)] + [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]


def _play(srv, agents: list[str], turns: int) -> dict:
    client = SwarmClient(srv.url, srv.token)
    with client.episode(task_id="t0") as ep:
        histories = {a: [{"role": "user", "content": f"hello {a}"}] for a in agents}
        for t in range(turns):
            for a in agents:
                r = httpx.post(
                    f"{ep.base_url}/chat/completions",
                    headers={"Authorization": f"Bearer {ep.api_key}", "X-Roost-Agent": a},
                    json={"model": ep.model, "messages": histories[a], "max_tokens": 32},
                    timeout=30,
                )
                assert r.status_code == 200, r.text
                histories[a] += [
                    {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                    {"role": "user", "content": f"turn {t}"},
                ]
        ep.finish(1.0)
    lines = (srv.swarm.out_dir / "rollouts.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def _segments(record: dict):
    from swarm.timeline import Call, merge

    return merge([Call(c["agent"], c["prompt_ids"], c["completion_ids"], c["logprobs"]) for c in record["calls"]])


def test_agents_merge_separately_with_exact_continuity(make_server, model_dir):
    engine = FakeEngine(model_dir, script=lambda ids: _char_ids(engine.tokenizer, "the answer is"))
    srv = make_server(engine=engine, group_size=1, batch_groups=1)
    record = _play(srv, ["planner", "coder"], turns=3)
    assert [c["agent"] for c in record["calls"]] == ["planner", "coder"] * 3
    segs = _segments(record)
    assert sorted(s.agent for s in segs) == ["coder", "planner"]  # one sample per agent
    for s in segs:
        assert sum(s.loss_mask) == 3 * len(_char_ids(engine.tokenizer, "the answer is"))
    # re-rendering would have merged the characters: drift was seen and counted on every later turn
    assert srv.swarm.counters["prompt_drift"] == 4 and srv.swarm.counters["prompt_continued"] == 4


def test_retokenize_mode_drifts_and_splits_samples(make_server, model_dir):
    engine = FakeEngine(model_dir, script=lambda ids: _char_ids(engine.tokenizer, "the answer is"))
    srv = make_server(engine=engine, group_size=1, batch_groups=1, continuity="retokenize")
    record = _play(srv, ["main"], turns=3)
    assert len(_segments(record)) == 3  # no token prefix survives re-tokenization
    assert srv.swarm.counters["prompt_drift"] == 2
