"""run_fleet against a real server: groups fill, failures are counted, admission never deadlocks."""

from __future__ import annotations

import threading
import time

import pytest

from swarm.client import FleetStats, SwarmClient, run_fleet
from swarm.client._fleet import FleetCrashed
from swarm.engine.fake import FakeEngine

MESSAGES = [{"role": "user", "content": "hi"}]


def chat_workflow(task: dict, episode) -> float:
    r = episode.openai.chat.completions.create(model=episode.model, messages=MESSAGES, max_tokens=4)
    return 1.0 if len(r.choices[0].message.content or "") % 2 else 0.0


def _dataset(k: int) -> list[dict]:
    return [{"task_id": f"t{i}"} for i in range(k)]


def test_fleet_runs_epochs_and_trains(make_server) -> None:
    srv = make_server(group_size=4, batch_groups=2)
    seen: list[int] = []
    stats = run_fleet(
        SwarmClient(srv.url, srv.token),
        chat_workflow,
        _dataset(4),
        n=4,
        concurrency=3,
        epochs=1,
        progress=lambda s: seen.append(s.finished),
    )
    assert stats.finished == 16 and stats.failed == 0 and stats.stopped_by == "epochs"
    assert seen[-1] == 16 and len(stats.rewards) == 16
    deadline = time.monotonic() + 10
    while srv.swarm.trainer.step < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert srv.engine.policy_version == 2
    assert all(len({s.group_id for s in b.samples}) == 2 for b in srv.engine.batches)


def test_small_dataset_many_epochs_no_deadlock(make_server) -> None:
    """One task, B=2: the same task fills both groups of a window (concurrency > B*n too)."""
    srv = make_server(group_size=2, batch_groups=2)
    stats = run_fleet(SwarmClient(srv.url, srv.token), chat_workflow, _dataset(1), n=2, concurrency=8, epochs=6)
    assert stats.finished == 12
    deadline = time.monotonic() + 10
    while srv.swarm.trainer.step < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_workflow_errors_are_counted_and_groups_still_complete(make_server) -> None:
    srv = make_server(group_size=2, batch_groups=1)
    calls = {"n": 0}
    lock = threading.Lock()

    def flaky(task: dict, episode) -> float | None:
        chat_workflow(task, episode)
        with lock:
            calls["n"] += 1
            k = calls["n"]
        if task["task_id"] == "t1":
            raise RuntimeError("always broken")
        if k % 3 == 0:
            raise ValueError("sometimes broken")
        if k % 5 == 0:
            episode.finish(0.25)  # finished by the workflow itself
            return None
        return 1.0

    stats = run_fleet(SwarmClient(srv.url, srv.token), flaky, _dataset(3), n=2, concurrency=2, epochs=1, max_attempts=2)
    assert stats.given_up == 2  # both t1 jobs, after 2 attempts each
    assert stats.finished == 4 and stats.failed >= 4 and stats.errors
    # the first failure of each kind (type and raising line), once, with its traceback: said as it happens
    kinds = [text.splitlines()[-1] for text in stats.first_of_kind]
    assert "RuntimeError: always broken" in kinds and len(set(kinds)) == len(kinds), stats.first_of_kind
    assert set(kinds) <= {"RuntimeError: always broken", "ValueError: sometimes broken"}
    assert all(text.startswith("workflow failed (t") for text in stats.first_of_kind)
    assert all(text.splitlines()[0].endswith(text.splitlines()[-1]) for text in stats.first_of_kind)
    deadline = time.monotonic() + 10
    while srv.swarm.trainer.step < 2:  # t0, then t2 (t1's group completed empty and was skipped)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert all('test_fleet.py", line' in text for text in stats.first_of_kind)  # where in the workflow


def test_a_fleet_whose_every_thread_dies_raises_instead_of_ending_as_done(server) -> None:
    """A task without its `task_id` ends every thread that takes one: the fleet used to return as if done
    with its dataset, and its process exit 0 (`swarm train` then waited a minute before it failed)."""
    client = SwarmClient(server.url, server.token)
    with pytest.raises(FleetCrashed, match=r"every fleet thread died \(3\), the first of KeyError: 'task_id'"):
        run_fleet(client, chat_workflow, [{"q": i} for i in range(4)], n=2, concurrency=3, epochs=1)


def test_a_workflow_failing_on_every_task_stops_the_fleet(make_server) -> None:
    """It went on until the run's timeout (an hour by default), aborting every episode. A streak is broken
    by a finished episode: failures between successes never stop it."""
    srv = make_server(group_size=2, batch_groups=1)

    def broken(task: dict, episode) -> float:
        raise RuntimeError("always broken")

    stats = run_fleet(SwarmClient(srv.url, srv.token), broken, _dataset(50), n=2, concurrency=2, failure_streak=6)
    assert stats.stopped_by == "failing" and stats.failing_streak >= 6 and stats.finished == 0, stats
    assert stats.failed < 12  # stopped at the streak, not after the dataset (300 attempts)
    calls = {"n": 0}
    lock = threading.Lock()

    def every_other(task: dict, episode) -> float:
        with lock:
            calls["n"] += 1
            k = calls["n"]
        if k % 2:
            raise ValueError("sometimes broken")
        chat_workflow(task, episode)
        return 1.0

    stats = run_fleet(
        SwarmClient(srv.url, srv.token), every_other, _dataset(4), n=2, concurrency=1, epochs=1, failure_streak=2
    )
    assert stats.stopped_by == "epochs" and stats.finished == 8, stats


