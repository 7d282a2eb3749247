"""End to end under the REAL Slurm: the researcher's trial shape (one `swarm train` job) trains a few steps.

`swarm train` starts its own server and client on loopback inside the allocation,
stops both after `--steps`, and writes `summary.json`. Submitted through
`submit_trial`, as the researcher does, twice: the second call must return the same
job. Uses an untrained tiny model (seconds to build) and tiny groups so it stays short.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from scheduler.manager import JobManager
from scheduler.records import StoreSink
from scheduler.slurm import SlurmBackend
from scheduler.spec import JobSpec
from scheduler.trial import TrialShape, poll_trials, submit_trial
from store.models import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_swarm_train_trial_under_slurm(slurm: None, db_url: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("swarm.model.build") is None:
        pytest.skip("swarm.model.build is not available")
    from swarm.model.build import build_untrained

    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "out"
    train = [
        sys.executable,
        "-m",
        "swarm",
        "train",
        "--task",
        "arith",
        "--steps",
        "2",
        "--model",
        str(model),
        "--out",
        str(out),
        "--group-size",
        "2",
        "--batch-groups",
        "1",
        "--concurrency",
        "4",
        "--dataset-size",
        "32",
        "--max-tokens",
        "16",
        "--no-mlflow",
    ]
    shape = TrialShape(
        key="e2e",
        jobs=[
            JobSpec(
                name="e2e-train",
                command=train,
                env={"HF_HUB_OFFLINE": "1"},
                time_limit_s=600,
                mem_mb=4000,
                log_dir=str(tmp_path / "logs"),
            )
        ],
    )
    mgr = JobManager(StoreSink(db_url), {"slurm": SlurmBackend(min_poll_s=0.5, max_poll_s=2)})
    launch = submit_trial(mgr, shape, backend="slurm")
    (job,) = launch.records
    try:
        assert submit_trial(mgr, shape, backend="slurm").how == "existing"
        (done,) = mgr.wait([job.id], timeout_s=300, poll_s=1.0)
    except BaseException:
        mgr.cancel_group("e2e")
        raise
    finally:
        stdout, stderr = mgr.logs(job.id, tail_bytes=3000), mgr.logs(job.id, "stderr", tail_bytes=3000)
        print(f"--- stdout\n{stdout}\n--- stderr\n{stderr}")

    assert launch.how == "submitted" and job.external_id and job.external_id.isdigit()  # really a Slurm job
    assert (done.state, done.exit_code) == (JobState.COMPLETED, 0), done
    assert poll_trials(mgr, ["e2e"])["e2e"].state == JobState.COMPLETED
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_done"] >= 2, summary
