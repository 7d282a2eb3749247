"""Launching trials exactly once, and learning how they ended.

A trial is one scheduler job running the trial program (`python -m swarm train
...`, which starts its own server + client fleet on loopback) with the trial's
flags and a deterministic output directory. Why one job and not a server job plus
a fleet job: `swarm train` already supervises the pair (ports, tokens, stopping
both by PID), one job is one slot, one time limit, one exit code, and it runs the
same under the local backend and as a single Slurm allocation.

Exactly-once, across crashes (`launch`):

1. the trial row records the *intent* first (`config.launch`: job name
   `roost-s<study>-t<trial>`, its own log directory, output directory), committed;
2. `JobManager.submit` writes the `jobs` row (trial_id set, no external id yet),
   asks the backend, then records the handle;
3. the trial becomes RUNNING.

A crash after 1 leaves an intent: the next `launch` looks for the job before
submitting anything: a `jobs` row with a handle is simply adopted; a row without
one (crash inside 2) is resolved through the deterministic log directory. Local:
a job directory there means the backend started a wrapper; its pid is found by its
command line (`--dir <job dir>`), else its `exit.json` tells how it ended. Slurm:
`squeue --name` / the job's exit file. Only when no trace exists is it submitted.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sqlmodel import Session, select

from researcher.config import StudyConfig
from researcher.experiment import ExperimentConfig
from scheduler.base import JobHandle
from scheduler.manager import JobManager
from scheduler.spec import JobSpec
from store.models import Job, JobState, Study, Trial, TrialStatus
from store.types import utcnow

log = logging.getLogger(__name__)

LIVE = (TrialStatus.PENDING.value, TrialStatus.RUNNING.value)


def job_name(study_id: int, trial_id: int) -> str:
    return f"roost-s{study_id}-t{trial_id}"


def trial_dir(cfg: StudyConfig, trial_id: int) -> Path:
    return Path(cfg.study_dir) / "trials" / f"t{trial_id:04d}"


def read_summary(out_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((out_dir / "summary.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("steps"), list) else None


def step_rewards(summary: dict[str, Any]) -> tuple[list[float], list[float]]:
    rows = [r for r in summary.get("steps", []) if r.get("reward_mean") is not None]
    return [float(r.get("step", i)) for i, r in enumerate(rows)], [float(r["reward_mean"]) for r in rows]


# ---------------------------------------------------------------- finding a lost submission


def _proc_cmdlines() -> dict[int, list[str]]:
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out[int(p.name)] = (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
    return out


def recover_local(log_dir: Path, name: str) -> JobHandle | None:
    """The handle of a local job submitted under `log_dir` whose handle was never recorded."""
    from scheduler.local import proc_start_ticks

    dirs = sorted(d for d in log_dir.glob(f"{name}-*") if d.is_dir())
    if not dirs:
        return None
    job_dir = dirs[-1]
    pid = 0
    for p, argv in _proc_cmdlines().items():
        if "scheduler._wrap" in argv and str(job_dir) in argv:
            pid = p
            break
    ticks = proc_start_ticks(pid) if pid else 0
    return JobHandle(backend="local", external_id=f"{pid}:{ticks}", name=name,
                     stdout_path=str(job_dir / "stdout"), stderr_path=str(job_dir / "stderr"))


def recover_slurm(backend: Any, log_dir: Path, name: str, spec: JobSpec) -> JobHandle | None:
    from scheduler.slurm import log_paths

    if not list(log_dir.glob(f"{name}-*.sbatch")):
        return None
    res = backend.run(["squeue", "-h", "--name", name, "-o", "%i"])
    ids = [x.strip() for x in (res.stdout or "").split() if x.strip().isdigit()] if res.returncode == 0 else []
    if not ids:
        ids = [p.stem.rsplit("-", 1)[-1] for p in log_dir.glob(f"{name}-*.exit")]
    if not ids:  # the script exists but Slurm has no job: sbatch never accepted it
        return None
    out, err, _ = log_paths(spec, ids[-1])
    return JobHandle(backend="slurm", external_id=ids[-1], name=name, stdout_path=str(out), stderr_path=str(err))


# ---------------------------------------------------------------- the launcher


class TrialLauncher:
    """Submits, adopts and reconciles one study's trials (store rows + scheduler jobs)."""

    def __init__(self, engine: Any, manager: JobManager, cfg: StudyConfig, study_id: int) -> None:
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
        argv += self._mlflow_args()
        return JobSpec(name=job_name(self.study_id, trial.id), command=argv,  # type: ignore[arg-type]
                       env={"HF_HUB_OFFLINE": "1", "ROOST_STUDY_ID": str(self.study_id),
                            "ROOST_TRIAL_ID": str(trial.id), **self.cfg.trial_env},
                       time_limit_s=self.cfg.trial_time_limit_s, cpus=self.cfg.trial_cpus,
                       gpus=self.cfg.trial_gpus, partition=self.cfg.partition, log_dir=str(tdir / "jobs"))

    def _mlflow_args(self) -> list[str]:
        """Nest the trial program's own MLflow run under the study's run, where it can."""
        from researcher.experiment import swarm_train_flags
        from researcher.tracking import experiment_name

        if not self.cfg.uses_swarm_train or "--mlflow-parent" not in (swarm_train_flags() or ()):
            return []
        with Session(self.engine) as s:
            study = s.get(Study, self.study_id)
        if study is None or not study.mlflow_run_id:
            return []
        return ["--mlflow-parent", study.mlflow_run_id,
                "--mlflow-experiment", experiment_name(self.study_id, study.name)]

    def jobs_of(self, s: Session, trial_id: int) -> list[Job]:
        return list(s.exec(select(Job).where(Job.trial_id == trial_id).order_by(Job.id)).all())  # type: ignore[arg-type]

    def launch(self, trial_id: int) -> str:
        """Submit the trial unless it already was: 'submitted', 'adopted', 'already' or 'failed'."""
        with Session(self.engine, expire_on_commit=False) as s:
            trial = s.get(Trial, trial_id)
            if trial is None or trial.status != TrialStatus.PENDING.value:
                return "already"
            spec = self.spec(trial)
            if "launch" in trial.config:  # an earlier attempt got at least this far
                adopted = self._adopt(s, trial, spec)
                if adopted:
                    return "adopted"
            trial.config = {**trial.config, "launch": {"job_name": spec.name, "log_dir": spec.log_dir,
                                                       "intent_at": utcnow().isoformat()}}
            s.add(trial)
            s.commit()
        try:
            rec = self.manager.submit(spec, backend=self.cfg.backend, trial_id=trial_id,
                                      group_key=f"trial-{trial_id}")
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
        self._mark_running(trial_id, rec.id)
        log.info("trial %s submitted as job %s (%s)", trial_id, rec.id, rec.external_id)
        return "submitted"

    def _mark_running(self, trial_id: int, job_id: int) -> None:
        with Session(self.engine, expire_on_commit=False) as s:
            trial = s.get(Trial, trial_id)
            assert trial is not None
            trial.status = TrialStatus.RUNNING.value
            trial.started_at = trial.started_at or utcnow()
            trial.config = {**trial.config, "job_id": job_id}
            s.add(trial)
            s.commit()

    def _adopt(self, s: Session, trial: Trial, spec: JobSpec) -> bool:
        """Find the job an interrupted launch left behind; True if there is one."""
        jobs = self.jobs_of(s, trial.id)  # type: ignore[arg-type]
        for job in reversed(jobs):
            if job.external_id:
                self._mark_running(trial.id, job.id)  # type: ignore[arg-type]
                return True
        handle = None
        log_dir = Path(spec.log_dir or "")
        if self.cfg.backend == "local":
            handle = recover_local(log_dir, spec.name)
        elif self.cfg.backend == "slurm":
            handle = recover_slurm(self.manager.backend("slurm"), log_dir, spec.name, spec)
        if handle is None:  # nothing ever reached the backend: close the dangling rows
            for job in jobs:
                if not JobState(job.state).terminal:
                    self.manager.sink.update(job.id, state=JobState.CANCELLED, finished_at=utcnow(),
                                             reason="launch interrupted before the backend got it")
            return False
        if jobs:
            job_id = jobs[-1].id
            self.manager.sink.update(job_id, external_id=handle.external_id, state=JobState.PENDING,
                                     stdout_path=handle.stdout_path, stderr_path=handle.stderr_path,
                                     reason="adopted after an interrupted launch", finished_at=None)
        else:
            rec = self.manager.sink.create(name=spec.name, backend=self.cfg.backend, spec=spec.model_dump(),
                                           time_limit_s=spec.time_limit_s, trial_id=trial.id,
                                           group_key=f"trial-{trial.id}")
            job_id = rec.id
            self.manager.sink.update(job_id, external_id=handle.external_id, stdout_path=handle.stdout_path,
                                     stderr_path=handle.stderr_path)
        log.warning("trial %s: adopted job %s left by an interrupted launch", trial.id, handle.external_id)
        self._mark_running(trial.id, job_id)  # type: ignore[arg-type]
        return True

    # ------------------------------------------------------------ monitoring
    def refresh(self, trial_ids: list[int]) -> dict[int, str]:
        """Reconcile the trials' jobs; update trial statuses; {trial id: status}."""
        with Session(self.engine, expire_on_commit=False) as s:
            trials = [t for t in (s.get(Trial, i) for i in trial_ids) if t is not None]
            job_ids = [t.config.get("job_id") for t in trials if t.status == TrialStatus.RUNNING.value]
        job_ids = [j for j in job_ids if j]
        if job_ids:
            self.manager.reconcile(job_ids)
        out = {}
        with Session(self.engine, expire_on_commit=False) as s:
            for tid in trial_ids:
                trial = s.get(Trial, tid)
                if trial is None:
                    continue
                if trial.status == TrialStatus.RUNNING.value and trial.config.get("job_id"):
                    job = s.get(Job, trial.config["job_id"])
                    new = self._trial_state(trial, job)
                    if new != trial.status:
                        trial.status = new
                        trial.finished_at = utcnow()
                        if job is not None and job.reason:
                            trial.config = {**trial.config, "reason": job.reason}
                        s.add(trial)
                out[tid] = trial.status
            s.commit()
        return out

    def _trial_state(self, trial: Trial, job: Job | None) -> str:
        if job is None:
            return TrialStatus.FAILED.value
        state = JobState(job.state)
        if not state.terminal:
            return TrialStatus.RUNNING.value
        if state == JobState.COMPLETED:
            ok = read_summary(trial_dir(self.cfg, trial.id) / "out") is not None  # type: ignore[arg-type]
            return TrialStatus.COMPLETED.value if ok else TrialStatus.FAILED.value
        if state == JobState.CANCELLED:
            return TrialStatus.CANCELLED.value
        return TrialStatus.FAILED.value

    def cancel(self, trial_ids: list[int], reason: str) -> None:
        """Cancel running jobs and mark unfinished trials CANCELLED.

        Jobs first, rows after, in separate transactions: a session holding a pending
        write while the job manager writes from another connection would wait on
        SQLite's lock for the full busy timeout.
        """
        with Session(self.engine) as s:
            live = [(t.id, t.status) for t in (s.get(Trial, i) for i in trial_ids)
                    if t is not None and t.status in LIVE]
        for tid, status in live:
            if status == TrialStatus.RUNNING.value:
                try:
                    self.manager.cancel_group(f"trial-{tid}")
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
