"""Trial rows as scheduler jobs: each trial maps to a `TrialShape`, its jobs' state back to the row.

A trial is one scheduler job running the trial program (`python -m swarm train
...`, which starts its own server + client fleet on loopback) with the trial's
flags and a deterministic output directory: `TrialShape(key="trial-<id>",
jobs=[that job])`. Why one job and not a server job plus a fleet job: `swarm train`
already supervises the pair (ports, tokens, stopping both by PID) and writes the
`summary.json` the study reads; one job is one slot, one time limit, one exit code,
and it runs the same under the local backend and as a single Slurm allocation.

Exactly-once, across crashes (`launch`):

1. the trial row records the *intent* first (`config.launch`: the key, job name
   `roost-s<study>-t<trial>`, its own log directory), committed, so the budget
   counts a launch a crash interrupted;
2. `scheduler.trial.submit_trial` submits the job, unless an earlier launch did:
   a recorded job is returned, a half-recorded one is found by its backend and
   adopted (how each backend finds it is the scheduler's business, not this module's);
3. the trial becomes RUNNING.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from researcher import shared_base
from researcher.config import StudyConfig
from researcher.experiment import ExperimentConfig, swarm_train_flags
from researcher.tracking import experiment_name
from scheduler.manager import JobManager
from scheduler.spec import JobSpec
from scheduler.trial import TrialShape, TrialState, poll_trials, submit_trial
from store.models import Job, JobState, Study, Trial, TrialStatus
from store.types import utcnow

log = logging.getLogger(__name__)

LIVE = (TrialStatus.PENDING.value, TrialStatus.RUNNING.value)


def job_name(study_id: int, trial_id: int) -> str:
    return f"roost-s{study_id}-t{trial_id}"


def trial_key(trial_id: int) -> str:
    """The scheduler key of a trial: the group key of its jobs (unique in the database)."""
    return f"trial-{trial_id}"


def trial_dir(cfg: StudyConfig, trial_id: int) -> Path:
    return Path(cfg.study_dir) / "trials" / f"t{trial_id:04d}"


def read_summary(out_dir: Path) -> dict[str, Any] | None:
    """A trial's summary with its per-step rows as `steps`: inline (a trial program's own summary) or
    read from the metrics file `swarm train`'s summary names (`metrics`, relative to `out_dir`)."""
    try:
        data = json.loads((out_dir / "summary.json").read_text())
        if isinstance(data, dict) and "steps" not in data and isinstance(data.get("metrics"), str):
            lines = (out_dir / data["metrics"]).read_text().splitlines()
            data["steps"] = [row for row in map(_json_row, lines) if row is not None]
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("steps"), list) else None


