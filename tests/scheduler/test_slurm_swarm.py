"""End to end under the REAL Slurm: a swarm server job and a client fleet job train a few steps.

The server job registers its URL in the store; the fleet job finds it there, plays
`arith` against it; the server stops after `--max-steps`, and the fleet follows.
Uses an untrained tiny model (seconds to build) and tiny groups so it stays short.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from sqlmodel import select

from scheduler.jobs import make_trial, submit_trial
from scheduler.manager import JobManager
from scheduler.records import StoreSink
from scheduler.slurm import SlurmBackend
from store.db import get_engine, session_scope
from store.models import JobState, ServerStatus, SwarmServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _swarm_cli_missing() -> str | None:
    for mod in ("swarm.server.cli", "swarm.client.cli", "swarm.model.build"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} does not exist yet"
    return None


def test_swarm_trial_trains_under_slurm(slurm: None, db_url: str, tmp_path: Path) -> None:
    missing = _swarm_cli_missing()
    if missing:
        pytest.skip(f"`swarm serve`/`swarm client` not available: {missing}")
    from swarm.model.build import build_untrained

    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "out"
    trial = make_trial(
        "e2e", model=model, out_dir=out, task="arith", clients=1, group_size=2, batch_groups=1,
        concurrency=4, dataset_size=32, db_url=db_url, time_limit_s=600, server_mem_mb=4000,
        server_args=["--max-steps", "2", "--max-tokens", "16", "--checkpoint-every", "0"],
        log_dir=str(tmp_path / "logs"))
    mgr = JobManager(StoreSink(db_url), {"slurm": SlurmBackend(min_poll_s=0.5, max_poll_s=2)})
    recs = submit_trial(mgr, trial, backend="slurm")
    try:
        server, fleet = mgr.wait([r.id for r in recs], timeout_s=300, poll_s=1.0)
    except BaseException:
        mgr.cancel_group("e2e")
        raise
    finally:
        for r in recs:
            print(f"--- job {r.id} {r.name} stdout\n{mgr.logs(r.id, tail_bytes=3000)}"
                  f"\n--- stderr\n{mgr.logs(r.id, 'stderr', tail_bytes=3000)}")

    assert (server.state, server.exit_code) == (JobState.COMPLETED, 0), server
    assert (fleet.state, fleet.exit_code) == (JobState.COMPLETED, 0), fleet
    assert server.external_id and server.external_id.isdigit()  # really a Slurm job
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len([s for s in steps if "step" in s]) >= 2, steps
    with session_scope(get_engine(db_url)) as s:
        row = s.exec(select(SwarmServer).where(SwarmServer.name == "e2e-server")).one()
        assert row.status == ServerStatus.STOPPED.value and row.url and row.job_id == server.id
