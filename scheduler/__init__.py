"""Job backends (local processes, Slurm) and the APScheduler daemon that watches them.

    from scheduler import JobManager, JobSpec, StoreSink
    mgr = JobManager(StoreSink())                       # records in the project database
    job = mgr.submit(JobSpec(name="hello", command=["echo", "hi"], time_limit_s=60))
    mgr.wait([job.id], timeout_s=30)

Modules, one concept each: `spec` (JobSpec), `base` (Backend interface, handles,
statuses), `local` (+ `_wrap`, the supervisor of every local job), `slurm` (+
`_slurm_parse`, and `fake`, a scripted Slurm for tests), `records` (where states are
kept), `manager` (submit, also exactly once; reconcile; cancel), `trial` (a trial's
jobs under one key, submitted exactly once, with one state), `daemon`, `cli`.
"""

from __future__ import annotations

from store.lazy import lazy_attributes as _lazy_attributes

# Public name -> module. Imported lazily (PEP 562): `python -m scheduler._wrap`, which
# supervises every local job, must start in milliseconds without pydantic, SQLAlchemy
# or APScheduler.
_EXPORTS = {
    "Backend": "scheduler.base",
    "BackendError": "scheduler.base",
    "BackendUnavailable": "scheduler.base",
    "Daemon": "scheduler.daemon",
    "JobHandle": "scheduler.base",
    "JobManager": "scheduler.manager",
    "JobRecord": "scheduler.records",
    "JobSpec": "scheduler.spec",
    "JobState": "store.models",
    "JobStatus": "scheduler.base",
    "LocalBackend": "scheduler.local",
    "MemorySink": "scheduler.records",
    "SlurmBackend": "scheduler.slurm",
    "StoreSink": "scheduler.records",
    "TrialLaunch": "scheduler.trial",
    "TrialShape": "scheduler.trial",
    "TrialState": "scheduler.trial",
    "poll_trials": "scheduler.trial",
    "register_tick": "scheduler.daemon",
    "render_script": "scheduler.slurm",
    "submit_trial": "scheduler.trial",
    "trial_jobs": "scheduler.trial",
    "trial_state": "scheduler.trial",
    "unregister_tick": "scheduler.daemon",
}


__getattr__ = _lazy_attributes(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Daemon",
    "JobHandle",
    "JobManager",
    "JobRecord",
    "JobSpec",
    "JobState",
    "JobStatus",
    "LocalBackend",
    "MemorySink",
    "SlurmBackend",
    "StoreSink",
    "TrialLaunch",
    "TrialShape",
    "TrialState",
    "poll_trials",
    "register_tick",
    "render_script",
    "submit_trial",
    "trial_jobs",
    "trial_state",
    "unregister_tick",
]
