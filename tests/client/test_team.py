"""Team episodes across two real servers (one role, one model each): finish, abort, failures, duet."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from swarm.client import SwarmAPIError, SwarmClient, TeamClient, TeamError, TeamLost, run_fleet
from swarm.engine.fake import FakeEngine
from swarm.tasks import duet, get_task
from swarm.testing import RunningServer, wait_until

_WORDS = re.compile(r"(Add|Subtract|Sum|Take|What is) (\d+) (to|from|and|away from|plus|minus) (\d+)")
_QUESTION = re.compile(r"What is (\d+)([+-])(\d+)\?")


def _planner_script(text: str) -> str:
    verb, x, prep, y = _WORDS.findall(text)[-1]
    if verb in ("Subtract", "Take"):
        return f"What is {y}-{x}?"
    if verb == "Add":
        return f"What is {y}+{x}?"
    return f"What is {x}{'-' if prep == 'minus' else '+'}{y}?"


def _executor_script(text: str) -> str:
    found = _QUESTION.findall(text)
    if not found:
        return "?"
    a, op, b = found[-1]
    return str(int(a) + int(b) if op == "+" else int(a) - int(b))


def _scripted(model_dir: Path, reply: Callable[[str], str]) -> FakeEngine:
    eng = FakeEngine(model_dir)
    eng.script = lambda ids: reply(eng.tokenizer.decode(ids))
    return eng


@pytest.fixture
def make_pair(make_server, model_dir: Path, tmp_path: Path) -> Callable[..., tuple[RunningServer, RunningServer]]:
    def make(**config) -> tuple[RunningServer, RunningServer]:
        config = {"group_size": 2, "batch_groups": 8, **config}
        planner = make_server(engine=_scripted(model_dir, _planner_script), out_dir=tmp_path / "planner", **config)
        executor = make_server(engine=_scripted(model_dir, _executor_script), out_dir=tmp_path / "executor", **config)
        return planner, executor

    return make


@pytest.fixture
def pair(make_pair) -> tuple[RunningServer, RunningServer]:
    return make_pair()


def _team(pair: tuple[RunningServer, RunningServer]) -> TeamClient:
    p, e = pair
    return TeamClient(
        {
            "planner": SwarmClient(p.url, p.token, max_retries=1, backoff_s=0.05, timeout=5),
            "executor": SwarmClient(e.url, e.token, max_retries=1, backoff_s=0.05, timeout=5),
        }
    )


def _rollouts(srv: RunningServer) -> list[dict]:
    path = srv.swarm.out_dir / "rollouts.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _state(srv: RunningServer, episode_id: str) -> str:
    return srv.swarm.registry.get(episode_id).state


def test_team_episodes_train_each_server_on_its_own_role(make_pair) -> None:
    pair = make_pair(batch_groups=1)
    p, e = pair
    task = get_task("duet").dataset(0, 1)[0]
    team = _team(pair)
    ids: dict[str, list[str]] = {"planner": [], "executor": []}
    with team.episode(task["task_id"], "duet") as t:
        assert t.roles == ["planner", "executor"] and t["planner"].model and t["executor"].openai
        rewards = duet.workflow(task, t)
        assert rewards == {"planner": 1.0, "executor": 1.0}
        results = t.finish(rewards)
        assert set(results) == {"planner", "executor"}
        for role in ids:
            ids[role].append(t[role].id)
    with team.episode(task["task_id"], "duet") as t:
        duet.team_workflow(task, t)
        t.finish({"planner": 0.25, "executor": 0.75})
        for role in ids:
            ids[role].append(t[role].id)
    for srv, role in ((p, "planner"), (e, "executor")):
        wait_until(lambda srv=srv: srv.swarm.trainer.step == 1)
        eng: FakeEngine = srv.engine
        assert len(eng.batches) == 1
        assert {s.episode_id for s in eng.batches[0].samples} == set(ids[role])  # only its own role
        prompts = [eng.tokenizer.decode(r.prompt_ids) for r in eng.requests]
        assert len(prompts) == 2
        assert all(("Rewrite as a question" in x) == (role == "planner") for x in prompts)
        rows = _rollouts(srv)
        assert sorted(r["reward"] for r in rows) == ([0.25, 1.0] if role == "planner" else [0.75, 1.0])
        assert all(r["task_family"] == "duet" for r in rows)
    team_ids = {
        srv.swarm.registry.get(i).metadata["team"]["id"]
        for srv, role in ((p, "planner"), (e, "executor"))
        for i in ids[role][:1]
    }
    assert len(team_ids) == 1  # both servers saw the same team id for the first episode


def test_one_reward_for_all_roles_and_explicit_abort(pair) -> None:
    p, e = pair
    team = _team(pair)
    with team.episode("t1") as t:
        assert t.finish(0.5)["executor"].reward == 0.5
    assert _rollouts(p)[0]["reward"] == _rollouts(e)[0]["reward"] == 0.5
    with team.episode("t2") as t:
        t.abort("changed my mind")
        ep_ids = {role: t[role].id for role in t}
    assert _state(p, ep_ids["planner"]) == _state(e, ep_ids["executor"]) == "aborted"


def test_exception_or_no_finish_aborts_every_member(pair) -> None:
    p, e = pair
    team = _team(pair)
    with pytest.raises(RuntimeError, match="agent crashed"):
        with team.episode("t1") as t:
            ids = {role: t[role].id for role in t}
            raise RuntimeError("agent crashed")
    assert _state(p, ids["planner"]) == _state(e, ids["executor"]) == "aborted"
    with team.episode("t1") as t:
        ids = {role: t[role].id for role in t}
    assert _state(p, ids["planner"]) == _state(e, ids["executor"]) == "aborted"
    assert p.swarm.status().open_episodes == e.swarm.status().open_episodes == 0


def test_bad_reward_mapping_sends_nothing(pair) -> None:
    p, e = pair
    with pytest.raises(ValueError, match="missing"):
        with _team(pair).episode("t1") as t:
            ids = {role: t[role].id for role in t}
            t.finish({"planner": 1.0})
    assert _state(p, ids["planner"]) == _state(e, ids["executor"]) == "aborted"
    assert p.swarm.counters["finished"] == e.swarm.counters["finished"] == 0


def _abort_behind_its_back(srv: RunningServer, ep) -> None:
    r = httpx.post(
        f"{srv.url}/swarm/v1/episodes/{ep.id}/abort", json={}, headers={"Authorization": f"Bearer {ep.api_key}"}
    )
    assert r.status_code == 200


def test_failed_finish_on_one_server_aborts_the_others(pair) -> None:
    p, e = pair
    team = _team(pair)
    with pytest.raises(TeamError) as exc:
        with team.episode("t1") as t:
            _abort_behind_its_back(p, t["planner"])  # e.g. its lease expired
            ids = {role: t[role].id for role in t}
            t.finish(1.0)
    assert exc.value.finished == [] and exc.value.aborted == ["planner", "executor"]  # abort is idempotent
    assert isinstance(exc.value.errors["planner"], SwarmAPIError)
    assert _state(e, ids["executor"]) == "aborted" and e.swarm.counters["finished"] == 0
    with pytest.raises(TeamError) as exc:  # the second member fails: the first stays finished
        with team.episode("t2") as t:
            _abort_behind_its_back(e, t["executor"])
            ids = {role: t[role].id for role in t}
            t.finish(1.0)
    assert exc.value.finished == ["planner"] and exc.value.aborted == ["executor"]
    assert _state(p, ids["planner"]) == "finished"


def test_a_member_gone_before_the_finish_finishes_nothing(pair) -> None:
    """A member a fleet's Ctrl-C gave back (or whose lease lapsed): finishing the other would leave the team
    half trained and its replay a surplus copy on the finished member's server, a group nobody fills."""
    p, e = pair
    team = _team(pair)
    with pytest.raises(TeamLost, match="planner gone before the finish"):
        with team.episode("t1") as t:
            ids = {role: t[role].id for role in t}
            team.members["planner"].abort_open("client interrupted")  # the planner given back, the executor not yet
            assert t.lost and t.replayable
            t.finish(1.0)
    assert _state(p, ids["planner"]) == _state(e, ids["executor"]) == "aborted"
    assert p.swarm.counters["finished"] == e.swarm.counters["finished"] == 0


