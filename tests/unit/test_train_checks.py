"""What `swarm train` refuses before it starts anything, and what a start that fails leaves of an earlier run.

A `--resume` the server would refuse (a LoRA rank its checkpoint cannot take), a dataset whose tasks have no
`task_id`, a `swarm serve` folder as `--out`, a config file whose `server:` is no mapping: each was found only
once processes ran (or not at all), and left a run folder rewritten or a run waiting a minute to fail.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer

from swarm.config.options import build_config
from swarm.config.run import SHARED_BASE_RANK, RunConfig
from swarm.kept_files import KeptFiles
from swarm.resume_checks import resume_problems
from swarm.run_checks import dataset_problem, out_problems
from swarm.train import KEPT, follow

SHAPE = {"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2}


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    return path


def _refusal(tmp_path: Path, text: str, flags: dict) -> str:
    with pytest.raises(typer.BadParameter) as exc:
        build_config(RunConfig, flags, _file(tmp_path, text), defaults=RunConfig())
    return str(exc.value)


@pytest.mark.parametrize("value", ["5", "hello"])
@pytest.mark.parametrize("flags", [{}, {"server": {"group_size": 2}}])
def test_a_server_that_is_no_mapping_is_refused_whatever_flags_are_given(tmp_path, value, flags) -> None:
    assert _refusal(tmp_path, f"server: {value}\n", flags).startswith("server: Input should be a valid dictionary")


def test_a_bad_value_is_named_where_it_was_given(tmp_path) -> None:
    """The file's value by its place in the file; a flag's by the flag (the file's then never counted)."""
    assert _refusal(tmp_path, "server:\n  train:\n    lr: -1\n", {}).startswith("server.train.lr: ")
    given = _refusal(tmp_path, "server:\n  train:\n    lr: 0.1\n", {"server": {"train": {"lr": -1}}})
    assert given.startswith("--lr: ")
    assert _refusal(tmp_path, "steps: 0\n", {"server": {"group_size": 2}}).startswith("steps: ")
    fixed = build_config(RunConfig, {"server": {"train": {"lr": 0.1}}}, _file(tmp_path, "server: {train: {lr: -1}}"))
    assert fixed.server.train.lr == 0.1  # a flag still replaces a bad value of the file


def _tasks(*tasks: object):
    return lambda seed, size: list(tasks)


def test_a_dataset_is_checked_by_its_first_tasks() -> None:
    ok = dataset_problem(_tasks({"task_id": "t0"}, {"task_id": "t1"}), "m:f", 0, 100_000)
    assert ok is None
    assert dataset_problem(_tasks({"task_id": "a"}, {"q": 1}), "m:f", 0, 10) == (
        "--dataset: task 1 of m:f has no 'task_id' (every task is a dict with a task_id)"
    )
    assert "task 0 of m:f is a str" in dataset_problem(_tasks("t"), "m:f", 0, 10)
    assert dataset_problem(_tasks(), "m:f", 3, 10) == "--dataset: m:f(3, 10) returned no task"

    def broken(seed: int, size: int) -> list[dict]:
        raise ValueError("no data\nmore")

    assert dataset_problem(broken, "m:f", 0, 100_000) == "--dataset: m:f(0, 16) raised ValueError: no data"


def test_out_under_a_file_or_in_a_serve_folder_is_refused(tmp_path) -> None:
    (tmp_path / "afile").write_text("x")
    assert out_problems(tmp_path / "afile" / "sub", False) == [
        f"--out: cannot create {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is a file, not a folder"
    ]
    served = tmp_path / "served"
    (served / "checkpoints").mkdir(parents=True)
    (served / "server.json").write_text("{}")
    (served / "buffer.sqlite").write_text("")
    for resume in (False, True):
        [line] = out_problems(served, resume)
        assert "out folder of a `swarm serve` (server.json, buffer.sqlite, checkpoints)" in line
        assert "never mixed with another run" in line


def _checkpoint(folder: Path, **files: dict) -> None:
    step = folder / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step / "server_state.json").write_text(json.dumps({"step": 2, "policy_version": 2}))
    for name, content in files.items():
        (step / f"{name}.json").write_text(json.dumps(content))


