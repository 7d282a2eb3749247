"""RunConfig's own refusals of what a user may type (the rest are covered where the run uses them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.config.run import RunConfig


@pytest.mark.parametrize("given", ["http://127.0.0.1:8000", Path("http://127.0.0.1:8000"), "https://host/x"])
def test_attach_refuses_a_url_and_says_it_takes_the_servers_out_folder(given: object) -> None:
    with pytest.raises(ValueError, match="the out folder of a running `swarm serve`, not a URL"):
        RunConfig(attach=given)


def test_attach_takes_a_folder_named_like_a_host() -> None:
    assert RunConfig(attach="runs/http-server").attach == Path("runs/http-server")


def test_step_line_shows_no_negative_zero() -> None:
    """The KL estimate's noise around 0 (-1e-6) prints as 0.0000, a real negative as itself; a team role leads."""
    from swarm.train import step_line

    row = {"step": 3, "reward_mean": 0.5, "loss": -0.00001, "kl": -1e-6, "entropy": 1.25, "tokens_per_s": 900}
    line = step_line(None, row)
    assert line == "step 3: reward 0.500  loss +0.0000  kl 0.0000  entropy 1.250  900 tok/s"
    assert step_line("planner", {**row, "kl": -0.02}, entropy=False) == (
        "planner step 3: reward 0.500  loss +0.0000  kl -0.0200  900 tok/s"
    )
    # what the engine did not measure (the fake engine: no KL, entropy or throughput) is left out, not `nan`
    assert step_line(None, {"step": 1, "reward_mean": 0.0, "loss": 0.0, "kl": float("nan")}) == (
        "step 1: reward 0.000  loss +0.0000"
    )


def test_the_starting_line_names_the_wait_and_the_log() -> None:
    """A vLLM server's minute or two of start-up showed nothing: a terminal now has a spinner with this."""
    from swarm.train import starting_line

    assert starting_line("vllm", Path("r/logs/server.log")) == (
        "starting the server (vLLM takes a minute or two; its log: r/logs/server.log)…"
    )
    assert starting_line("torch", Path("r/logs"), team=True) == (
        "starting the servers (loading the model; their logs: r/logs)…"
    )


def test_the_printed_summary_line_rounds_rewards_and_keeps_the_rest() -> None:
    """`swarm train`'s stdout line (for scripts) printed a mean of 512 rewards as 0.197265625; summary.json
    keeps every digit."""
    from swarm.cli import _shown

    summary = {"reward_first_mean": 0.197265625, "reward_last_mean": None, "wall_s": 11.3, "steps_done": 3}
    assert _shown(summary, "reward_first_mean", "reward_last_mean", "steps_done") == {
        "reward_first_mean": 0.1973,
        "reward_last_mean": None,
        "steps_done": 3,
    }


def test_every_fleet_of_a_run_stops_at_its_failure_streak() -> None:
    """`--failure-streak` was a `swarm client` flag alone: README offered it to `swarm train`."""
    from swarm.train import fleet_configs

    spec = RunConfig(task="arith+guess", clients=2, failure_streak=5)
    fleets = fleet_configs(spec, "http://127.0.0.1:1")
    assert len(fleets) == 4 and {f.failure_streak for _, f in fleets} == {5}
    assert RunConfig().failure_streak == 200


def test_run_yaml_records_the_model_and_a_local_teacher_as_absolute_paths(tmp_path, monkeypatch) -> None:
    """`swarm train --config OUT/run.yaml` from another folder: `teacher: runs/train` named nothing there."""
    from swarm.config.server import ServerConfig
    from swarm.train import absolute_paths

    monkeypatch.chdir(tmp_path)
    server = ServerConfig(model_dir=Path("m"), teacher="runs/train", train={"distill_coef": 1.0})
    fixed = absolute_paths(server)
    assert fixed.model_dir == tmp_path / "m" and fixed.teacher == str(tmp_path / "runs" / "train")
    url = ServerConfig(model_dir=Path("m"), teacher="http://127.0.0.1:1/v1", train={"distill_coef": 1.0})
    assert absolute_paths(url).teacher == "http://127.0.0.1:1/v1"