def test_a_member_finished_on_its_own_makes_a_gone_one_give_up_its_slot(pair) -> None:
    """The planner finished by hand, the executor then given back: the team cannot be played again (the
    planner's group would get a surplus copy), so the executor gives its slot up and it says so."""
    p, e = pair
    team = _team(pair)
    with pytest.raises(TeamError, match="executor gone before the finish; finished") as exc:
        with team.episode("t1") as t:
            t["planner"].finish(1.0)
            group = t["executor"].group_id
            team.members["executor"].abort_open("client interrupted")
            # its slot given up, not reopened: nobody will claim it (the team is not played again)
            assert e.swarm.batcher.groups[group].dropped == 1
            t.finish(1.0)
    assert not isinstance(exc.value, TeamLost) and exc.value.finished == ["planner"] and not t.replayable
    assert p.swarm.counters["finished"] == 1 and e.swarm.counters["finished"] == 0


def test_ctrl_c_during_a_hand_finish_lets_it_land_and_gives_the_teammate_slot_up(pair) -> None:
    """Ctrl-C's `abort_open` while the planner's own finish is in flight: the finish lands (the reward was
    sent), and the executor, given back, gives its slot up as it does once the planner has finished."""
    p, e = pair
    team = _team(pair)
    planner = team.members["planner"]
    in_flight, go_on = threading.Event(), threading.Event()
    request = planner.request

    def slow_finish(method: str, path: str, **kw):
        if path.endswith("/finish"):
            in_flight.set()
            go_on.wait(10)
        return request(method, path, **kw)

    planner.request = slow_finish  # type: ignore[method-assign]
    t = team.claim("t1")
    ids, group = {role: t[role].id for role in t}, t["executor"].group_id
    worker = threading.Thread(target=t["planner"].finish, args=(1.0,))
    worker.start()
    assert in_flight.wait(10)
    team.abort_open("client interrupted")  # both members' clients, while the planner's finish waits
    go_on.set()
    worker.join(10)
    t.close()
    assert _state(p, ids["planner"]) == "finished" and t["planner"].result is not None
    assert _state(e, ids["executor"]) == "aborted"
    assert e.swarm.batcher.groups[group].dropped == 1  # given up, not reopened: the team is not played again
    assert not t.replayable