def _spec(tmp_path: Path, **server: object) -> RunConfig:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(SHAPE))
    return RunConfig(out=tmp_path / "run", server={"model_dir": str(model), **server})


def test_resuming_every_weight_with_a_lora_rank_is_refused(tmp_path) -> None:
    spec = _spec(tmp_path, lora={"rank": 4})
    _checkpoint(spec.out / "server", config=SHAPE)
    [line] = resume_problems(spec, spec.out)
    assert line.startswith("--lora-rank: the run in ") and "trains every weight" in line
    assert "resume it without --lora-rank (or with --lora-rank 0)" in line
    assert resume_problems(_spec(tmp_path), spec.out) == []
    other = _spec(tmp_path)
    (Path(other.server.model_dir) / "config.json").write_text(json.dumps({**SHAPE, "hidden_size": 128}))
    [line] = resume_problems(other, spec.out)
    assert line.startswith("--model: ") and "hidden_size 64, the model's 128" in line


def test_resuming_an_adapter_needs_its_rank_and_alpha(tmp_path) -> None:
    spec = _spec(tmp_path)
    _checkpoint(spec.out / "server", adapter_config={"r": 8, "lora_alpha": 16})
    [line] = resume_problems(spec, spec.out)
    assert "trains a LoRA adapter of rank 8, alpha 16" in line and "--lora-rank 8 --lora-alpha 16" in line
    [line] = resume_problems(_spec(tmp_path, lora={"rank": 4}), spec.out)
    assert ", not rank 4, alpha 16" in line
    assert resume_problems(_spec(tmp_path, lora={"rank": 8}), spec.out) == []
    assert resume_problems(_spec(tmp_path, engine="fake", lora={"rank": 4}), spec.out) == []  # loads no weights


def test_a_shared_base_run_is_checked_per_role(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    spec = RunConfig(out=tmp_path / "run", task="duet", shared_base=True, server={"model_dir": str(model)})
    assert spec.trained_lora.rank == SHARED_BASE_RANK
    role = spec.roles[0]
    _checkpoint(spec.out / "server" / "policies" / role, adapter_config={"r": 4, "lora_alpha": 16})
    [line] = resume_problems(spec, spec.out)
    assert line.startswith(f"--lora-rank: policy {role}: ") and "rank 4" in line


def test_kept_files_are_put_back_as_they_were(tmp_path) -> None:
    (tmp_path / "run.yaml").write_text("steps: 3\n")
    (tmp_path / "summary.json").write_text('{"status": "finished"}')
    kept = KeptFiles.take(tmp_path, KEPT)
    (tmp_path / "run.yaml").write_text("steps: 5\n")
    (tmp_path / "summary.json").write_text('{"status": "failed"}')
    (tmp_path / "server.yaml").write_text("new\n")
    kept.restore()
    assert (tmp_path / "run.yaml").read_text() == "steps: 3\n"
    assert json.loads((tmp_path / "summary.json").read_text()) == {"status": "finished"}
    assert kept.status == "finished" and (tmp_path / "server.yaml").read_text() == "new\n"  # it was not there
    assert KeptFiles.take(tmp_path / "nothing", KEPT).summary is None


def test_the_timeout_says_one_step(tmp_path) -> None:
    running = SimpleNamespace(poll=lambda: None)
    spec = RunConfig(out=tmp_path, steps=1, timeout_s=1)
    alerts = SimpleNamespace(say=lambda console: None)
    with pytest.raises(TimeoutError, match=r"did not reach 1 step in 1s"):
        follow(spec, "", "", running, {"": tmp_path / "m.jsonl"}, time.monotonic() - 5, {tmp_path: running}, alerts)


@pytest.mark.parametrize("where", ["server/policies/{role}", "servers/{role}"])  # --shared-base, --team
def test_an_interrupted_run_of_several_policies_keeps_its_steps(tmp_path, where) -> None:
    """Read from server/metrics.jsonl alone, such a run interrupted after its steps "ended before its first
    step", and the same command again replaced it: its steps and checkpoints deleted."""
    from swarm.run_checks import ended_before_training, steps_done

    (tmp_path / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    assert ended_before_training(tmp_path) and steps_done(tmp_path) == 0
    for role, rows in (("planner", 3), ("executor", 2)):
        folder = tmp_path / where.format(role=role)
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1}) + "\n" for i in range(rows)))
    assert not ended_before_training(tmp_path) and steps_done(tmp_path) == 2  # the slowest role's


