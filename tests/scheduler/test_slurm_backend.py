"""Slurm backend without a cluster: script rendering, state parsing, polling, fallbacks (FakeSlurm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler._slurm_parse import decode_exit, map_state, parse_sacct_json, parse_scontrol_line, parse_squeue_json
from scheduler.base import BackendError, BackendUnavailable, JobHandle
from scheduler.fake import FakeSlurm
from scheduler.slurm import SlurmBackend, format_time_limit, render_script
from scheduler.spec import JobSpec
from store.models import JobState


def _spec(tmp_path: Path, **kw: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "job",
        "command": ["python", "-c", "print('hi there')"],
        "log_dir": str(tmp_path / "logs"),
    }
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------- rendering


@pytest.mark.parametrize(
    "seconds,expected",
    [
        (1, "0-00:01:00"),
        (60, "0-00:01:00"),
        (61, "0-00:02:00"),
        (3600, "0-01:00:00"),
        (86400 + 90, "1-00:02:00"),
    ],
)
def test_time_limit_rounds_up_to_minutes(seconds: int, expected: str) -> None:
    assert format_time_limit(seconds) == expected


def test_script_has_every_resource_and_time_always(tmp_path: Path) -> None:
    script = render_script(
        _spec(
            tmp_path,
            time_limit_s=90,
            cpus=4,
            mem_mb=2048,
            gpus=2,
            nodes=3,
            partition="gpu",
            cwd="/srv/work",
            env={"A": "x y", "B": "it's"},
            setup=["module load cuda"],
        )
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for opt in (
        "--job-name=job",
        "--time=0-00:02:00",
        "--nodes=3",
        "--cpus-per-task=4",
        "--mem=2048M",
        "--gpus-per-node=2",
        "--partition=gpu",
        "--chdir=/srv/work",
        "--export=ALL",
        f"--output={tmp_path}/logs/job-%j.out",
        f"--error={tmp_path}/logs/job-%j.err",
    ):
        assert f"#SBATCH {opt}" in lines, opt
    assert "export A='x y'" in lines and "export B='it'\"'\"'s'" in lines
    assert lines.index("module load cuda") < lines.index("python -c 'print('\"'\"'hi there'\"'\"')'")
    assert f'echo "$rc" > "{tmp_path}/logs/job-${{SLURM_JOB_ID}}.exit"' in lines


def test_script_defaults_omit_optional_resources(tmp_path: Path) -> None:
    script = render_script(_spec(tmp_path))
    assert "#SBATCH --time=0-01:00:00" in script  # the default limit is always there
    for absent in ("--mem=", "--gpus", "--partition", "--chdir"):
        assert absent not in script


def test_script_refuses_whitespace_in_log_paths(tmp_path: Path) -> None:
    with pytest.raises(BackendError):
        render_script(_spec(tmp_path, log_dir=str(tmp_path / "with space")))


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "raw,state,reason",
    [
        ("PENDING", JobState.PENDING, None),
        ("RUNNING", JobState.RUNNING, None),
        ("COMPLETING", JobState.RUNNING, "completing"),
        ("COMPLETED", JobState.COMPLETED, None),
        ("FAILED", JobState.FAILED, None),
        ("CANCELLED by 0", JobState.CANCELLED, None),
        ("TIMEOUT", JobState.TIMEOUT, None),
        ("OUT_OF_MEMORY", JobState.FAILED, "OUT_OF_MEMORY"),
        ("NODE_FAIL", JobState.FAILED, "NODE_FAIL"),
        (["FAILED"], JobState.FAILED, None),
        (["PENDING", "REQUEUED"], JobState.PENDING, None),
        ("CD", JobState.COMPLETED, None),
        ("PREEMPTED", JobState.FAILED, "PREEMPTED"),
        ("DEADLINE", JobState.TIMEOUT, "DEADLINE"),
    ],
)
def test_state_mapping(raw: object, state: JobState, reason: str | None) -> None:
    assert map_state(raw) == (state, reason)  # type: ignore[arg-type]


def test_unknown_state_is_unknown_not_a_crash() -> None:
    assert map_state("WEIRD_NEW_STATE")[0] == JobState.UNKNOWN
    assert map_state(None)[0] == JobState.UNKNOWN


@pytest.mark.parametrize(
    "value,expected",
    [
        (0, (0, None)),
        (768, (3, None)),
        (9, (None, 9)),
        ("2:0", (2, None)),
        ("0:15", (0, 15)),
        (
            {
                "status": ["EXITED"],
                "return_code": {"set": True, "number": 4},
                "signal": {"id": {"set": False, "number": 0}},
            },
            (4, None),
        ),
        ({"return_code": 0, "signal": {"signal_id": 9}}, (0, 9)),
        (None, (None, None)),
    ],
)
def test_decode_exit(value: object, expected: tuple[int | None, int | None]) -> None:
    assert decode_exit(value) == expected


@pytest.mark.parametrize("version", ["0.0.38", "0.0.40"])
def test_squeue_json_both_shapes(version: str, tmp_path: Path) -> None:
    fake = FakeSlurm(json_version=version)
    backend = SlurmBackend(runner=fake)
    hs = [backend.submit(_spec(tmp_path, name=f"j{i}")) for i in range(4)]
    fake.set_state(hs[1].external_id, "RUNNING")
    fake.set_state(hs[2].external_id, "FAILED", exit_code=3)
    fake.set_state(hs[3].external_id, "FAILED", signal=9)
    got = parse_squeue_json(fake(["squeue", "--json"]).stdout)
    assert got[hs[0].external_id].state == JobState.PENDING
    assert got[hs[1].external_id].state == JobState.RUNNING and got[hs[1].external_id].started_at
    assert (got[hs[2].external_id].state, got[hs[2].external_id].exit_code) == (JobState.FAILED, 3)
    assert got[hs[3].external_id].exit_code == 128 + 9
    assert "signal 9" in (got[hs[3].external_id].reason or "")


def test_scontrol_line_real_sample() -> None:
    line = (
        "JobId=2 JobName=wrap UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) "
        "ExitCode=3:0 RunTime=00:00:01 TimeLimit=UNLIMITED StartTime=2026-11-22T00:59:10 "
        "EndTime=2026-11-22T00:59:11 NtasksPerN:B:S:C=0:0:*:* Command=(null) WorkDir=/tmp"
    )
    st = parse_scontrol_line(line)
    assert (st.state, st.exit_code) == (JobState.FAILED, 3)
    assert st.started_at is not None and st.finished_at is not None


def test_sacct_json() -> None:
    text = json.dumps(
        {
            "jobs": [
                {
                    "job_id": 5,
                    "state": {"current": "OUT_OF_MEMORY", "reason": "None"},
                    "exit_code": {"status": "ERROR", "return_code": 0, "signal": {"signal_id": 9}},
                    "time": {"start": 100, "end": 200},
                }
            ]
        }
    )
    st = parse_sacct_json(text)["5"]
    assert (st.state, st.reason, st.exit_code) == (JobState.FAILED, "OUT_OF_MEMORY", 137)


# ---------------------------------------------------------------- backend over FakeSlurm


def test_submit_parses_parsable_output_and_paths(tmp_path: Path) -> None:
    fake = FakeSlurm()
    h = SlurmBackend(runner=fake).submit(_spec(tmp_path, slurm_args=["--hold"]))
    assert h.external_id == "1000"
    assert h.stdout_path == f"{tmp_path}/logs/job-1000.out"
    assert fake.calls[0][:3] == ["sbatch", "--parsable", "--hold"]
    assert fake.jobs[1000].sbatch_option("time") == "0-01:00:00"
    assert fake.jobs[1000].reason == "JobHeldUser"


def test_submit_with_cluster_suffix(tmp_path: Path) -> None:
    def runner(argv: list[str]) -> object:
        from scheduler.slurm import CommandResult

        return CommandResult(0, "42;cluster-a\n", "")

    assert SlurmBackend(runner=runner).submit(_spec(tmp_path)).external_id == "42"  # type: ignore[arg-type]


def test_sbatch_refusal_is_a_backend_error(tmp_path: Path) -> None:
    def runner(argv: list[str]) -> object:
        from scheduler.slurm import CommandResult

        return CommandResult(1, "", "sbatch: error: invalid partition specified: nope")

    with pytest.raises(BackendError, match="invalid partition"):
        SlurmBackend(runner=runner).submit(_spec(tmp_path))  # type: ignore[arg-type]


def test_one_squeue_for_many_jobs_and_backoff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm()
    backend = SlurmBackend(runner=fake, min_poll_s=2, max_poll_s=60)
    hs = [backend.submit(_spec(tmp_path, name=f"j{i}")) for i in range(5)]
    clock = [1000.0]
    monkeypatch.setattr("scheduler.slurm.time.monotonic", lambda: clock[0])
    backend.status(hs)
    assert fake.count("squeue") == 1  # all five in one query
    backend.status(hs)
    assert fake.count("squeue") == 1  # within the interval: cached
    intervals = []
    for _ in range(7):  # nothing changes: 2, 4, 8, ... capped at 60
        clock[0] += 1000
        backend.status(hs)
        intervals.append(backend._interval)
    assert intervals == [4, 8, 16, 32, 60, 60, 60]
    fake.set_state(hs[0].external_id, "RUNNING")
    clock[0] += 30
    assert backend.status(hs)[hs[0].external_id].state == JobState.PENDING  # stale, by design
    clock[0] += 31
    assert backend.status(hs)[hs[0].external_id].state == JobState.RUNNING
    assert backend._interval == 2  # a change resets the backoff
    backend.submit(_spec(tmp_path, name="new"))
    n = fake.count("squeue")
    backend.status(hs)
    assert fake.count("squeue") == n + 1  # a submit resets it too


def test_fallbacks_scontrol_sacct_exit_file_unknown(tmp_path: Path) -> None:
    fake = FakeSlurm()
    backend = SlurmBackend(runner=fake, min_poll_s=0)
    a, b, c, d = (backend.submit(_spec(tmp_path, name=n)) for n in "abcd")
    for h, code in ((a, 0), (b, 2), (c, 0), (d, 0)):
        fake.set_state(h.external_id, "COMPLETED" if code == 0 else "FAILED", exit_code=code)
    fake.forget(a.external_id)  # squeue forgot, scontrol still knows
    fake.forget(b.external_id, scontrol=True)  # only the exit file is left
    Path(b.stdout_path).with_suffix(".exit").write_text("2\n")
    fake.forget(c.external_id, scontrol=True)  # nothing left at all
    got = backend.status([a, b, c, d], force=True)
    assert got[a.external_id].state == JobState.COMPLETED
    assert (got[b.external_id].state, got[b.external_id].exit_code) == (JobState.FAILED, 2)
    assert got[c.external_id].state == JobState.UNKNOWN
    assert fake.count("sacct") == 0  # no accounting configured: never asked

    fake.accounting = True
    backend2 = SlurmBackend(runner=fake, min_poll_s=0)
    assert backend2.status([c], force=True)[c.external_id].state == JobState.COMPLETED
    assert fake.count("sacct") == 1


def test_controller_down(tmp_path: Path) -> None:
    fake = FakeSlurm()
    backend = SlurmBackend(runner=fake, min_poll_s=0)
    h = backend.submit(_spec(tmp_path))
    backend.status([h])
    fake.down = True
    assert backend.status([h], force=True)[h.external_id].state == JobState.PENDING  # last known
    h2 = _with_id(h, "999")
    with pytest.raises(BackendUnavailable):
        backend.status([h2], force=True)


def _with_id(h: JobHandle, external_id: str) -> JobHandle:
    return h.model_copy(update={"external_id": external_id})


def test_cancel_and_force(tmp_path: Path) -> None:
    fake = FakeSlurm()
    backend = SlurmBackend(runner=fake, min_poll_s=0)
    h = backend.submit(_spec(tmp_path))
    fake.set_state(h.external_id, "RUNNING")
    backend.cancel(h)
    assert fake.calls[-1] == ["scancel", h.external_id]
    assert backend.status([h])[h.external_id].state == JobState.CANCELLED
    backend.cancel(h, force=True)  # already over: harmless
    assert ["scancel", "--full", "--signal=KILL", h.external_id] in fake.calls
    backend.cancel(_with_id(h, "424242"))  # unknown id: not an error


def test_missing_binaries_mean_unavailable(tmp_path: Path) -> None:
    from scheduler.slurm import CommandResult

    backend = SlurmBackend(runner=lambda argv: CommandResult(127, "", "sbatch: not found"))
    with pytest.raises(BackendUnavailable):
        backend.submit(_spec(tmp_path))