def test_ctrl_c_gives_each_team_back_whole_or_lets_it_finish(make_pair) -> None:
    """`abort_open` racing `finish`, 30 times: every team ends finished on both servers or on neither."""
    p, e = pair = make_pair(group_size=1, batch_groups=64)  # one window: an aborted task's group waits for no claim
    team = _team(pair)
    for i in range(30):
        t = team.claim(f"t{i}")
        ids = {role: t[role].id for role in t}
        start = threading.Barrier(2)

        def finish(t=t, start=start) -> None:
            start.wait()
            try:
                t.finish(1.0)
            except TeamError:
                pass

        worker = threading.Thread(target=finish)
        worker.start()
        start.wait()
        time.sleep(0.001 * (i % 10))  # the interrupt lands before, during or after the planner's finish
        team.abort_open("client interrupted")
        worker.join()
        t.close()
        states = {_state(p, ids["planner"]), _state(e, ids["executor"])}
        assert states in ({"finished"}, {"aborted"}), (i, states)


def test_a_fleet_never_replays_a_team_finished_on_one_server(pair) -> None:
    """The executor's finish fails after the planner's went through: the job is done (its executor slot
    given up), not played again onto the planner's full group."""
    p, e = pair
    failed: list[str] = []
    once = threading.Lock()

    def workflow(task: dict, t) -> dict:
        if task["task_id"] == "t1" and once.acquire(blocking=False):  # one of t1's two copies
            _abort_behind_its_back(e, t["executor"])
            failed.append(t["executor"].id)
        return {"planner": 1.0, "executor": 1.0}

    stats = run_fleet(_team(pair), workflow, [{"task_id": f"t{i}"} for i in range(3)], n=2, concurrency=2, epochs=1)
    assert stats.finished == 5 and stats.aborted == 1 and stats.lost == 0, stats.errors
    assert p.swarm.counters["claims"] == 6 and p.swarm.counters["finished"] == 6  # no surplus copy of t1
    assert e.swarm.counters["claims"] == 6 and e.swarm.counters["finished"] == 5
    assert _state(e, failed[0]) == "aborted"