def test_a_failed_or_interrupted_shared_base_run_is_summarised_per_role(tmp_path) -> None:
    """Its summary said 0 steps, `metrics: server/metrics.jsonl` (a file it has none of), no `policies`."""
    from swarm.train import trained_summary

    spec = RunConfig(task="duet", shared_base=True, out=tmp_path, steps=10)
    for role in spec.roles:
        folder = tmp_path / "server" / "policies" / role
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": i + 1, "reward_mean": 0.5}) + "\n" for i in range(3))
        )
    summary = trained_summary(spec, tmp_path, 1.0)
    assert summary["steps_done"] == 3 and set(summary["policies"]) == set(spec.roles), summary
    assert all(str(p).startswith("server/policies/") for p in summary["metrics"].values())


@pytest.mark.parametrize("several", [{"shared_base": True}, {"team": "planner=embedded,executor=embedded"}])
def test_a_teacher_for_several_policies_is_refused_before_anything_starts(tmp_path, several) -> None:
    """The server refused it after the folder and the server were made: exit 1, a run `failed`."""
    with pytest.raises(ValueError, match="--teacher: a run of several policies .* cannot distill yet"):
        RunConfig(
            task="duet",
            out=tmp_path / "run",
            server={"teacher": str(tmp_path), "train": {"distill_coef": 1.0}},
            **several,
        )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "task, says",
    [
        ("arith=abc+guess", "share of 'arith' is not a number: 'abc'"),  # was "give a share for every task"
        ("arith==0.5+guess", "share of 'arith' is not a number: '=0.5'"),
        ("arith=1+guess", "give a share for every task of the mix or for none"),
        ("arith=0+guess=1", "share of 'arith' must be a positive number"),
    ],
)
def test_a_mix_says_what_is_wrong_with_it(task, says) -> None:
    from swarm.config.run import parse_mix

    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        parse_mix(task)
    assert parse_mix("arith=3+guess=1") == {"arith": 0.75, "guess": 0.25}  # shares are relative


def test_a_resume_that_names_another_task_is_refused(tmp_path) -> None:
    """A mix resumed as `--task arith` went on as arith alone, its summary saying arith of every step."""
    from swarm.run_checks import task_change

    assert task_change("arith=0.75+guess=0.25", None, tmp_path) == []
    assert task_change("arith=0.75+guess=0.25", "arith=3+guess=1", tmp_path) == []  # the same mix
    (line,) = task_change("arith=0.75+guess=0.25", "arith", tmp_path)
    assert line.startswith(f"--task: the run in {tmp_path} trains arith=0.75+guess=0.25; resume it with that task")


def test_a_fresh_repeat_of_a_runs_own_file_never_clears_that_run(tmp_path) -> None:
    """`swarm train --config OUT/run.yaml --fresh` deleted OUT, the run it repeats, logs included."""
    from swarm.run_checks import choose_out

    out = tmp_path / "d1"
    (out / "server").mkdir(parents=True)
    (out / "run.yaml").write_text("task: arith\n")
    (out / "summary.json").write_text(json.dumps({"status": "finished"}))
    chosen, note, problems = choose_out(out, out / "run.yaml", False, False, True)
    assert chosen == tmp_path / "d1-2" and problems == [] and "--fresh clears only a folder named with --out" in note
    assert choose_out(out, out / "run.yaml", True, False, True)[0] == out  # named with --out: --fresh replaces it