def _json_row(line: str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:  # a line still being written
        return None
    return row if isinstance(row, dict) else None


def interim_rewards(out_dir: Path) -> list[float]:
    """Per-step mean rewards a trial has reported so far: its summary's once it has one, else
    the rows of the server's metrics file it appends to every step (what early stopping reads)."""
    summary = read_summary(out_dir)
    if summary is not None:
        return step_rewards(summary)[1]
    try:
        lines = (out_dir / "server" / "metrics.jsonl").read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []
    rows = [r for r in map(_json_row, lines) if r is not None]
    return step_rewards({"steps": rows})[1]


def step_rewards(summary: dict[str, Any]) -> tuple[list[float], list[float]]:
    rows = [r for r in summary.get("steps", []) if r.get("reward_mean") is not None]
    return [float(r.get("step", i)) for i, r in enumerate(rows)], [float(r["reward_mean"]) for r in rows]


# ---------------------------------------------------------------- the launcher


def lockstep_allows(knobs: dict[str, Any]) -> bool:
    """Whether `swarm train --deterministic` can run these knobs: it trains on-policy in lockstep, one
    client process per task (swarm/config/run.py refuses the rest)."""
    return int(knobs.get("max_staleness") or 0) == 0 and int(knobs.get("clients") or 1) == 1


class TrialLauncher:
    """Submits, adopts and reconciles one study's trials (store rows + scheduler jobs)."""

    def __init__(self, engine: Engine, manager: JobManager, cfg: StudyConfig, study_id: int) -> None:
        self.engine = engine
        self.manager = manager
        self.cfg = cfg
        self.study_id = study_id

    def spec(self, trial: Trial) -> JobSpec:
        exp = ExperimentConfig.model_validate(trial.config["experiment"])
        tdir = trial_dir(self.cfg, trial.id)  # type: ignore[arg-type]
        argv = [*self.cfg.trial_program, *exp.argv(str(tdir / "out"))]
        if self.cfg.model_dir and "model" not in exp.knobs and self.cfg.uses_swarm_train:
            argv += ["--model", self.cfg.model_dir]
        if self.cfg.workflow and self.cfg.uses_swarm_train:  # the user's agent plays every trial
            argv += ["--workflow", self.cfg.workflow] + (["--dataset", self.cfg.dataset] if self.cfg.dataset else [])
        if self.cfg.deterministic and self.cfg.uses_swarm_train and "--deterministic" in (swarm_train_flags() or ()):
            if lockstep_allows(exp.knobs):  # the same config and seed give the same trial: arms pair by seed
                argv += ["--deterministic"]
            else:
                log.warning("trial %s (%s): its knobs rule out --deterministic; it runs without", trial.id, exp.arm)
        if self.cfg.shared_base:  # a policy of the study's server (its MLflow settings are the server's)
            argv += shared_base.trial_args(self.cfg, trial.id)  # type: ignore[arg-type]
        else:
            argv += self._mlflow_args(f"{exp.arm} seed={exp.seed}")
        return JobSpec(
            name=job_name(self.study_id, trial.id),
            command=argv,  # type: ignore[arg-type]
            env={
                "HF_HUB_OFFLINE": "1",
                "ROOST_STUDY_ID": str(self.study_id),
                "ROOST_TRIAL_ID": str(trial.id),
                **self.cfg.trial_env,
            },
            time_limit_s=self.cfg.trial_time_limit_s,
            cpus=self.cfg.trial_cpus,
            gpus=self.cfg.trial_gpus,
            partition=self.cfg.partition,
            log_dir=str(tdir / "jobs"),
            light=self.cfg.shared_base,  # its client fleet only: the study's server (a job of its own) trains
        )

    def shape(self, trial: Trial) -> TrialShape:
        """The trial as jobs: one job running the trial program (see the module docstring)."""
        return TrialShape(key=trial_key(trial.id), jobs=[self.spec(trial)])  # type: ignore[arg-type]

    def _mlflow_args(self, run_name: str) -> list[str]:
        """Nest the trial program's own MLflow run under the study's run, named by arm and seed, where it can."""
        if not self.cfg.uses_swarm_train or "--mlflow-parent" not in (swarm_train_flags() or ()):
            return []
        with Session(self.engine) as s:
            study = s.get(Study, self.study_id)
        if study is None or not study.mlflow_run_id:
            return []
        named = ["--mlflow-run-name", run_name] if "--mlflow-run-name" in (swarm_train_flags() or ()) else []
        return [
            "--mlflow-parent",
            study.mlflow_run_id,
            "--mlflow-experiment",
            experiment_name(self.study_id, study.name),
            *named,
        ]

    def launch(self, trial_id: int) -> str:
        """Submit the trial unless it already was: 'submitted', 'adopted', 'already' or 'failed'."""
        with Session(self.engine, expire_on_commit=False) as s:
            trial = s.get(Trial, trial_id)
            if trial is None or trial.status != TrialStatus.PENDING.value:
                return "already"
            shape = self.shape(trial)
            trial.config = {
                **trial.config,
                "launch": {
                    "key": shape.key,
                    "job_name": shape.jobs[0].name,
                    "log_dir": shape.jobs[0].log_dir,
                    "intent_at": utcnow().isoformat(),
                },
            }
            s.add(trial)
            s.commit()
        try:
            launched = submit_trial(self.manager, shape, backend=self.cfg.backend, trial_id=trial_id)
        except Exception as e:  # refused by the backend (recorded on the job row): the trial failed
            log.error("trial %s: submission failed: %s", trial_id, e)
            with Session(self.engine, expire_on_commit=False) as s:
                trial = s.get(Trial, trial_id)
                assert trial is not None
                trial.status = TrialStatus.FAILED.value
                trial.finished_at = utcnow()
                trial.config = {**trial.config, "reason": f"submission failed: {e}"}
                s.add(trial)
                s.commit()
            return "failed"
        job = launched.records[0]
        self._mark_running(trial_id, job.id)
        if launched.how == "submitted":
            log.info("trial %s submitted as job %s (%s)", trial_id, job.id, job.external_id)
            return "submitted"
        log.warning("trial %s: adopted job %s left by an interrupted launch", trial_id, job.external_id)
        return "adopted"

    def _mark_running(self, trial_id: int, job_id: int) -> None:
        with Session(self.engine, expire_on_commit=False) as s:
            trial = s.get(Trial, trial_id)
            assert trial is not None
            trial.status = TrialStatus.RUNNING.value
            trial.started_at = trial.started_at or utcnow()
            trial.config = {**trial.config, "job_id": job_id}
            s.add(trial)
            s.commit()

    # ------------------------------------------------------------ monitoring
    def refresh(self, trial_ids: list[int]) -> dict[int, str]:
        """Reconcile the running trials' jobs; update trial statuses; {trial id: status}."""
        with Session(self.engine, expire_on_commit=False) as s:
            running = [
                t.id
                for t in (s.get(Trial, i) for i in trial_ids)
                if t is not None and t.status == TrialStatus.RUNNING.value
            ]
        states = poll_trials(self.manager, [trial_key(tid) for tid in running])  # type: ignore[arg-type]
        out = {}
        with Session(self.engine, expire_on_commit=False) as s:
            for tid in trial_ids:
                trial = s.get(Trial, tid)
                if trial is None:
                    continue
                state = states.get(trial_key(tid))
                if trial.status == TrialStatus.RUNNING.value and state is not None:
                    new = self._trial_status(trial, state)
                    if new != trial.status:
                        trial.status = new
                        trial.finished_at = utcnow()
                        if state.reason:
                            trial.config = {**trial.config, "reason": state.reason}
                        s.add(trial)
                out[tid] = trial.status
            s.commit()
        return out

    def _trial_status(self, trial: Trial, state: TrialState) -> str:
        if not state.terminal:
            return TrialStatus.RUNNING.value
        if state.state == JobState.COMPLETED:
            ok = read_summary(trial_dir(self.cfg, trial.id) / "out") is not None  # type: ignore[arg-type]
            return TrialStatus.COMPLETED.value if ok else TrialStatus.FAILED.value
        if state.state == JobState.CANCELLED:
            return TrialStatus.CANCELLED.value
        return TrialStatus.FAILED.value

    def cancel(self, trial_ids: list[int], reason: str) -> None:
        """Cancel running jobs and mark unfinished trials CANCELLED.

        Jobs first, rows after, in separate transactions: a session holding a pending
        write while the job manager writes from another connection would wait on
        SQLite's lock for the full busy timeout. The jobs that have already exited (with no
        daemon ticking, nothing recorded it) are reconciled first: a trial that finished before
        the stop keeps its result instead of being called cancelled.
        """
        self.refresh(trial_ids)
        with Session(self.engine) as s:
            live = [
                (t.id, t.status) for t in (s.get(Trial, i) for i in trial_ids) if t is not None and t.status in LIVE
            ]
        for tid, status in live:
            if status == TrialStatus.RUNNING.value:
                try:
                    self.manager.cancel_group(trial_key(tid))
                except Exception as e:  # record the cancel anyway
                    log.error("trial %s: cancel failed: %s", tid, e)
        with Session(self.engine, expire_on_commit=False) as s:
            for tid, _ in live:
                trial = s.get(Trial, tid)
                assert trial is not None
                trial.status = TrialStatus.CANCELLED.value
                trial.finished_at = utcnow()
                trial.config = {**trial.config, "reason": reason}
                s.add(trial)
            s.commit()

    def usage(self, trial_ids: list[int]) -> dict[str, float]:
        """CPU- and GPU-hours used by the trials' jobs so far (running ones until now)."""
        now = utcnow()
        cpu = gpu = 0.0
        with Session(self.engine) as s:
            jobs = s.exec(select(Job).where(Job.trial_id.in_(trial_ids))).all() if trial_ids else []  # type: ignore[union-attr]
            for j in jobs:
                if j.started_at is None:
                    continue
                hours = ((j.finished_at or now) - j.started_at).total_seconds() / 3600
                cpu += hours * int(j.spec.get("cpus", 1) or 1)
                gpu += hours * int(j.spec.get("gpus", 0) or 0)
        return {"cpu_hours": cpu, "gpu_hours": gpu}


def reconcile_running(engine: Engine, study_id: int) -> bool:
    """Record the study's trials whose jobs have exited, unless the study's driver is at it.

    What `researcher status` calls: without it a trial stayed RUNNING until the daemon's next
    tick (30 s by default), or for good where nothing drives the study (its foreground
    `researcher study` was interrupted, no daemon runs). The refresh is the driver's own, under
    the driver's lock taken without waiting: a driver that holds it is reconciling already.
    Whether it ran.
    """
    from researcher.locks import study_lock  # lazy: only when a trial runs
    from scheduler.records import StoreSink  # lazy: as above

    with Session(engine) as s:
        study = s.get(Study, study_id)
        if study is None:
            return False
        ids = [
            t.id
            for t in s.exec(select(Trial).where(Trial.study_id == study_id)).all()  # type: ignore[arg-type]
            if t.id is not None and t.status == TrialStatus.RUNNING.value
        ]
        config = study.config
    if not ids:
        return False
    with study_lock(study_id) as held:
        if not held:
            return False
        cfg = StudyConfig.model_validate(config)
        TrialLauncher(engine, JobManager(StoreSink(engine=engine)), cfg, study_id).refresh(ids)
    return True