def test_a_fleet_never_replays_a_team_whose_workflow_failed_after_finishing_a_member_by_hand(pair) -> None:
    """The workflow finishes the planner itself, then raises: the team is not played again (the planner's
    group holds its finished half) and the executor gives its slot up, so its group does not wait for a
    claim that never comes."""
    p, e = pair
    groups: list[str] = []
    once = threading.Lock()

    def workflow(task: dict, t) -> dict:
        if task["task_id"] == "t1" and once.acquire(blocking=False):  # one of t1's two copies
            t["planner"].finish(1.0)
            groups.append(t["executor"].group_id)
            raise RuntimeError("the executor's tool broke")
        return {"planner": 1.0, "executor": 1.0}

    stats = run_fleet(_team(pair), workflow, [{"task_id": f"t{i}"} for i in range(3)], n=2, concurrency=2, epochs=1)
    assert stats.finished == 5 and stats.aborted == 1 and stats.lost == 0, stats.errors
    assert p.swarm.counters["claims"] == 6 and p.swarm.counters["finished"] == 6  # no surplus copy of t1
    assert e.swarm.counters["claims"] == 6 and e.swarm.counters["finished"] == 5
    assert e.swarm.batcher.groups[groups[0]].dropped == 1  # given up, not reopened


def test_refused_claim_aborts_the_members_already_claimed(pair) -> None:
    p, e = pair
    r = httpx.post(f"{e.url}/swarm/v1/admin/pause", headers={"Authorization": f"Bearer {e.admin_token}"})
    assert r.status_code == 200
    with pytest.raises(SwarmAPIError) as exc:
        _team(pair).claim("t1", wait=False)
    assert exc.value.status_code == 429 and exc.value.code == "paused"
    assert p.swarm.counters["claims"] == 1 and p.swarm.counters["aborted"] == 1
    assert p.swarm.status().open_episodes == 0


def test_duet_on_one_server_tags_agents_and_rewards_them(make_server, model_dir: Path) -> None:
    def both(text: str) -> str:
        return _planner_script(text) if "Rewrite as a question" in text else _executor_script(text)

    srv = make_server(engine=_scripted(model_dir, both))
    task = get_task("duet").dataset(1, 1)[0]
    client = SwarmClient(srv.url, srv.token)
    with client.episode(task["task_id"], "duet") as ep:
        assert duet.workflow(task, ep) is None and ep.done
    row = _rollouts(srv)[0]
    assert row["agent_rewards"] == {"planner": 1.0, "executor": 1.0}
    assert [c["agent"] for c in row["calls"]] == ["planner", "executor"]


def test_team_client_validates_members() -> None:
    with pytest.raises(ValueError):
        TeamClient({})
    with pytest.raises(TypeError):
        TeamClient({"planner": object()})  # type: ignore[dict-item]