def test_a_workflow_returning_none_unfinished_is_said_once(make_server) -> None:
    srv = make_server(group_size=2, batch_groups=1)

    def forgetful(task: dict, episode) -> None:
        chat_workflow(task, episode)  # no reward returned, the episode never finished

    stats = run_fleet(SwarmClient(srv.url, srv.token), forgetful, _dataset(2), n=2, concurrency=2, epochs=1)
    assert stats.aborted == 4 and stats.finished == 0
    assert len(stats.first_of_kind) == 1 and "returned None without finishing the episode" in stats.first_of_kind[0]


def test_an_episode_given_back_by_the_stop_is_not_blamed_on_its_workflow(make_server) -> None:
    """Ctrl-C gives the open episodes back while their workflows run; one whose model call had returned
    then returned its reward to an aborted episode, and the fleet said "workflow returned None without
    finishing the episode" about the built-in arith workflow."""
    srv = make_server(group_size=2, batch_groups=1)
    stop = threading.Event()
    client = SwarmClient(srv.url, srv.token)

    def played_then_stopped(task: dict, episode) -> float:
        chat_workflow(task, episode)
        stop.set()
        client.abort_open("client interrupted")  # as the fleet's Ctrl-C handler does (`_give_back`)
        assert episode.done and episode.result is None
        return 1.0

    stats = run_fleet(client, played_then_stopped, _dataset(2), n=2, concurrency=2, stop=stop)
    assert stats.stopped_by == "stop" and stats.first_of_kind == [] and stats.finished == 0, stats


def test_fleet_stops_when_server_stops(make_server) -> None:
    srv = make_server(group_size=2, batch_groups=1, max_steps=2, stop_grace_s=1.0)
    stats = run_fleet(
        SwarmClient(srv.url, srv.token, max_retries=2, backoff_s=0.05), chat_workflow, _dataset(5), n=2, concurrency=4
    )  # epochs=None: until told to stop
    assert stats.stopped_by in ("server", "unreachable") and stats.finished >= 4
    srv.thread.join(10)
    assert srv.swarm.trainer.step == 2


def test_stop_event_and_max_episodes(make_server) -> None:
    srv = make_server(group_size=2, batch_groups=1)
    stats = run_fleet(SwarmClient(srv.url, srv.token), chat_workflow, _dataset(5), n=2, concurrency=2, max_episodes=3)
    assert stats.finished == 3 and stats.stopped_by == "max_episodes"
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    # window is stuck (t1 has 1 of 2 finished) -> claims for other tasks wait on 429 until stopped
    stats = run_fleet(SwarmClient(srv.url, srv.token), chat_workflow, _dataset(5)[2:], n=2, concurrency=2, stop=stop)
    timer.cancel()
    assert stats.stopped_by == "stop"


def test_fake_engine_slow_generation_and_concurrency(make_server, model_dir) -> None:
    srv = make_server(engine=FakeEngine(model_dir, token_delay_s=0.01), group_size=4, batch_groups=2)
    t0 = time.monotonic()
    stats = run_fleet(SwarmClient(srv.url, srv.token), chat_workflow, _dataset(2), n=4, concurrency=8, epochs=1)
    assert stats.finished == 8 and time.monotonic() - t0 < 10
    assert isinstance(stats, FleetStats) and 0.0 <= stats.reward_mean <= 1.0


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_arguments(bad: int) -> None:
    with pytest.raises(ValueError):
        run_fleet(SwarmClient("http://127.0.0.1:9", "t"), chat_workflow, [], n=bad)


def test_wrong_token_halts_the_fleet(server) -> None:
    stats = run_fleet(SwarmClient(server.url, "wrong"), chat_workflow, _dataset(3), n=2, concurrency=2)
    assert stats.stopped_by == "unauthorized" and stats.finished == 0 and "401" in stats.errors[0]


def test_a_policy_that_is_gone_halts_the_fleet(server) -> None:
    """After `swarm ctl policy remove`, its fleet sent ~370 claims a second, each a 404, for good."""
    t0 = time.monotonic()
    client = SwarmClient(server.url, server.token, model="removed")
    stats = run_fleet(client, chat_workflow, _dataset(50), n=2, concurrency=4, epochs=None)
    assert stats.stopped_by == "refused" and stats.finished == 0 and time.monotonic() - t0 < 10
    assert "404" in stats.errors[0] and "model_not_found" in stats.errors[0], stats.errors
    assert len(stats.errors) <= 4  # one refusal per thread at most, not one per job of the dataset
