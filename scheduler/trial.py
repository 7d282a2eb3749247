"""A trial as jobs: its shape, submitted exactly once, and the one state of its jobs.

    shape = TrialShape(key="trial-7", jobs=[JobSpec(name="roost-s1-t7", command=["swarm", "train", ...])])
    launch = submit_trial(manager, shape, backend="slurm", trial_id=7)
    launch.how                                    # "submitted"; after a crash and a retry: "adopted"/"existing"
    poll_trials(manager, ["trial-7"])             # {"trial-7": TrialState(state=RUNNING, reason=None)}
    manager.cancel_group("trial-7")               # every job of the trial

A shape is the trial's key (the `group_key` of its jobs, unique per trial) and the
jobs to run, in order. The researcher's trials are one job: `swarm train`, which
starts and stops its own server and client fleet on loopback, writes the
`summary.json` the researcher reads, and needs one slot, one time limit and one exit
code on either backend. A shape with several jobs (a server job plus fleet jobs on
other nodes) is submitted and polled the same way, each job exactly once by its name.

Exactly once comes from `JobManager.submit_once`: a job whose submit was interrupted
is adopted through its backend's `find`, never submitted twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler.manager import JobManager, Submitted
from scheduler.records import JobRecord, JobSink
from scheduler.spec import JobSpec
from store.models import JobState


class TrialShape(BaseModel):
    """The jobs one trial runs, under a key that names the trial."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1, description="the trial's key: group key of its jobs, unique per trial")
    jobs: list[JobSpec] = Field(min_length=1, description="the jobs, submitted in this order")

    @model_validator(mode="after")
    def _distinct_names(self) -> TrialShape:
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"the jobs of a trial need distinct names (each is submitted once by name): {names}")
        return self


@dataclass(frozen=True)
class TrialLaunch:
    """What `submit_trial` did: the trial's job records and how they came to be."""

    records: list[JobRecord]
    how: Submitted  # submitted: all new; existing: all submitted before; adopted: otherwise


@dataclass(frozen=True)
class TrialState:
    """The state of a trial's jobs taken together, with the reason of the job that decided it."""

    state: JobState
    reason: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state.terminal


def submit_trial(
    manager: JobManager, shape: TrialShape, backend: str = "local", trial_id: int | None = None
) -> TrialLaunch:
    """Submit each job of the trial unless it already was; on a refusal cancel the others.

    Safe to call again after a crash at any point: jobs already recorded are returned,
    half-submitted ones adopted, only the missing ones submitted.
    """
    records: list[JobRecord] = []
    hows: list[Submitted] = []
    try:
        for spec in shape.jobs:
            rec, how = manager.submit_once(spec, backend=backend, group_key=shape.key, trial_id=trial_id)
            records.append(rec)
            hows.append(how)
    except Exception:
        if records:  # a trial runs whole or not at all
            manager.cancel_group(shape.key)
        raise
    if all(h == "submitted" for h in hows):
        return TrialLaunch(records, "submitted")
    return TrialLaunch(records, "existing" if all(h == "existing" for h in hows) else "adopted")


def trial_jobs(sink: JobSink, key: str) -> list[JobRecord]:
    """The trial's current jobs: per job name the newest record (older ones were abandoned submits)."""
    newest: dict[str, JobRecord] = {}
    for rec in sink.group(key):
        if rec.name not in newest or rec.id > newest[rec.name].id:
            newest[rec.name] = rec
    return sorted(newest.values(), key=lambda r: r.id)


def trial_state(jobs: Sequence[JobRecord]) -> TrialState:
    """One state for a trial: RUNNING while any job runs (else the first live job's state),
    COMPLETED when all completed, else the first failure (a FAILED or TIMEOUT job before a
    CANCELLED one, which is often just a job stopped because another failed).
    No jobs at all: FAILED.
    """
    if not jobs:
        return TrialState(JobState.FAILED, "the trial has no jobs")
    live = [r for r in jobs if not r.terminal]
    if live:
        running = [r for r in live if r.state == JobState.RUNNING]
        return TrialState((running or live)[0].state)
    bad = [r for r in jobs if r.state != JobState.COMPLETED]
    if not bad:
        return TrialState(JobState.COMPLETED)
    first = next((r for r in bad if r.state != JobState.CANCELLED), bad[0])
    said = last_error(first.stderr_path) if first.state == JobState.FAILED else None
    return TrialState(first.state, f"{first.reason}: {said}" if first.reason and said else first.reason or said)


BOX = "│╭╮╰╯─┃━┏┓┗┛ "  # rich's error panels (typer's usage errors)
TAIL_BYTES = 8192


def last_error(stderr_path: str | None, limit: int = 300) -> str | None:
    """What a failed job said last on stderr: the text of its last error panel (typer's usage errors,
    wrapped over lines) or its last line (a traceback's exception, `swarm train: --model: ...`).
    "exit code 2" alone sent the user to the job's files for the reason."""
    try:
        with open(stderr_path or "", "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    lines = [line.rstrip() for line in lines if line.strip(BOX)]
    if not lines:
        return None
    if lines[-1].lstrip().startswith("│"):  # the panel's rows, last one up
        rows: list[str] = []
        for line in reversed(lines):
            if not line.lstrip().startswith("│"):
                break
            rows.insert(0, line.strip(BOX))
        text = " ".join(rows)
    else:
        text = lines[-1].strip()
    return text[:limit] + ("…" if len(text) > limit else "")


def poll_trials(manager: JobManager, keys: Iterable[str]) -> dict[str, TrialState]:
    """Reconcile the trials' unfinished jobs once (one query per backend); their states."""
    keys = list(keys)
    jobs = {key: trial_jobs(manager.sink, key) for key in keys}
    live = [r.id for recs in jobs.values() for r in recs if not r.terminal]
    if live:
        manager.reconcile(live)
        jobs = {key: trial_jobs(manager.sink, key) for key in keys}
    return {key: trial_state(recs) for key, recs in jobs.items()}
